"""Which Python a console script runs under, read from its shebang."""

from __future__ import annotations

import os
import shlex
import shutil


def interpreter_of(command: str) -> str | None:
    """The Python a console script runs under (from its shebang), or None."""
    from envguard.gate.runner import resolve_command

    path = resolve_command(command)
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            head = fh.read(1024).decode("utf-8", "replace").splitlines()
    except OSError:
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
