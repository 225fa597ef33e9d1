"""Which Python a console script runs under, read from its shebang."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Mapping

_PYTHON_NAME = re.compile(r"python(?:[0-9]+(?:\.[0-9]+)?t?)?(?:\.exe)?")
"""The file names of an interpreter itself: python, python3, python3.12, python3.13t."""


def command_interpreter(command: str,
                        env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The Python ``command`` runs under and how that was found, or None (not Python).

    ``python``/``python3``: the interpreter the child finds on its PATH (``python on PATH``);
    a console script (``torchrun``, ``dflash-train``): its shebang (``shebang of torchrun``).
    """
    from envguard.gate.runner import resolve_command

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
    from envguard.gate.runner import resolve_command

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
