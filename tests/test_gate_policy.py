"""Gate policies on a real (H200) snapshot, in-process: forbidden patterns, require-warm."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from envguard.gate import check
from envguard.gate.lockfile import Lock, build_entry
from envguard.model import Distribution
from envguard.render.report import DiffReport
from tests.incident import real_h200


def _lock(tmp_path: Path, **kw: object) -> tuple[Lock, object]:
    snap = real_h200()
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "envguard"\nversion = "0"\ndependencies = ["torch"]\n')
    lock = Lock(name="t", command="t", distribution="envguard", **kw)  # type: ignore[arg-type]
    lock = lock.with_entry(build_entry(snap, lock, entry_id="h200", project_root=tmp_path))
    return lock, snap


def test_custom_forbidden_pattern_is_named(tmp_path: Path) -> None:
    lock, snap = _lock(tmp_path, forbidden=("mycorp-*",))
    extra = Distribution(name="mycorp-serving", version="1.0", location="/x",
                         metadata_dir="mycorp_serving-1.0.dist-info")
    polluted = dataclasses.replace(snap, packages=[*snap.packages, extra])  # type: ignore[attr-defined]
    result = check(polluted, lock, "t.toml", tmp_path)
    assert not result.passed
    assert result.findings[0].rule == "forbidden-package-installed"
    assert "mycorp-serving" in result.findings[0].title
    assert check(snap, lock, "t.toml", tmp_path).passed  # type: ignore[arg-type]


def test_require_warm_refuses_a_cold_cache_and_says_so(tmp_path: Path) -> None:
    lock, snap = _lock(tmp_path, cache_policy="require-warm")
    result = check(snap, lock, "t.toml", tmp_path)  # type: ignore[arg-type]
    assert result.matched is not None and not result.passed  # the H200 cache is absent
    assert result.cache_note is not None and result.cache_note.rule == "compile-cache-cold"
    report = DiffReport(old_name="lock", new_name="env", diff=result.matched.diff,
                        findings=result.findings, refused_by=result.cache_note.title)
    assert not report.equivalent
    assert report.verdict.startswith("refused: the torch.compile cache")
    relaxed = dataclasses.replace(lock, cache_policy="warn-if-cold")
    assert check(snap, relaxed, "t.toml", tmp_path).passed  # type: ignore[arg-type]


def test_lock_refuses_an_environment_with_forbidden_packages(tmp_path: Path) -> None:
    import subprocess
    import sys

    snap = real_h200()
    sglang = Distribution(name="sglang", version="0.5.6", location="/x",
                          metadata_dir="sglang-0.5.6.dist-info")
    polluted = tmp_path / "polluted.json"
    polluted.write_text(dataclasses.replace(snap, packages=[*snap.packages, sglang]).to_json())
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "envguard"\nversion = "0"\ndependencies = ["torch"]\n')
    proc = subprocess.run([sys.executable, "-m", "envguard", "lock", "t", "--from",
                           str(polluted), "--distribution", "envguard"], cwd=tmp_path,
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "forbidden packages installed: sglang" in proc.stderr
    assert not (tmp_path / "lockfiles" / "t.toml").exists()


def test_strict_pins_every_distribution_of_the_reference(tmp_path: Path) -> None:
    import dataclasses as dc

    snap = real_h200()
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "envguard"\nversion = "0"\ndependencies = ["torch"]\n')
    lock_dir = tmp_path / "lockfiles"
    (lock_dir / "t.snapshots").mkdir(parents=True)
    (lock_dir / "t.snapshots" / "h200.json").write_text(snap.to_json())
    lock = Lock(name="t", command="t", distribution="envguard")
    entry = dc.replace(build_entry(snap, lock, entry_id="h200", project_root=tmp_path),
                       snapshot_file="t.snapshots/h200.json")
    lock = lock.with_entry(entry)
    extra = Distribution(name="pandas-extra", version="9.9", location="/x",
                         metadata_dir="pandas_extra-9.9.dist-info")
    drifted = dc.replace(snap, packages=[*snap.packages, extra])
    lock_path = str(lock_dir / "t.toml")
    assert check(drifted, lock, lock_path, tmp_path).passed  # outside the closure: free
    strict = check(drifted, lock, lock_path, tmp_path, strict=True)
    assert not strict.passed
    assert "package-added" in {f.rule for f in strict.findings}
    assert check(snap, lock, lock_path, tmp_path, strict=True).passed
    # The H200 image appends a CA to certifi's bundle: accepted at lock time, so not news;
    # a new edit in torch is.
    from envguard.model import IntegrityIssue

    assert {i.package for i in snap.integrity.issues} == {"certifi", "pip"}
    patched = dc.replace(snap, integrity=dc.replace(snap.integrity, issues=[
        *snap.integrity.issues,
        IntegrityIssue(package="torch", path="torch/fx/_symbolic_trace.py", problem="size")]))
    refused = check(patched, lock, lock_path, tmp_path, strict=True)
    assert [f.rule for f in refused.findings if f.severity.value == "critical"] == [
        "installed-files-modified"]


def test_gate_snapshot_options_are_the_fast_gate_scope(tmp_path: Path) -> None:
    from envguard.gate import gate_snapshot_options

    lock, _ = _lock(tmp_path)
    fast = gate_snapshot_options(lock, tmp_path)  # type: ignore[arg-type]
    assert fast.git is False and fast.write_cache_marker is False
    assert fast.integrity_only is not None and "envguard" in fast.integrity_only
    assert fast.cwd == tmp_path and fast.use_project_config is False
    full = gate_snapshot_options(lock, tmp_path, fast=False, for_lock=True)  # type: ignore[arg-type]
    assert full.git is True and full.integrity_only is None and full.write_cache_marker
