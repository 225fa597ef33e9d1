"""Exit codes: the documented contract of every envguard command (docs/CLI.md)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit status of ``envguard``. Never renumber a member."""

    OK = 0
    """The command did what was asked (a snapshot may still record per-section errors)."""
    DRIFT = 1
    """The environment differs from the reference (diff, check, run); bisect: inconclusive."""
    USAGE = 2
    """Bad command line, or an input file that cannot be used: missing, unreadable, not JSON
    or TOML, another tool's document, or a schema from a newer envguard."""
    REFUSED = 3
    """``envguard run`` refused to start the command (the environment does not match its
    lock), or ``envguard cache restore`` refused an archive of another build."""
    ENVIRONMENT_ERROR = 4
    """The target interpreter could not be run or probed at all; uv missing or failed."""
    OUTPUT_ERROR = 5
    """The result could not be written; any previous file is left untouched."""
    INTERNAL_ERROR = 70
    """A bug in envguard (EX_SOFTWARE); one line, the traceback only with ENVGUARD_DEBUG=1."""
    INTERRUPTED = 130
    """Interrupted by Ctrl-C (SIGINT)."""
