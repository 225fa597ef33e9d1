"""Exceptions raised by envguard's library code. Only :mod:`envguard.cli` maps them to exits."""

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
