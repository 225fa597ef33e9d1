"""Every exception envguard raises on purpose: one tree under :class:`EnvguardError`.

Each class carries its exit status; only :mod:`envguard.cli` turns them into exits, in
one place. Anything else that escapes is a bug (ExitCode.INTERNAL_ERROR).

    EnvguardError
    ├── InputError (2)                  a file or argument that cannot be used
    │   ├── SnapshotValidationError     a snapshot that does not match the schema
    │   └── UnsupportedSchemaError      written by a newer envguard
    ├── CommandNotFound (2)             ``envguard run``: no such command
    ├── ProbeError (4)                  the target interpreter cannot be probed
    ├── RestoreError (4)                uv missing, failed or stopped
    ├── GatherError (4)                 the ranks of a fleet cannot exchange snapshots
    ├── IntegrationError (2)            an optional integration's library is missing or idle
    └── OutputError (5)                 a result cannot be written
"""

from __future__ import annotations

from envguard.exitcodes import ExitCode


class EnvguardError(Exception):
    """Base of every error envguard reports as a one-line message."""

    exit_code: ExitCode = ExitCode.USAGE


class InputError(EnvguardError):
    """An input file is missing, unreadable or malformed."""

    exit_code = ExitCode.USAGE


class SnapshotValidationError(InputError):
    """A snapshot document does not match the schema; ``context`` names the field."""

    def __init__(self, cause: str, *, context: str = "") -> None:
        self.cause = cause
        self.context = context
        where = f" in '{context}'" if context else ""
        super().__init__(f"{cause}{where}")

    def within(self, outer: str) -> SnapshotValidationError:
        """The same error, with ``outer`` prefixed to the dotted context path."""
        if not self.context:
            ctx = outer
        elif self.context.startswith("["):
            ctx = f"{outer}{self.context}"
        else:
            ctx = f"{outer}.{self.context}"
        return SnapshotValidationError(self.cause, context=ctx)


class UnsupportedSchemaError(InputError):
    """A document written by a newer envguard, with a schema major this one cannot read."""


class ProbeError(EnvguardError):
    """The target interpreter could not be probed at all (not found, not runnable)."""

    exit_code = ExitCode.ENVIRONMENT_ERROR


class OutputError(EnvguardError):
    """A result could not be written."""

    exit_code = ExitCode.OUTPUT_ERROR


class CommandNotFound(EnvguardError):
    """``envguard run``: the command is not on PATH, or not executable (exit 2)."""

    exit_code = ExitCode.USAGE


class RestoreError(EnvguardError):
    """uv is missing, or failed, timed out or was stopped while building (exit 4)."""

    exit_code = ExitCode.ENVIRONMENT_ERROR


class GatherError(EnvguardError):
    """The ranks could not exchange their snapshots (timeout, no transport)."""

    exit_code = ExitCode.ENVIRONMENT_ERROR


class IntegrationError(EnvguardError):
    """An optional integration (W&B, MLflow) cannot log: its library is not installed, or
    there is no run to log to."""

    exit_code = ExitCode.USAGE
