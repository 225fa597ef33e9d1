"""A ``file://`` URL from a direct_url.json back to the path it names: percent signs, spaces
and other quoted characters in a folder's name come back as they were, unquoted once."""

from __future__ import annotations

from pathlib import Path

import pytest

from envguard.restore.plan import file_url_path


@pytest.mark.parametrize("name", ["plain", "with space", "a%41b", "100%", "x%2541", "ü#?"])
def test_a_file_url_names_its_path(tmp_path: Path, name: str) -> None:
    wheel = tmp_path / name / "pkg-1.0-py3-none-any.whl"
    assert file_url_path(wheel.as_uri()) == str(wheel)


@pytest.mark.parametrize("url", ["https://host/pkg.whl", "file://otherhost/tmp/pkg.whl"])
def test_anything_but_a_local_file_url_is_none(url: str) -> None:
    assert file_url_path(url) is None
