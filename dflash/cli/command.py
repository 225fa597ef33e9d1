"""How a dflash console script runs: first the trainer's extra must be installed, then the
command's body, and the one ``except`` that turns what it raised into a message and an
exit code (:mod:`dflash.exitcodes`).

Nothing heavy is imported here, nor at the top of any ``dflash.cli`` module: the
commands check their input before they import torch.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from dflash.errors import DFlashError, MissingExtraError
from dflash.exitcodes import ExitCode
from envguard.errors import EnvguardError
from envguard.render.sanitize import escape_controls

EXTRA_MODULES = ("torch", "numpy", "transformers", "safetensors")
"""What ``pip install 'envguard[dflash]'`` adds to envguard's core, by import name."""


def install_source() -> str:
    """Where this envguard was installed from, as a requirement to add an extra to.

    PyPI's ``envguard`` is an unrelated project, so the hint names the source this copy
    came from (PEP 610 ``direct_url.json``: a folder or a VCS URL), else a placeholder.
    """
    import json
    from importlib import metadata
    from urllib.parse import unquote, urlparse

    try:
        raw = metadata.distribution("envguard").read_text("direct_url.json")
        info = json.loads(raw) if raw else {}
    except (metadata.PackageNotFoundError, ValueError, OSError):
        info = {}
    url = info.get("url") if isinstance(info, dict) else None
    if not isinstance(url, str) or not url:
        return "/path/to/envguard"
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return unquote(parsed.path)
    vcs = info.get("vcs_info")
    if isinstance(vcs, dict) and isinstance(vcs.get("vcs"), str):
        host = (parsed.hostname or "") + (f":{parsed.port}" if parsed.port else "")
        return f"envguard @ {vcs['vcs']}+{parsed._replace(netloc=host).geturl()}"
    return "/path/to/envguard"


def require_extra() -> None:
    """MissingExtraError naming the first module of the ``dflash`` extra that is absent."""
    for name in EXTRA_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            source = install_source()
            if " @ " in source:  # a URL requirement: the extra goes after the name
                spec = source.replace("envguard @ ", "envguard[dflash] @ ", 1)
            else:
                spec = f"{source}[dflash]"
            raise MissingExtraError(
                f"{name} is not installed; install the trainer's extra: uv tool install "
                f"--reinstall '{spec}' (a tool) or pip install '{spec}' (this environment)")


def first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text.strip() else type(exc).__name__


class Command:
    """One run of a console script: its name on every message, and its exit code."""

    def __init__(self, prog: str) -> None:
        self.prog = prog
        self.failing: Callable[[], str] | None = None
        """Set once the command's main work has started (``lambda: "training failed at
        step 7"``): from then on a dflash error or a RuntimeError is a runtime failure."""

    def say(self, line: str) -> None:
        # One write per line: print() writes the text and the newline separately, and
        # with an unbuffered stderr (PYTHONUNBUFFERED) two torchrun ranks' lines then
        # interleave into one.
        # A name read from the user or the disk may hold a terminal escape: shown, not run.
        sys.stderr.write(f"{self.prog}: {escape_controls(line)}\n")
        sys.stderr.flush()

    def run(self, body: Callable[[], int]) -> int:
        try:
            require_extra()
            return body()
        except BaseException as exc:
            ending = self._ending(exc)
            if ending is None:
                raise
            code, message = ending
            for line in message.splitlines():
                self.say(line)
            return code

    def _ending(self, exc: BaseException) -> tuple[ExitCode, str] | None:
        """(exit code, message) for ``exc``; None for what is a bug (a traceback)."""
        if isinstance(exc, KeyboardInterrupt):
            return ExitCode.INTERRUPTED, "interrupted"
        if self.failing is not None and isinstance(exc, DFlashError | RuntimeError):
            return ExitCode.FAILED, f"{self.failing()}: {first_line(exc)}"
        if isinstance(exc, DFlashError):
            return exc.exit_code, str(exc)
        if isinstance(exc, ValueError | OSError | EnvguardError):
            return ExitCode.BAD_INPUT, str(exc)  # torch's and envguard's checks of our input
        if isinstance(exc, RuntimeError):
            return ExitCode.FAILED, f"failed: {first_line(exc)}"
        return None


def keep_bytecode() -> None:
    """Under ``PYTHONDONTWRITEBYTECODE`` with a torch that ships no ``.pyc`` (the H200
    image), every launch compiled torch, transformers, dynamo and inductor from source:
    their bytecode is kept in ``<dflash cache>/bytecode`` instead (:mod:`envguard.bytecode`;
    ``ENVGUARD_NO_BYTECODE_CACHE=1`` opts out); the first launch that keeps it compiles
    torch's tree there in the background (:mod:`dflash.cli.precompile`)."""
    from dflash.stdlib_target import cache_root
    from envguard.bytecode import keep_bytecode as keep

    spec = importlib.util.find_spec("torch")  # found, not imported
    folder = cache_root() / "bytecode"
    if keep(folder, spec.origin if spec is not None else None) and spec and spec.origin:
        # A new machine compiles the rest of torch in parallel, in the background.
        from dflash.cli import precompile

        precompile.start(folder, Path(spec.origin).parent)


def entry(main: Callable[[], int]) -> int:
    """A console script (or ``python -m``): :func:`keep_bytecode`, then ``main()``. Tests
    call ``main`` itself, so their process keeps its own bytecode settings."""
    keep_bytecode()
    return main()

