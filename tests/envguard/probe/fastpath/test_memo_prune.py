"""Memo files unused for a month are pruned, at most once a day, and nothing else is.

Real files, links and FIFOs in a real memo folder; the last test runs real snapshots
(``envguard snapshot``, a subprocess) against a memo folder holding a month-old memo.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envguard.probe.fastpath import prune as prune_module
from envguard.probe.fastpath.prune import MAX_IDLE_S, MEMO_NAME, PERIOD_S, STAMP, prune
from tests.envguard.test_hostile_state import SRC

NOW = time.time()
OLD = NOW - MAX_IDLE_S - 86400
HEX16, HEX24 = "0123456789abcdef", "0123456789abcdef01234567"
MEMO_NAMES = (f"records-{HEX16}.marshal", f"hashes-{HEX16}.marshal",
              f"interpreter-{HEX16}.marshal", f"gpu-{HEX16}.json", f"closure-{HEX24}.json")


@pytest.fixture(autouse=True)
def _fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prune_module, "_DONE", set())


def memo(folder: Path, name: str, when: float, atime: float | None = None) -> Path:
    path = folder / name
    path.write_bytes(b"memo")
    os.utime(path, (when if atime is None else atime, when))
    return path


def test_old_memo_files_go_and_fresh_ones_stay(tmp_path: Path) -> None:
    old = [memo(tmp_path, n, OLD) for n in MEMO_NAMES]
    fresh = memo(tmp_path, f"records-{'f' * 16}.marshal", NOW - 86400)
    assert prune(tmp_path, now=NOW) == sorted(p.name for p in old)
    assert not any(p.exists() for p in old) and fresh.exists()
    assert (tmp_path / STAMP).stat().st_mtime == pytest.approx(NOW)


def test_a_recent_read_keeps_an_old_write(tmp_path: Path) -> None:
    """The later of mtime and atime is the last use: a memo read last week stays."""
    read = memo(tmp_path, f"gpu-{HEX16}.json", OLD, atime=NOW - 7 * 86400)
    assert prune(tmp_path, now=NOW) == [] and read.exists()


def test_foreign_names_links_and_odd_files_stay(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    victim = memo(tmp_path / "elsewhere", "victim.txt", OLD)
    kept = [memo(tmp_path, n, OLD) for n in ("notes.json", f"records-{HEX16}.marshal.bak",
                                            f"records-{HEX16.upper()}.marshal",
                                            "records-short.marshal", "user-file.marshal")]
    link = tmp_path / f"hashes-{HEX16}.marshal"
    link.symlink_to(victim)
    os.utime(link, (OLD, OLD), follow_symlinks=False)
    (tmp_path / f"closure-{HEX24}.json").mkdir()
    os.utime(tmp_path / f"closure-{HEX24}.json", (OLD, OLD))
    os.mkfifo(tmp_path / f"gpu-{HEX16}.json")
    os.utime(tmp_path / f"gpu-{HEX16}.json", (OLD, OLD))
    (tmp_path / "compile-caches").mkdir()
    archive = memo(tmp_path / "compile-caches", f"records-{HEX16}.marshal", OLD)
    assert prune(tmp_path, now=NOW) == []
    assert all(p.exists() for p in kept) and link.is_symlink() and victim.exists()
    assert (tmp_path / f"closure-{HEX24}.json").is_dir() and archive.exists()
    assert (tmp_path / f"gpu-{HEX16}.json").exists()


def test_the_stamp_holds_pruning_to_once_a_day(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    first = memo(tmp_path, MEMO_NAMES[0], OLD)
    assert prune(tmp_path, now=NOW) == [first.name]
    second = memo(tmp_path, MEMO_NAMES[1], OLD)
    assert prune(tmp_path, now=NOW + PERIOD_S) == []  # same process: once
    monkeypatch.setattr(prune_module, "_DONE", set())  # another process, within the day
    assert prune(tmp_path, now=NOW + PERIOD_S / 2) == [] and second.exists()
    monkeypatch.setattr(prune_module, "_DONE", set())  # a day later
    assert prune(tmp_path, now=NOW + PERIOD_S + 1) == [second.name]


def test_a_stamp_from_the_future_does_not_stop_pruning(tmp_path: Path) -> None:
    (tmp_path / STAMP).write_bytes(b"")
    os.utime(tmp_path / STAMP, (NOW + 10 * 86400, NOW + 10 * 86400))
    old = memo(tmp_path, MEMO_NAMES[2], OLD)
    assert prune(tmp_path, now=NOW) == [old.name]


def test_a_linked_stamp_stops_pruning_and_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    target = memo(victim, "stamp-target", OLD)
    folder = tmp_path / "memo"
    folder.mkdir()
    (folder / STAMP).symlink_to(target)
    old = memo(folder, MEMO_NAMES[3], OLD)
    assert prune(folder, now=NOW) == [] and old.exists()
    assert target.stat().st_mtime == pytest.approx(OLD)


def test_a_linked_memo_folder_is_not_pruned(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    old = memo(real, MEMO_NAMES[4], OLD)
    (tmp_path / "link").symlink_to(real)
    assert prune(tmp_path / "link", now=NOW) == [] and old.exists()


def test_names_envguard_writes_match_the_pattern(tmp_path: Path) -> None:
    from envguard.probe.fastpath.facts import _path
    from envguard.probe.fastpath.hashes import HashMemo
    from envguard.probe.fastpath.records import RecordMemo

    for path in (RecordMemo.for_prefix_path(sys.prefix, tmp_path),
                 HashMemo.for_prefix(sys.prefix, tmp_path).path,
                 _path(sys.executable, tmp_path)):
        assert MEMO_NAME.fullmatch(path.name), path.name


def test_a_snapshot_prunes_the_memo_folder(tmp_path: Path) -> None:
    """A real ``envguard snapshot`` writes its memo files and removes a month-old one."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    stale = memo(cache, f"records-{'e' * 16}.marshal", OLD)
    foreign = memo(cache, "mine.json", OLD)
    env = {**os.environ, "PYTHONPATH": str(SRC), "ENVGUARD_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "envguard", "snapshot", "--python",
                           sys.executable, "--output", str(tmp_path / "s.json")],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists() and foreign.exists() and (cache / STAMP).is_file()
    assert any(MEMO_NAME.fullmatch(p.name) for p in cache.iterdir())
