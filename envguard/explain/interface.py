"""Rules: small named functions over a diff, yielding findings (:mod:`envguard.findings`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import field

from envguard.changes import SnapshotDiff
from envguard.explain.remedies import shell_word, shell_words
from envguard.findings import Finding, Severity
from envguard.frozen import frozen
from envguard.model import Snapshot

__all__ = ["Check", "Context", "Finding", "Rule", "Severity", "shell_word", "shell_words",
           "short"]


@frozen(kw_only=False)
class Context:
    old: Snapshot
    new: Snapshot
    diff: SnapshotDiff


Check = Callable[[Context], Iterable[Finding]]


@frozen
class Rule:
    id: str
    title: str
    check: Check
    keywords: tuple[str, ...] = field(default=())


def short(value: object, n: int = 12) -> str:
    """A git commit or digest shortened for a title: ``70d99e998b49…``."""
    text = "none" if value is None else str(value)
    text = text.removeprefix("sha256:")
    return text if len(text) <= n else text[:n] + "…"
