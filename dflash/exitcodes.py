"""Exit codes shared by dflash-train, dflash-generate and dflash-eval (one enum)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    """Finished (dflash-train also after SIGTERM, once the checkpoint is saved)."""
    MISMATCH = 1
    """dflash-eval: speculative output differed from the target's own greedy output."""
    BAD_INPUT = 2
    """Bad flags, config, data file, target or checkpoint; one line on stderr."""
    REFUSED = 3
    """dflash-train: the environment does not match lockfiles/dflash-train.toml."""
    FAILED = 4
    """A runtime failure (out of memory, a compile error); one line on stderr."""
    CONFIG_MISMATCH = 5
    """dflash-eval --check-config: the drafter's config differs from the target's where a
    serving engine needs them equal (embedding scale, rope, norm eps, vocab, special
    tokens, chat template); one line per difference."""
    INTERRUPTED = 130
    """Ctrl-C."""
