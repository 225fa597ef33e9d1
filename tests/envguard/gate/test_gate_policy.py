"""Gate policies on a real (H200) snapshot, in-process: forbidden patterns, require-warm."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from envguard.explain.report import DiffReport
from envguard.gate import check
from envguard.gate.lockfile import Lock, build_entry
from envguard.model import Distribution, Snapshot
from envguard.render import OutputFormat, PlainScreen, render
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
    assert fast.git is False
    assert fast.integrity_only is not None and "envguard" in fast.integrity_only
    # [tool.envguard] env applies (as to every snapshot); its files come from the lock
    assert fast.cwd == tmp_path and fast.use_project_config and not fast.project_files
    full = gate_snapshot_options(lock, tmp_path, fast=False)  # type: ignore[arg-type]
    assert full.git is True and full.integrity_only is None


# ---------------------------------------------------------------------------- new machines

def _locked_on_h200(tmp_path: Path) -> tuple[Lock, str, Snapshot]:
    """The lock with its entry's reference snapshot beside it, as ``envguard lock`` writes."""
    lock, snap = _lock(tmp_path, cache_policy="ignore")
    folder = tmp_path / "lockfiles"
    (folder / "t.snapshots").mkdir(parents=True)
    (folder / "t.snapshots" / "h200.json").write_text(snap.to_json())  # type: ignore[attr-defined]
    entry = dataclasses.replace(lock.entries[0], snapshot_file="t.snapshots/h200.json")
    return dataclasses.replace(lock, entries=(entry,)), str(folder / "t.toml"), snap  # type: ignore[return-value]


def _on(snap: Snapshot, *, host: str, torch: str = "2.15.0+cu132",
        cuda: str | None = "13.2") -> Snapshot:
    """The same environment on host ``host``, with another torch build."""
    return dataclasses.replace(
        snap, system=dataclasses.replace(snap.system, hostname=host),
        torch=dataclasses.replace(snap.torch, version=torch, cuda=cuda))


def test_a_new_machine_is_told_so_instead_of_shown_changes(tmp_path: Path) -> None:
    lock, path, snap = _locked_on_h200(tmp_path)
    result = check(_on(snap, host="laptop"), lock, path, tmp_path)
    assert not result.passed and result.new_machine is not None
    (finding,) = result.findings
    assert finding.rule == "new-machine"
    assert finding.title == ("no entry of this lock was recorded on laptop or on a machine like "
                             "it (linux-x86_64, cpython 3.12, torch CUDA 13.2)")
    assert "the closest entry, h200, was recorded on vm (linux-x86_64, cpython 3.12, " \
        "torch CUDA 13.0)" in finding.explanation
    assert finding.remedy[0] == "if this environment is known-good, bless it: envguard lock t"
    assert finding.remedy[1].endswith("envguard restore " + str(tmp_path / "lockfiles" /
                                                                "t.snapshots" / "h200.json"))

    doc = json.loads(render(result, OutputFormat.JSON))
    assert doc["changes"] == [] and doc["equivalent"] is False
    assert [f["rule"] for f in doc["findings"]] == ["new-machine"]
    assert doc["verdict"] == f"refused: {finding.title}", doc["verdict"]
    text = render(result, OutputFormat.TEXT, screen=PlainScreen(width=200))
    assert "[new-machine]" in text and "envguard lock t" in text
    assert "torch-version-changed" not in text and "change(s)" not in text


def test_the_same_host_or_the_same_kind_of_machine_has_drifted(tmp_path: Path) -> None:
    lock, path, snap = _locked_on_h200(tmp_path)
    same_host = check(_on(snap, host="vm"), lock, path, tmp_path)
    same_kind = check(_on(snap, host="node-17", torch="2.11.0+cu130", cuda="13.0"), lock,
                      path, tmp_path)
    assert same_kind.passed  # a new host name alone changes nothing
    polluted = _on(snap, host="node-17", torch="2.11.0+cu130", cuda="13.0")
    extra = Distribution(name="vllm", version="0.11.0", location="/x",
                         metadata_dir="vllm-0.11.0.dist-info")
    drifted = check(dataclasses.replace(polluted, packages=[*polluted.packages, extra]), lock,
                    path, tmp_path)
    for result in (same_host, drifted):
        assert not result.passed and result.new_machine is None
        assert "new-machine" not in [f.rule for f in result.findings]
    assert "torch-version-changed" in [f.rule for f in same_host.findings]
    assert drifted.findings[0].rule == "foreign-stack-installed"


def test_forbidden_packages_are_named_on_a_new_machine_too(tmp_path: Path) -> None:
    lock, path, snap = _locked_on_h200(tmp_path)
    new = _on(snap, host="laptop")
    extra = Distribution(name="vllm", version="0.11.0", location="/x",
                         metadata_dir="vllm-0.11.0.dist-info")
    result = check(dataclasses.replace(new, packages=[*new.packages, extra]), lock, path,
                   tmp_path)
    assert [f.rule for f in result.findings] == ["new-machine", "foreign-stack-installed"]
