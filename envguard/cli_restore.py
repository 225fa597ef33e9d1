"""``envguard restore``: the command-line side (stub; being written)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    """Register the subcommand (nothing yet)."""
