"""Exit codes are a contract: the enum and docs/CLI.md must agree, and nothing is renumbered."""
from __future__ import annotations

import re

from envguard.exitcodes import ExitCode
from tests.paths import REPO

DOCS = REPO / "docs" / "CLI.md"


def test_documented_codes_match_the_enum() -> None:
    rows = re.findall(r"^\| (\d+) \| `([A-Z_]+)` \|", DOCS.read_text(), flags=re.M)
    assert {name: int(code) for code, name in rows} == {e.name: e.value for e in ExitCode}


def test_codes_never_move() -> None:
    assert [(e.name, e.value) for e in ExitCode] == [
        ("OK", 0), ("DRIFT", 1), ("USAGE", 2), ("REFUSED", 3), ("ENVIRONMENT_ERROR", 4),
        ("OUTPUT_ERROR", 5), ("INTERNAL_ERROR", 70), ("INTERRUPTED", 130)]
