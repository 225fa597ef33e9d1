"""Stat work started ahead (envguard.probe.fastpath.statahead): the units it may claim, the
ones it must not, and the workers nobody takes. Real venvs, real forks, real stat calls."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from envguard.model import Snapshot
from envguard.probe import SnapshotOptions, collect, distributions, integrity
from envguard.probe.fastpath import rows as memo_rows
from envguard.probe.fastpath import statahead
from envguard.probe.fastpath.records import RecordMemo
from envguard.probe.fastpath.rows import RecordRows
from envguard.probe.fastpath.statahead import Ahead, StatQueue
from tests.wheelfactory import Venv

pytestmark = pytest.mark.usefixtures("fork_always")


@pytest.fixture
def env(torch_and_tiny: Venv) -> Venv:
    return torch_and_tiny


def _snapshot(env: Venv, memo_root: Path, **changes: Any) -> Snapshot:
    return collect(SnapshotOptions(python=str(env.python), memo_root=memo_root, git=False,
                                   use_project_config=False, remember_caches=False, **changes))


class _Spy:
    """What the collector took from statahead, and what the check claimed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.taken: list[Ahead | None] = []
        self.pending: list[integrity.PendingCheck] = []
        take, begin = statahead.take, integrity.begin

        def spy_take(*args: Any) -> Ahead | None:
            self.taken.append(take(*args))
            return self.taken[-1]

        def spy_begin(*args: Any, **kwargs: Any) -> integrity.PendingCheck:
            self.pending.append(begin(*args, **kwargs))
            return self.pending[-1]

        monkeypatch.setattr(statahead, "take", spy_take)
        monkeypatch.setattr(integrity, "begin", spy_begin)

    def claimed(self) -> set[str]:
        return set((self.pending[-1].queued or {}).values())

    def own(self) -> set[str]:
        return {i.dist.name for i in self.pending[-1].own}


def _prefix(env: Venv) -> str:
    return str(env.path)


def test_unchanged_distributions_are_claimed_and_agree_with_a_fresh_check(
        env: Venv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memo = tmp_path / "memo"
    _snapshot(env, memo)  # writes the records memo
    site = env.site_packages()
    (site / "tiny" / "data.txt").write_text("changed, and longer\n")
    (site / "torch" / "version.py").unlink()
    spy = _Spy(monkeypatch)
    statahead.start(_prefix(env), memo)  # as envguard snapshot does, before the collector
    ahead = _snapshot(env, memo)
    assert spy.taken[-1] is not None and spy.taken[-1].queue is not None
    assert spy.claimed() >= {"torch", "tiny"} and not spy.own()
    fresh = _snapshot(env, tmp_path / "no-memo", use_memo=False)
    assert ahead.integrity == fresh.integrity
    assert {(i.package, i.path, i.problem) for i in ahead.integrity.issues} >= {
        ("tiny", "tiny/data.txt", "size"), ("torch", "torch/version.py", "missing")}


def test_a_distribution_changed_after_the_start_is_checked_by_this_process(
        env: Venv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers stat the memo's old rows of ``tiny``; RECORD then gains a row for a
    file that does not exist. The scan reads the new RECORD, so its rows are not the
    memo's list, and the check must not take the workers' (clean) answer for them."""
    memo = tmp_path / "memo"
    _snapshot(env, memo)
    spy = _Spy(monkeypatch)
    statahead.start(_prefix(env), memo)
    record = next(env.site_packages().glob("tiny-*.dist-info")) / "RECORD"
    record.write_text(record.read_text() + "tiny/added.py,sha256=abc,10\n")
    now = _snapshot(env, memo)
    assert "tiny" in spy.own() and "tiny" not in spy.claimed()
    assert "torch" in spy.claimed()
    assert ("tiny", "tiny/added.py", "missing") in {
        (i.package, i.path, i.problem) for i in now.integrity.issues}


def test_the_collector_starts_its_own_when_no_command_did(
        env: Venv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memo = tmp_path / "memo"
    _snapshot(env, memo)
    spy = _Spy(monkeypatch)
    _snapshot(env, memo)
    assert spy.taken[-1] is not None and spy.claimed() >= {"torch", "tiny"}
    _snapshot(env, memo, verify="hash")  # hashing: nothing started, nothing claimed
    assert spy.taken[-1] is None and spy.pending[-1].queue is None
    _snapshot(env, memo, integrity_only=frozenset({"tiny"}))  # the gate's scope
    assert spy.taken[-1] is None


def test_units_are_claimed_only_for_a_distribution_the_scan_read_from_the_memo(
        env: Venv, tmp_path: Path) -> None:
    """The claim rests on the scan's mark (``from_memo``) and the RECORD time, not on which
    object holds the rows."""
    memo = tmp_path / "memo"
    _snapshot(env, memo)
    ahead = Ahead(RecordMemo.for_prefix(_prefix(env), memo))
    try:
        assert ahead.queue is not None
        found, _ = distributions.scan([str(env.site_packages())], ahead.memo)
        claimed = [i for i in found if i.record is not None and i.record.count]
        assert {i.dist.name for i in claimed} >= {"torch", "tiny"}
        for item in claimed:
            meta_dir = os.path.join(item.site_dir, item.dist.metadata_dir)
            mtime = item.record_mtime_ns
            assert item.from_memo and ahead.units_for(meta_dir, mtime, from_memo=True)
            assert ahead.units_for(meta_dir, mtime, from_memo=False) is None
            assert ahead.units_for(meta_dir, (mtime or 0) + 1, from_memo=True) is None
    finally:
        ahead.abandon()


def test_starting_ahead_imports_neither_the_model_nor_the_collector(
        env: Venv, tmp_path: Path) -> None:
    """What the fork waits for: the records memo's entries are read before envguard.model is
    imported (its field digest is checked later, on the scan's first lookup)."""
    memo = tmp_path / "memo"
    _snapshot(env, memo)
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from envguard.probe.fastpath import statahead\n"
        "statahead.FORK_MIN_ROWS = 1\n"
        "statahead.usable_cpus = lambda: 2\n"
        "statahead.start(sys.argv[1], Path(sys.argv[2]))\n"
        "assert statahead._STARTED[0].queue.workers, 'no worker'\n"
        "print(sorted(m for m in sys.modules if m in ('envguard.model', "
        "'envguard.probe.collector', 'envguard.probe.distributions')))\n")
    done = subprocess.run([sys.executable, "-c", script, _prefix(env), str(memo)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_an_ahead_for_another_environment_is_abandoned(
        env: Venv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memo = tmp_path / "memo"
    _snapshot(env, memo)
    monkeypatch.setattr(StatQueue, "_work", lambda self: time.sleep(120))
    statahead.start(_prefix(env), memo)
    (started,) = statahead._STARTED
    assert started.queue is not None
    pids = [w._pid for w in started.queue.workers]
    assert statahead.take(str(tmp_path / "elsewhere"), memo) is None
    assert not statahead._STARTED
    for pid in pids:  # killed and reaped
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_workers_nobody_takes_are_killed_when_envguard_exits(
        env: Venv, tmp_path: Path) -> None:
    """A command that fails between start and collect: its workers do not outlive it."""
    memo = tmp_path / "memo"
    _snapshot(env, memo)
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from envguard.probe.fastpath import statahead\n"
        "statahead.FORK_MIN_ROWS = 1\n"
        "statahead.usable_cpus = lambda: 2\n"
        "statahead.StatQueue._work = lambda self: time.sleep(120)\n"
        "statahead.start(sys.argv[1], Path(sys.argv[2]))\n"
        "print(*[w._pid for w in statahead._STARTED[0].queue.workers])\n"
        "raise SystemExit(3)\n")
    done = subprocess.run([sys.executable, "-c", script, _prefix(env), str(memo)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 3, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert pids
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_many_small_units_share_few_numbers_and_each_is_checked_once(
        env: Venv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memo_rows, "CHUNK_ROWS", 1)
    monkeypatch.setattr(statahead, "UNIT_ROWS", 1)
    monkeypatch.setattr(statahead, "MAX_BATCHES", 4)
    site = str(env.site_packages())
    rows = [(f"tiny/missing-{n}.py", "sha256=x", "1") for n in range(40)]
    units = statahead.units_of(site, RecordRows.of(rows), None)
    assert len(units) == 40
    queue = StatQueue(units)
    assert len(queue.batches) <= 4
    assert sorted(n for batch in queue.batches for n in batch) == list(range(len(units)))
    queue.fork(2)
    results = queue.finish(range(len(units)))
    found = [issue[0] for n in sorted(results) for issue in results[n].issues]
    assert found == [r[0] for r in rows]  # every row once, none twice


_SPY = """\
import sys
from envguard.probe.fastpath import statahead
seen = []
real = statahead.start
def spy(*args):
    seen.append("envguard.probe.collector" in sys.modules)
    return real(*args)
statahead.start = spy
from envguard.cli import main
main(sys.argv[1:])
print(seen, file=sys.stderr)
"""


@pytest.mark.parametrize(("verify", "expected"), [("size", "[False, True]"), ("hash", "[]"),
                                                  ("none", "[]")])
def test_envguard_snapshot_starts_before_importing_the_collector(
        env: Venv, tmp_path: Path, verify: str, expected: str) -> None:
    """The CLI starts the stat work as soon as it knows the environment (the collector's
    own call is then a no-op); for --verify hash or none, nobody starts any."""
    done = subprocess.run(
        [sys.executable, "-c", _SPY, "snapshot", "--python", str(env.python), "-q",
         "--verify", verify, "-o", str(tmp_path / "s.json")],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == expected
