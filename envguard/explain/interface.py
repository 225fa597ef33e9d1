"""Rules: small named functions over a diff, yielding findings (:mod:`envguard.findings`)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import field

from envguard.changes import SnapshotDiff
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


_PLAIN_REQUIREMENT = re.compile(r"[A-Za-z0-9_.+=<>~,-]+")


def shell_word(text: str) -> str:
    """``text`` as one word of a remedy's shell command, safe to paste whatever a snapshot
    holds: a plain requirement in double quotes (``"torch==2.11.0+cu128"``), anything
    else (``$``, quotes, ``;``, spaces) single-quoted by :func:`shlex.quote`."""
    return f'"{text}"' if _PLAIN_REQUIREMENT.fullmatch(text) else shlex.quote(text)


def shell_words(texts: Iterable[str]) -> str:
    """Names as shell words: ``sglang vllm`` stays as it is, an odd name is quoted."""
    return " ".join(shlex.quote(t) for t in texts)


def short(value: object, n: int = 12) -> str:
    """A git commit or digest shortened for a title: ``70d99e998b49…``."""
    text = "none" if value is None else str(value)
    text = text.removeprefix("sha256:")
    return text if len(text) <= n else text[:n] + "…"
