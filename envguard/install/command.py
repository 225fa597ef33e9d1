"""The installer command ``envguard install`` guards: which ones it takes, and the argv that
runs one against a chosen interpreter.

Taken: ``uv pip install|uninstall|sync``, ``pip install|uninstall`` (``pip3``,
``pip3.12``) and ``python -m pip install|uninstall`` (any ``python*``). Anything else is
refused in one line (exit 2), as are the options that would send the change to another
environment than the one envguard predicted for (``--python``, ``--target``, ``--prefix``,
``--user``, ``--system``, ``--root``): envguard names the environment itself, as
``--python PY`` of its own. The arguments are never parsed into envguard's options and
never pass through a shell: they are appended, as a list, to an argv envguard builds.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence

from envguard.errors import InputError
from envguard.frozen import frozen

UV, PIP = "uv", "pip"
_ACTIONS = {UV: ("install", "uninstall", "sync"), PIP: ("install", "uninstall")}
_PIP_NAME = re.compile(r"pip(?:3(?:\.\d+)?)?")
_PYTHON_NAME = re.compile(r"python(?:3(?:\.\d+)?)?")
_ELSEWHERE = {
    UV: ("--python", "-p", "--system", "--target", "--prefix"),
    PIP: ("--target", "-t", "--prefix", "--user", "--root", "--python"),
}
DROPPED_VARIABLES = ("PIP_TARGET", "PIP_PREFIX", "PIP_USER", "PIP_ROOT", "PIP_PYTHON",
                     "UV_SYSTEM_PYTHON", "UV_PYTHON", "VIRTUAL_ENV")
"""Variables that would send the installer elsewhere: left out of its environment, for the
prediction and the real change alike."""
USAGE = ("envguard install takes uv pip install|uninstall|sync, pip install|uninstall or "
         "python -m pip install|uninstall")


@frozen
class InstallerCommand:
    """One installer command, as envguard runs it."""

    tool: str
    """``uv`` or ``pip``."""
    action: str
    """``install``, ``uninstall`` or ``sync`` (uv only)."""
    args: tuple[str, ...]
    """What follows the action, as given."""
    program: str
    """The uv binary (for ``uv``); unused for pip, which runs as ``PYTHON -m pip``."""
    argv: tuple[str, ...]
    """The command as the user gave it (redact before showing it)."""

    def argv_for(self, python: str) -> list[str]:
        """The command against the environment of ``python``: ``uv pip ACTION --python PY
        ARGS`` or ``PY -m pip ACTION ARGS`` (``pip uninstall`` with ``--yes``: its prompt
        has no terminal to ask; envguard asked before)."""
        if self.tool == UV:
            return [self.program, "pip", self.action, "--python", python, *self.args]
        extra = ([] if self.action != "uninstall" or {"-y", "--yes"} & set(self.args)
                 else ["--yes"])
        return [python, "-m", "pip", self.action, *extra, *self.args]


    def argv_into(self, python: str, prefix: str) -> list[str]:
        """``uv pip ACTION --python PY --prefix PREFIX ARGS``: uv resolves against the
        packages under ``PREFIX`` and writes there what it would write into the environment
        of ``python``, scripts with that interpreter in their shebang (uv only)."""
        if self.tool != UV:
            raise ValueError("--prefix is taken from uv only")
        return [self.program, "pip", self.action, "--python", python, "--prefix", prefix,
                *self.args]


def parse_command(argv: Sequence[str], *, uv: str | None = None) -> InstallerCommand:
    """``argv`` as an installer command, or InputError (exit 2) in one line. ``uv``: the
    binary to run for ``uv pip`` when ``argv[0]`` is not found on PATH."""
    words = list(argv)
    if not words:
        raise InputError(f"no installer command after --: {USAGE}")
    head = os.path.basename(words[0])
    if head == "uv" and len(words) >= 3 and words[1] == "pip":
        tool, action, rest = UV, words[2], words[3:]
        program = shutil.which(words[0]) or uv or words[0]
    elif _PIP_NAME.fullmatch(head) and len(words) >= 2:
        tool, action, rest, program = PIP, words[1], words[2:], ""
    elif (_PYTHON_NAME.fullmatch(head) and len(words) >= 4 and words[1:3] == ["-m", "pip"]):
        tool, action, rest, program = PIP, words[3], words[4:], ""
    else:
        raise InputError(f"not an installer command envguard guards: {USAGE}")
    if action not in _ACTIONS[tool]:
        raise InputError(f"{tool} pip {action}: not guarded; {USAGE}"
                         if tool == UV else f"pip {action}: not guarded; {USAGE}")
    for word in rest:
        option = word.split("=", 1)[0]
        if option in _ELSEWHERE[tool] or (tool == UV and re.fullmatch(r"-p\S+", word)):
            raise InputError(f"{option}: the installer would change another environment than "
                             "the one envguard predicts for; choose it with envguard install "
                             "--python PY instead")
    return InstallerCommand(tool=tool, action=action, args=tuple(rest), program=program,
                            argv=tuple(words))


def installer_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The installer's environment: this one without :data:`DROPPED_VARIABLES`."""
    return {k: v for k, v in env.items() if k not in DROPPED_VARIABLES}
