"""Output formats of ``envguard diff`` (and later ``check``), one enum, one renderer each."""

from __future__ import annotations

from enum import Enum


class OutputFormat(str, Enum):
    TEXT = "text"
    JSON = "json"
    MARKDOWN = "markdown"
