"""The knowledge base of known breaks (envguard/explain/knowledge/breaks.toml): it loads,
each entry is well-formed and cited, and malformed entries are refused by field."""

from __future__ import annotations

import re

import pytest

from envguard.explain.knowledge import known_breaks, parse_breaks

GOOD = ('[[break]]\nid = "a-b"\npackage = "a"\nversions = "<2"\ndependency = "b"\n'
        'dependency_versions = ">=3"\nerrors = ["boom"]\nfix = ["b<3"]\n'
        'report = "https://example.org/1"\n')


def test_the_bundled_entries_load_and_each_is_cited() -> None:
    from envguard.explain.knowledge import FILE

    entries = known_breaks()
    # known_breaks() skips packaging's parsers at run time; the file is checked here
    assert parse_breaks(FILE.read_text(encoding="utf-8")) == entries
    assert entries
    assert len({e.id for e in entries}) == len(entries)
    for e in entries:
        assert e.report.startswith("https://"), e.id
        assert e.package != e.dependency, e.id
        assert e.matches_error(e.errors[0].upper()), e.id


@pytest.mark.parametrize(("change", "field"), [
    (("id = \"a-b\"", "id = \"A B\""), "break[0].id"),
    (("package = \"a\"", "package = \"A_pkg\""), "break[0].package"),
    (("versions = \"<2\"", "versions = \"<<2\""), "break[0].versions"),
    (("fix = [\"b<3\"]", "fix = [\"b<<3\"]"), "break[0].fix[0]"),
    (("fix = [\"b<3\"]", "fix = []"), "break[0].fix"),
    (("errors = [\"boom\"]", "errors = \"boom\""), "break[0].errors"),
    (("https://example.org/1", "http://example.org/1"), "break[0].report"),
])
def test_a_malformed_entry_is_refused_by_its_field(change: tuple[str, str], field: str) -> None:
    assert parse_breaks(GOOD)[0].id == "a-b"
    with pytest.raises(ValueError, match="^" + re.escape(field)):
        parse_breaks(GOOD.replace(*change))


def test_an_id_used_twice_is_refused() -> None:
    with pytest.raises(ValueError, match=r"break\[1\]\.id"):
        parse_breaks(GOOD + GOOD)
