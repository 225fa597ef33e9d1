"""Build fingerprints: stable across installers, different across builds of one version."""

from __future__ import annotations

from pathlib import Path

import pytest

from envguard.probe import distributions
from envguard.probe.distributions import parse_headers
from envguard.probe.recordfile import fingerprint_record, is_fingerprinted, parse_record
from tests.wheelfactory import VenvFactory, build_wheel, fake_torch_files


def _scan(python_site: Path) -> dict[str, distributions.InstalledDist]:
    found, _ = distributions.scan([str(python_site)])
    return {i.dist.name: i for i in found}


def test_pip_and_uv_installs_of_one_wheel_have_one_fingerprint(
    venvs: VenvFactory, wheel_dir: Path
) -> None:
    wheel = build_wheel(wheel_dir, "demo-pkg", "1.0", {"demo_pkg/__init__.py": "X = 1\n"},
                        scripts={"demo-cli": "demo_pkg:main"})
    by_uv, by_pip = venvs.create(), venvs.create(with_pip=True)
    venvs.uv_install(by_uv, wheel)
    venvs.pip_install(by_pip, wheel)
    uv_dist = _scan(by_uv.site_packages())["demo-pkg"]
    pip_dist = _scan(by_pip.site_packages())["demo-pkg"]
    assert uv_dist.dist.installer == "uv"
    assert pip_dist.dist.installer == "pip"
    # The raw RECORDs differ (installer files, script shebangs), the fingerprints do not.
    raw_uv = (by_uv.site_packages() / "demo_pkg-1.0.dist-info" / "RECORD").read_text()
    raw_pip = (by_pip.site_packages() / "demo_pkg-1.0.dist-info" / "RECORD").read_text()
    assert raw_uv != raw_pip
    assert uv_dist.dist.fingerprint == pip_dist.dist.fingerprint
    assert uv_dist.dist.fingerprint is not None


@pytest.mark.parametrize("pycache", ["default", "prefix"])
def test_pip_compiling_bytecode_does_not_change_the_fingerprint(
    venvs: VenvFactory, wheel_dir: Path, tmp_path: Path, pycache: str,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip compiles bytecode at install and lists the .pyc files in RECORD: under
    __pycache__, or, with PYTHONPYCACHEPREFIX set, as ``../../../../<prefix>/...pyc``
    (which once counted as a file of the build and changed the fingerprint)."""
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    if pycache == "prefix":
        monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "pycache"))
    else:
        monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    wheel = build_wheel(wheel_dir, "demo-pkg", "1.0", {"demo_pkg/__init__.py": "X = 1\n"})
    by_uv, by_pip = venvs.create(), venvs.create(with_pip=True)
    venvs.uv_install(by_uv, wheel)
    venvs.pip_install(by_pip, wheel)
    raw_pip = (by_pip.site_packages() / "demo_pkg-1.0.dist-info" / "RECORD").read_text()
    assert ".pyc," in raw_pip  # pip did compile and record it
    assert (_scan(by_uv.site_packages())["demo-pkg"].dist.fingerprint
            == _scan(by_pip.site_packages())["demo-pkg"].dist.fingerprint)


def test_two_builds_of_one_version_have_different_fingerprints(
    venvs: VenvFactory, tmp_path: Path
) -> None:
    good = build_wheel(tmp_path / "a", "torch", "2.11.0+cu128", fake_torch_files())
    other = build_wheel(tmp_path / "b", "torch", "2.11.0+cu128",
                        fake_torch_files(git_version="1234567890abcdef1234567890abcdef12345678"))
    env1, env2 = venvs.create(), venvs.create()
    venvs.uv_install(env1, good)
    venvs.uv_install(env2, other)
    d1 = _scan(env1.site_packages())["torch"].dist
    d2 = _scan(env2.site_packages())["torch"].dist
    assert d1.version == d2.version == "2.11.0+cu128"
    assert d1.fingerprint != d2.fingerprint


def test_fingerprint_ignores_row_order_line_endings_and_install_files() -> None:
    rows = parse_record("a/x.py,sha256=AAA,3\r\nb/y.py,sha256=BBB,4\r\n")
    other = parse_record(
        "b/y.py,sha256=BBB,4\n"
        "a/x.py,sha256=AAA,3\n"
        "a/__pycache__/x.cpython-311.pyc,,\n"
        "../../../bin/tool,sha256=ZZZ,99\n"
        "p-1.0.dist-info/INSTALLER,sha256=I,3\n"
        "p-1.0.dist-info/REQUESTED,sha256=R,0\n"
        "p-1.0.dist-info/direct_url.json,sha256=D,10\n"
        "p-1.0.dist-info/uv_cache.json,sha256=U,10\n"
        "p-1.0.dist-info/RECORD,,\n"
    )
    kept = [r for r in other if is_fingerprinted(r[0])]
    assert fingerprint_record(rows) == fingerprint_record(kept)
    assert fingerprint_record(rows) != fingerprint_record(parse_record("a/x.py,sha256=AAB,3\n"))


def test_non_script_data_outside_site_packages_counts() -> None:
    assert is_fingerprinted("../../../include/site/python3.11/pkg/header.h")
    assert not is_fingerprinted("../../../bin/tool")
    assert not is_fingerprinted("..\\..\\Scripts\\tool.exe")
    assert is_fingerprinted("pkg/METADATA_helper.py")
    assert not is_fingerprinted("pkg-1.0.dist-info/RECORD")
    assert is_fingerprinted("pkg-1.0.dist-info/METADATA")


def test_parse_headers_joins_folded_lines_and_stops_at_body() -> None:
    text = "Name: foo\nVersion: 1.0\nLicense: line one\n  line two\nRequires-Dist: a\n" \
           "Requires-Dist: b; extra == 'x'\n\nName: not-a-header\n"
    headers = parse_headers(text)
    assert headers["name"] == ["foo"]
    assert headers["license"] == ["line one line two"]
    assert headers["requires-dist"] == ["a", "b; extra == 'x'"]


def test_short_record_rows_are_tolerated() -> None:
    assert parse_record("only/path\n\n,\n") == [("only/path", "", "")]


# -- dist-info folders read from the memo (RecordMemo.get_folder) ----------------------------

def test_a_memoised_folder_is_read_again_when_any_of_its_files_changes(
        venvs: VenvFactory, wheel_dir: Path, tmp_path: Path) -> None:
    import os
    import time

    from envguard.probe import distributions
    from envguard.probe.fastpath.records import RecordMemo

    env = venvs.create()
    venvs.uv_install(env, build_wheel(wheel_dir, "torch", "2.11.0+cu128", fake_torch_files()))
    site = [str(env.site_packages())]
    memo_file = tmp_path / "records.marshal"

    def scan() -> dict[str, object]:
        memo = RecordMemo(memo_file)
        found, _ = distributions.scan(site, memo)
        assert memo.save() is None
        return {i.dist.name: (i.dist, i.record, i.record_total, i.issues) for i in found}

    cold = scan()
    assert scan() == cold == {i.dist.name: (i.dist, i.record, i.record_total, i.issues)
                              for i in distributions.scan(site)[0]}  # memo hit = fresh read
    info = next(env.site_packages().glob("torch-*.dist-info"))
    metadata = info / "METADATA"
    before = os.stat(metadata)
    text = metadata.read_text()
    time.sleep(0.01)
    metadata.write_text(text.replace("Version: 2.11.0+cu128", "Version: 2.11.0+cu129"))
    os.utime(metadata, ns=(before.st_atime_ns, before.st_mtime_ns))  # size and mtime put back
    assert scan()["torch"][0].version == "2.11.0+cu129"  # type: ignore[index,union-attr]
    (info / "REQUESTED").write_text("")
    assert scan()["torch"][0].requested is True  # type: ignore[index,union-attr]
    (info / "INSTALLER").unlink()
    assert scan()["torch"][0].installer is None  # type: ignore[index,union-attr]
    memo_file.write_bytes(b"garbage")  # an unusable memo file is ignored
    assert scan()["torch"][0].installer is None  # type: ignore[index,union-attr]
