"""Rules and findings: small named functions over a diff, yielding plain data."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

from envguard.changes import Change, SnapshotDiff
from envguard.model import Snapshot


class Severity(str, Enum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"critical": 0, "warning": 1, "info": 2}[self.value]


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    rule: str
    severity: Severity
    title: str
    """One line: what changed."""
    explanation: str
    """Why this can cause a regression."""
    evidence: tuple[str, ...]
    remedy: tuple[str, ...]
    """Steps in order; commands where one exists."""
    changes: tuple[Change, ...] = ()
    weight: int = 50
    """How directly this explains a breakage (higher first, within a severity)."""
    keywords: tuple[str, ...] = ()
    """Symptom words (error text) that point at this finding."""


@dataclass(frozen=True, slots=True)
class Context:
    old: Snapshot
    new: Snapshot
    diff: SnapshotDiff


Check = Callable[[Context], Iterable[Finding]]


@dataclass(frozen=True, kw_only=True, slots=True)
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
