"""dflash's exceptions: one tree, each class carrying the exit code a command ends with.

Library code raises these with a one-line message; each console script maps them to its
exit in one place (:mod:`dflash.cli.command`), so the codes are decided here and
nowhere else.

    DFlashError                   FAILED (4) unless a subclass says otherwise
    ├── InputError                BAD_INPUT (2): flags, config, paths, files
    │   ├── ConfigError           a bad recipe value or option (also a ValueError)
    │   ├── MissingExtraError     the trainer's extra (torch, ...) is not installed
    │   ├── DataError             a data or prompts file, ``FILE:LINE: reason``
    │   ├── TargetError           a target that cannot be built or loaded
    │   └── CheckpointError       a checkpoint or drafter export that cannot be used
    ├── RefusedError              REFUSED (3): the environment does not match the lock
    └── RunError                  FAILED (4): a runtime failure
        ├── CompileStateError     torch.compile used in a racy way (also a RuntimeError)
        └── MegaCacheError        a compile artifact that cannot be loaded (a warning)
"""

from __future__ import annotations

from typing import ClassVar

from dflash.exitcodes import ExitCode


class DFlashError(Exception):
    """Base of every error dflash reports as a message instead of a traceback."""

    exit_code: ClassVar[ExitCode] = ExitCode.FAILED


class InputError(DFlashError):
    """Something the user gave (a flag, a file, a folder) cannot be used."""

    exit_code = ExitCode.BAD_INPUT


class ConfigError(InputError, ValueError):
    """A recipe value, ``--set`` pair or option that is out of range or unreadable."""


class MissingExtraError(InputError):
    """A package of the ``dflash`` extra is not installed in this interpreter."""


class DataError(InputError):
    """A data file that cannot be used; the message is one line, ``FILE:LINE: reason``."""


class TargetError(InputError):
    """A target that cannot be built or loaded; the message is one line."""


class CheckpointError(InputError):
    """A checkpoint that cannot be read or written; the message is one line."""


class RefusedError(DFlashError):
    """The environment does not match the command's lock; one line per finding."""

    exit_code = ExitCode.REFUSED


class RunError(DFlashError):
    """A failure while running (not the user's input); one line."""

    exit_code = ExitCode.FAILED


class CompileStateError(RunError, RuntimeError):
    """torch.compile used in a way that can race, or a process already poisoned."""


class MegaCacheError(RunError):
    """A compile artifact that cannot be read or loaded; one line."""
