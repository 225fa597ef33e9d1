"""Where the test suite's shared files are, for test modules at any depth."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DATA = TESTS / "data"
GOLDEN = TESTS / "golden"
