"""The guarded command's launch, both sides: the command ``envguard run`` starts, what it
hands the child, how the child runs, and how a guarded program reads the hand-off back.

The command: :func:`resolve_command` (where the child will find it), :func:`require_command`,
:func:`command_interpreter` and :func:`interpreter_of` (the Python it runs under, from its
shebang: the environment the gate checks). The writer's side (``envguard run``):
:func:`launch` (the child's environment, less an outer run's variables; when the gate
passed, :data:`VERIFIED_ENV` and a private copy of the gate's snapshot in
:data:`SNAPSHOT_ENV`; then :func:`run_child`: argv unchanged, no shell, signals forwarded),
:func:`run_metadata` and :func:`record` (the run record :mod:`envguard.runs.store` keeps).
The reader's side (a guarded program, such as ``dflash-train``): :func:`handed_over`.

Nothing here prints or exits: these return data or raise envguard's typed errors, and the
command line says what they mean.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from envguard.errors import CommandNotFound
from envguard.frozen import frozen

if TYPE_CHECKING:
    from envguard.gate.check import GateResult
    from envguard.runs.store import RunRecord

VERIFIED_ENV = "ENVGUARD_VERIFIED"
"""Set by ``envguard run`` for the child: ``<lock name>:<entry id>:sha256:<snapshot digest>``."""
SNAPSHOT_ENV = "ENVGUARD_SNAPSHOT"
"""Set by ``envguard run`` beside :data:`VERIFIED_ENV`: a private file (0600, removed when the
child ends) holding the snapshot the gate took, whose sha256 is the digest in
:data:`VERIFIED_ENV`; a child that keeps a record of its environment copies it."""

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()  # = Snapshot.sha256 of its JSON


# ------------------------------------------------------------------ the command

def resolve_command(command: str, env: Mapping[str, str] | None = None) -> str | None:
    """``command`` on PATH, else next to envguard's own interpreter (its venv's bin)."""
    if os.sep in command:
        return command if os.access(command, os.X_OK) else None
    path = (env or os.environ).get("PATH")
    return shutil.which(command, path=path) or shutil.which(
        command, path=os.path.dirname(sys.executable))


def require_command(command: str, env: Mapping[str, str]) -> None:
    """CommandNotFound unless ``command`` exists where the child will look for it (its
    PATH, or the path given) and can run."""
    found = resolve_command(command, env)
    if found is not None and not os.path.isdir(found):
        return
    if found is None and os.sep in command and os.path.isfile(command):
        raise CommandNotFound(f"command not executable: {command}")
    raise CommandNotFound(f"command not found: {command}")


_PYTHON_NAME = re.compile(r"python(?:[0-9]+(?:\.[0-9]+)?t?)?(?:\.exe)?")
"""The file names of an interpreter itself: python, python3, python3.12, python3.13t."""


def command_interpreter(command: str,
                        env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The Python ``command`` runs under and how that was found, or None (not Python).

    ``python``/``python3``: the interpreter the child finds on its PATH (``python on PATH``);
    a console script (``torchrun``, ``dflash-train``): its shebang (``shebang of torchrun``).
    """
    path = resolve_command(command, env)
    if path is None:
        return None
    name = os.path.basename(command)
    if _PYTHON_NAME.fullmatch(os.path.basename(path)):
        how = f"{name} on PATH" if os.sep not in command else name
        return os.path.abspath(path), how
    exe = interpreter_of(command, env)
    return (exe, f"shebang of {name}") if exe else None


def interpreter_of(command: str, env: Mapping[str, str] | None = None) -> str | None:
    """The Python a console script runs under (from its shebang), or None."""
    path = resolve_command(command, env)
    if path is None:
        return None
    from envguard.input_file import NotReadable, read_head

    try:
        head = read_head(path, 1024).decode("utf-8", "replace").splitlines()
    except NotReadable:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    first = head[0][2:].strip()
    if first == "/bin/sh" and len(head) > 1 and head[1].startswith("'''exec' "):
        # pip and uv's trampoline for long or spaced paths: '''exec' "/p/python" "$0" "$@"
        try:
            words = shlex.split(head[1])
        except ValueError:
            return None
        exe = words[1] if len(words) > 1 else ""
        return exe if "python" in os.path.basename(exe) else None
    parts = first.split()
    if not parts:
        return None
    if os.path.basename(parts[0]) == "env" and len(parts) > 1:
        found = shutil.which(parts[-1])
        return found if found and "python" in os.path.basename(found) else None
    return parts[0] if "python" in os.path.basename(parts[0]) else None


# ------------------------------------------------------------------ the child

@frozen
class ChildExit:
    """How the child ended: ``returncode`` as :class:`subprocess.Popen` gives it (-N when
    signal N killed it), and the last lines it wrote to stderr."""

    returncode: int
    stderr_tail: tuple[str, ...] = ()

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode < 0 else None

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return f"signal {self.signal}"

    @property
    def status(self) -> int:
        """Shell-style: 128 + N when killed by signal N, else the exit code."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode


TAIL_BYTES = 16 * 1024
"""The end of the child's stderr that is kept (its last lines: the error of a failure)."""
TEE_ENV = "ENVGUARD_RUN_TEE"
"""``0``: the child writes to envguard's stderr itself (no copy of its end is kept; a
program that colours its output only on a terminal keeps doing so). Else stderr passes
through envguard, which copies every byte on at once and keeps the last :data:`TAIL_BYTES`
(the child then sees a pipe, not a terminal, on its stderr)."""


def _tee(source: int, tail: bytearray) -> None:
    """Copy ``source`` to envguard's stderr until end of file, keeping its end in ``tail``."""
    while True:
        try:
            chunk = os.read(source, 65536)
        except OSError:
            break
        if not chunk:
            break
        with contextlib.suppress(OSError):
            view = memoryview(chunk)
            while view:
                view = view[os.write(2, view):]
        tail += chunk
        del tail[:-TAIL_BYTES]
    os.close(source)


def _tail_lines(data: bytes) -> tuple[str, ...]:
    lines = data.decode("utf-8", "replace").splitlines()
    return tuple(line for line in lines[1:] if line.strip()) if len(data) >= TAIL_BYTES \
        else tuple(line for line in lines if line.strip())


def run_child(argv: Sequence[str], env: Mapping[str, str]) -> ChildExit:
    """Run ``argv`` and return how it ended (:attr:`ChildExit.status` is the shell's status)
    and the last lines of its stderr (through a pipe envguard copies on: :data:`TEE_ENV`).

    SIGTERM and SIGHUP received by envguard are passed to the child, which decides
    what to do with them; envguard waits for it either way. SIGINT is passed on too,
    except from a terminal: Ctrl-C already reaches the child, which shares envguard's
    foreground process group, and a second SIGINT could cut its clean-up short.
    """
    executable = resolve_command(argv[0], env)
    if executable is None:
        raise CommandNotFound(f"command not found: {argv[0]}")
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    from_terminal = sys.stdin is not None and sys.stdin.isatty()

    def forward(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGINT and from_terminal:
            return  # the terminal delivered it to the child already
        if child is None:
            pending.append(signum)  # arrived while the child was being started
        elif child.poll() is None:
            child.send_signal(signum)

    # Installed before the child starts: a SIGTERM in between must not orphan it.
    previous = {s: signal.signal(s, forward) for s in _FORWARDED}
    tail = bytearray()
    reader: threading.Thread | None = None
    write_end: int | None = None
    if env.get(TEE_ENV, "1") != "0":
        read_end, write_end = os.pipe()
        reader = threading.Thread(target=_tee, args=(read_end, tail), daemon=True)
    try:
        try:
            child = subprocess.Popen(list(argv), executable=executable, env=dict(env),
                                     stderr=write_end)
        except FileNotFoundError:
            raise CommandNotFound(f"command not found: {argv[0]}") from None
        except PermissionError:
            raise CommandNotFound(f"command not executable: {argv[0]}") from None
        finally:
            if write_end is not None:
                os.close(write_end)  # the child holds its own copy
                if reader is not None:
                    reader.start()
        for signum in pending:
            child.send_signal(signum)
        while True:
            try:
                code = child.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - SIGINT is forwarded instead
                continue
        if reader is not None:
            reader.join(timeout=5)  # a grandchild holding the pipe open is not waited for
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return ChildExit(returncode=code, stderr_tail=_tail_lines(bytes(tail)))


# ------------------------------------------------------------------ the writer's side

def run_metadata(argv: Sequence[str], result: GateResult, *, force: bool) -> dict[str, Any]:
    """What the run record keeps of a guarded launch besides its outcome (the keyword
    arguments of :func:`envguard.runs.store.record_run`): the command, the lock, the entry
    it matched, whether the gate passed or was forced, the rules of its findings."""
    return {
        "argv": list(argv), "lock": result.lock.name, "lockfile": str(result.lock_path),
        "entry": result.matched.entry.id if result.matched else None,
        "passed": result.passed, "forced": force and not result.passed,
        "findings": [f.rule for f in result.findings]}


@frozen
class Launched:
    """A guarded command that ran: when, and how it ended."""

    started_at: str
    ended_at: str
    exit: ChildExit


def launch(argv: Sequence[str], result: GateResult, env: Mapping[str, str]) -> Launched:
    """Run ``argv`` after the gate ``result``, in ``env`` less an outer ``envguard run``'s
    variables; when the gate passed, with :data:`VERIFIED_ENV` naming the lock, the entry
    and the snapshot's digest, and :data:`SNAPSHOT_ENV` a private copy of that snapshot
    (in a 0700 temporary folder, removed when the child ends)."""
    import tempfile

    from envguard.runs.store import now_iso

    child_env = dict(env)
    for stale in (VERIFIED_ENV, SNAPSHOT_ENV):  # an outer envguard run's, not this gate's
        child_env.pop(stale, None)
    with tempfile.TemporaryDirectory(prefix="envguard-run-") as private:  # 0700
        if result.passed:
            text = result.snapshot.to_json()
            entry = result.matched.entry.id if result.matched else None
            child_env[VERIFIED_ENV] = f"{result.lock.name}:{entry}:{_digest(text.encode())}"
            child_env[SNAPSHOT_ENV] = _private_copy(Path(private), text)
        started = now_iso()
        ended = run_child(argv, child_env)
    return Launched(started_at=started, ended_at=now_iso(), exit=ended)


def record(result: GateResult, metadata: Mapping[str, Any], launched: Launched | None, *,
           cwd: Path) -> RunRecord:
    """Write the run record of a guarded launch (:func:`envguard.runs.store.record_run`):
    ``metadata`` from :func:`run_metadata`; ``launched``, when it ran and how it ended, or
    None for a launch the gate refused (no start, no exit)."""
    from envguard.runs.store import now_iso, record_run

    if launched is None:
        at = now_iso()
        outcome: dict[str, Any] = {"started_at": at, "ended_at": at, "exit_code": None,
                                   "signal": None}
    else:
        outcome = {"started_at": launched.started_at, "ended_at": launched.ended_at,
                   "exit_code": launched.exit.status, "signal": launched.exit.signal_name,
                   "stderr_tail": launched.exit.stderr_tail}
    return record_run(result.snapshot, cwd=cwd, **metadata, **outcome)


def _private_copy(folder: Path, text: str) -> str:
    """The gate's snapshot in a file only this user reads, for the child (SNAPSHOT_ENV)."""
    path = folder / "snapshot.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return str(path)


# ------------------------------------------------------------------ the reader's side

@frozen
class HandOff:
    """What ``envguard run`` handed a guarded program whose lock it checked."""

    verified: str
    """The value of :data:`VERIFIED_ENV`: ``<lock>:<entry>:sha256:<digest>``."""
    snapshot_json: str | None
    """The gate's snapshot (the file :data:`SNAPSHOT_ENV` names), or None when that file is
    missing, unreadable or not the one the digest names (no snapshot, not an error)."""


def handed_over(lock: str, env: Mapping[str, str] | None = None) -> HandOff | None:
    """The hand-off of an ``envguard run`` whose gate passed for lock ``lock``, read from
    ``env`` (default: this process's environment); None when :data:`VERIFIED_ENV` names
    another lock or is not set (the program then checks its environment itself)."""
    env = os.environ if env is None else env
    verified = env.get(VERIFIED_ENV, "")
    if verified.split(":", 1)[0] != lock:
        return None
    return HandOff(verified=verified,
                   snapshot_json=_verified_snapshot(env.get(SNAPSHOT_ENV, ""), verified))


def _verified_snapshot(path: str, verified: str) -> str | None:
    """The snapshot ``envguard run`` handed over, if it is the one its digest names (a
    file that is missing, unreadable or another one is no snapshot, not an error)."""
    from envguard.errors import EnvguardError
    from envguard.input_file import read_input

    digest = verified.split(":", 2)[-1]
    if not path:
        return None
    try:
        data = read_input(Path(path), what="snapshot")
    except (EnvguardError, OSError):
        return None
    if _digest(data) != digest:
        return None
    return data.decode("utf-8", errors="replace")
