"""A conda prefix made by a real installer: py-rattler (the library under pixi) writes
``conda-meta/`` with an empty ``history``, and ``envguard history`` takes the times of
the records instead; a prefix whose history holds transactions keeps using it.

The prefix is a uv venv (an interpreter to probe) that rattler installs tiny conda
packages into, offline, from a ``file://`` channel (as tests/envguard/probe/
test_conda_real.py does). Record times are set with ``os.utime``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from envguard.history import Event
from envguard.history.conda import created, record_events
from envguard.history.recorded import Runs, Seen, annotate, packages_of
from envguard.snapshot_file import read_snapshot
from tests.envguard.history.test_timeline import envguard
from tests.wheelfactory import VenvFactory

pytest.importorskip("rattler", reason="py-rattler (a dev dependency) is missing")
from tests.envguard.probe.test_conda_real import install, package


def history(prefix: Path, cwd: Path) -> Any:
    proc = envguard("history", "--python", prefix / "bin" / "python", "--format", "json", "-q",
                    cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def prefix(venvs: VenvFactory, tmp_path: Path) -> Path:
    made, _ = _prefix(venvs, tmp_path)
    return made


@pytest.fixture
def prefix_and_before(venvs: VenvFactory, tmp_path: Path) -> tuple[Path, Path]:
    """The prefix, and a snapshot of it taken between the two transactions."""
    return _prefix(venvs, tmp_path, before=tmp_path / "before.json")


def _prefix(venvs: VenvFactory, tmp_path: Path, before: Path | None = None
            ) -> tuple[Path, Path]:
    """rattler installed tiny 2.0 and other 1.0 an hour ago, then replaced tiny 2.0 by 1.0
    ten minutes later (the record of ``other``, which that transaction kept, untouched)."""
    channel = tmp_path / "channel"
    package(channel, "tiny", "1.0", "0", {"lib/tiny1": b"a"})
    package(channel, "tiny", "2.0", "0", {"lib/tiny2": b"b"})
    package(channel, "other", "1.0", "0", {"lib/other": b"o"})
    made = venvs.create("pixi-like").path
    install(made, channel, ["tiny==2.0", "other"], tmp_path / "rattler-cache")
    meta = made / "conda-meta"
    assert (meta / "history").read_text() == ""  # what rattler and pixi leave
    start = time.time() - 3600
    for path in (made / "pyvenv.cfg", meta / "history", *meta.glob("*.json")):
        os.utime(path, (start, start))
    if before is not None:
        taken = envguard("snapshot", "-q", "--python", made / "bin" / "python", "-o", before,
                         cwd=tmp_path)
        assert taken.returncode == 0, taken.stderr
    install(made, channel, ["tiny==1.0", "other"], tmp_path / "rattler-cache")
    os.utime(meta / "tiny-1.0-0.json", (start + 600, start + 600))
    return made, before or tmp_path


def test_an_empty_history_gives_way_to_the_records_times(prefix: Path,
                                                          clean_cwd: Path) -> None:
    start = (prefix / "pyvenv.cfg").stat().st_mtime
    # A record's timestamp is the package's build time (index.json's), not its install's:
    # a package built in 2017 and linked now is dated by its record's file time.
    record = prefix / "conda-meta" / "tiny-1.0-0.json"
    record.write_text(json.dumps({**json.loads(record.read_text()),
                                  "timestamp": 1500000000000}))
    os.utime(record, (start + 600, start + 600))
    doc = history(prefix, clean_cwd)
    at = {e["subject"]: e["at"] for e in doc["events"] if e["kind"] == "conda-installed"}
    assert at == {"other": pytest.approx(start), "tiny": pytest.approx(start + 600)}
    assert not [e for e in doc["events"] if e["kind"] == "conda"]
    summaries = [ep["summary"] for ep in doc["episodes"]]
    assert "environment created; conda installed: other 1.0" in summaries
    assert ("conda installed: tiny 1.0 (whether it replaced earlier versions is not on disk)"
            in summaries), summaries
    (tiny,) = [e for e in doc["events"] if e["subject"] == "tiny"]
    assert (tiny["version"], tiny["change"], tiny["evidence"]) == (
        "1.0", "", "conda-meta/tiny-1.0-0.json")


def test_a_history_with_transactions_is_still_used(prefix: Path, clean_cwd: Path) -> None:
    (prefix / "conda-meta" / "history").write_text(
        "==> 2024-03-01 10:00:00 <==\n# cmd: pixi install\n+file:///c::tiny-2.0-0\n"
        "+file:///c::other-1.0-0\n==> 2024-03-01 10:10:00 <==\n# cmd: pixi install\n"
        "-file:///c::tiny-2.0-0\n+file:///c::tiny-1.0-0\n")
    doc = history(prefix, clean_cwd)
    assert not [e for e in doc["events"] if e["kind"] == "conda-installed"]
    conda = [e for e in doc["events"] if e["kind"] == "conda"]
    assert [e["detail"] for e in conda] == [
        "+2: tiny-2.0-0, other-1.0-0", "+1 -1: tiny-1.0-0, tiny-2.0-0; downgraded: tiny 2.0 → 1.0"]


def test_between_two_recorded_snapshots_a_conda_downgrade_is_named(
        prefix_and_before: tuple[Path, Path], tmp_path: Path) -> None:
    """The snapshot a run would have recorded between the transactions, and the prefix
    now: tiny's record, written after it, is named downgraded 2.0 → 1.0; other's, older
    than it, is left as the disk has it."""
    made, before = prefix_and_before
    now = tmp_path / "now.json"
    assert envguard("snapshot", "-q", "--python", made / "bin" / "python", "-o", now,
                    cwd=tmp_path).returncode == 0
    earlier, later = read_snapshot(before), read_snapshot(now)
    start = (made / "pyvenv.cfg").stat().st_mtime
    runs = Runs(events=(), seen=(Seen(at=start + 300, run="r1", packages=packages_of(earlier)),))
    events = annotate(record_events(later, made), runs, later, time.time(),
                      conda_history=False)
    by_name = {e.subject: e for e in events}
    assert (by_name["tiny"].change, by_name["tiny"].old, by_name["tiny"].version) == (
        "downgraded", "2.0", "1.0")
    assert (by_name["other"].change, by_name["other"].old) == ("", None)
    assert [e for e in events if e.kind == "recorded-change"] == []
    # the miss: with conda's own history the records are not compared
    kept = annotate(record_events(later, made), runs, later, time.time(), conda_history=True)
    assert {e.change for e in kept} == {""}


def test_when_a_conda_prefix_was_made(tmp_path: Path) -> None:
    """With an empty history, its own time or the oldest record's, whichever is older;
    with transactions, the first."""
    meta = tmp_path / "conda-meta"
    meta.mkdir()
    (meta / "history").write_text("")
    os.utime(meta / "history", (1000, 1000))
    records = [Event(at=900.0, kind="conda-installed", subject="a", evidence="conda-meta/a.json"),
               Event(at=1200.0, kind="conda-installed", subject="b")]
    assert created(tmp_path, [], records) == (900.0, "conda-meta/a.json (the oldest record)")
    assert created(tmp_path, [], records[1:])[0] == 1000.0  # type: ignore[index]
    first = Event(at=500.0, kind="conda", subject="conda create")
    assert created(tmp_path, [first], records) == (500.0, "conda-meta/history")
    assert created(tmp_path / "nowhere", [], []) is None
