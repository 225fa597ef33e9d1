"""Installed files against RECORD: edits, missing files, quirks, and the hash cache."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from envguard.probe import distributions, integrity
from envguard.probe.background import Forked
from envguard.probe.fastpath import statahead
from envguard.probe.fastpath.hashes import HashMemo
from envguard.probe.fastpath.statahead import StatQueue
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files


@pytest.fixture
def torch_env(venvs: VenvFactory, wheel_dir: Path) -> Venv:
    env = venvs.create()
    wheel = build_wheel(wheel_dir, "torch", "2.11.0+cu128", fake_torch_files(),
                        scripts={"torchrun": "torch:main"})
    venvs.uv_install(env, wheel)
    return env


def _verify(env: Venv, mode: str, cache: HashMemo | None = None) -> integrity.Integrity:
    found, _ = distributions.scan([str(env.site_packages())])
    return integrity.verify(found, mode, memo=cache)


def _problems(result: integrity.Integrity) -> set[tuple[str, str, str]]:
    return {(i.package, i.path, i.problem) for i in result.issues}


def test_clean_install_matches_and_tolerates_rewritten_scripts(torch_env: Venv) -> None:
    for mode in ("size", "hash"):
        result = _verify(torch_env, mode)
        assert result.issues == [], result.issues
        assert result.checked_files >= 3
        # The console script's shebang was rewritten by the installer: tolerated, not tampering.
        assert result.tolerated >= 1


def test_patched_file_of_a_different_size_is_reported_by_size_check(torch_env: Venv) -> None:
    target = torch_env.site_packages() / "torch" / "fx" / "_symbolic_trace.py"
    target.write_text(target.read_text() + "_is_fx_tracing_flag = False  # hot patch\n")
    result = _verify(torch_env, "size")
    assert ("torch", "torch/fx/_symbolic_trace.py", "size") in _problems(result)


def test_same_size_edit_is_caught_by_hash_and_flagged_by_size_mtime(torch_env: Venv) -> None:
    target = torch_env.site_packages() / "torch" / "fx" / "_symbolic_trace.py"
    original = target.read_text()
    edited = original.replace("False", "True ")[: len(original)]
    assert len(edited) == len(original) and edited != original
    target.write_text(edited)
    later = os.stat(target).st_mtime + 60
    os.utime(target, (later, later))
    assert ("torch", "torch/fx/_symbolic_trace.py", "hash") in _problems(_verify(torch_env, "hash"))
    size_result = _problems(_verify(torch_env, "size"))
    assert ("torch", "torch/fx/_symbolic_trace.py", "modified-after-install") in size_result


def test_missing_file_and_missing_record(torch_env: Venv, venvs: VenvFactory,
                                         wheel_dir: Path) -> None:
    (torch_env.site_packages() / "torch" / "version.py").unlink()
    other = build_wheel(wheel_dir, "norecord", "0.1", {"norecord/__init__.py": ""})
    venvs.uv_install(torch_env, other)
    (torch_env.site_packages() / "norecord-0.1.dist-info" / "RECORD").unlink()
    result = _verify(torch_env, "size")
    assert ("torch", "torch/version.py", "missing") in _problems(result)
    assert result.without_record == ["norecord"]


def test_hash_cache_makes_a_warm_rerun_read_nothing(torch_env: Venv, tmp_path: Path) -> None:
    cache = HashMemo(tmp_path / "hashes.marshal")
    cold = _verify(torch_env, "hash", cache)
    assert cold.hashed_bytes > 0
    assert cache.save() is None
    warm_cache = HashMemo(tmp_path / "hashes.marshal")
    warm_cache.load()
    warm = _verify(torch_env, "hash", warm_cache)
    assert warm.hashed_bytes == 0
    assert warm.issues == []
    # An edit invalidates the entry through the stat key, and the edit is reported.
    target = torch_env.site_packages() / "torch" / "__init__.py"
    target.write_text(target.read_text().replace("torch", "TORCH"))
    after = _verify(torch_env, "hash", warm_cache)
    assert after.hashed_bytes > 0
    assert ("torch", "torch/__init__.py", "hash") in _problems(after)


def test_a_save_drops_the_entries_of_files_that_are_gone(tmp_path: Path) -> None:
    kept, gone, new = (tmp_path / n for n in ("kept.py", "gone.py", "new.py"))
    for f in (kept, gone, new):
        f.write_text("x")
    path = tmp_path / "hashes.marshal"
    first = HashMemo(path)
    first.put(str(kept), (1, 1, 1, 1), "sha256", "a")
    first.put(str(gone), (2, 2, 2, 2), "sha256", "b")
    assert first.save() is None
    gone.unlink()  # an uninstalled package's file
    later = HashMemo(path)  # a run that hashes only new.py
    later.load()
    later.put(str(new), (3, 3, 3, 3), "sha256", "c")
    assert later.save() is None
    again = HashMemo(path)
    again.load()
    assert again.get(str(kept), (1, 1, 1, 1), "sha256") == "a"  # still there: kept
    assert again.get(str(new), (3, 3, 3, 3), "sha256") == "c"
    assert again.get(str(gone), (2, 2, 2, 2), "sha256") is None
    assert len(again._entries) == 2


def test_corrupt_hash_cache_is_ignored_with_a_note(tmp_path: Path) -> None:
    import marshal

    path = tmp_path / "hashes.marshal"
    path.write_bytes(b"\xffgarbage")
    cache = HashMemo(path)
    cache.load()
    assert cache.load_error is not None and "ignored" in cache.load_error
    assert cache.get("/x", (1, 2, 3, 4), "sha256") is None
    # Readable but of another format or shape: silently a miss, never a crash.
    for doc in ({"sha256:/x": ((1, 2, 3, 4), "d")}, (("other", 1, 1), {}),
                (("envguard-hashcache", 2, marshal.version), {"sha256:/x": ["bad"]})):
        path.write_bytes(marshal.dumps(doc))
        cache = HashMemo(path)
        cache.load()
        assert cache.get("/x", (1, 2, 3, 4), "sha256") is None


def test_unknown_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown verify mode"):
        integrity.verify([], "everything")


def test_issue_list_is_capped_per_package(torch_env: Venv, venvs: VenvFactory,
                                          wheel_dir: Path) -> None:
    files = {f"big/m{i}.py": f"x = {i}\n" for i in range(integrity._MAX_ISSUES_PER_PACKAGE + 20)}
    venvs.uv_install(torch_env, build_wheel(wheel_dir, "big", "1.0", files))
    for path in (torch_env.site_packages() / "big").glob("m*.py"):
        path.unlink()
    result = _verify(torch_env, "size")
    assert sum(1 for i in result.issues if i.package == "big") == integrity._MAX_ISSUES_PER_PACKAGE


def test_parallel_map_keeps_order_and_reraises() -> None:
    from envguard.probe.background import Task, parallel_map

    assert list(parallel_map(lambda x: x * x, range(50), 4)) == [x * x for x in range(50)]
    assert list(parallel_map(lambda x: x, [], 4)) == []

    def boom(x: int) -> int:
        if x == 3:
            raise KeyError("three")
        return x

    with pytest.raises(KeyError, match="three"):
        list(parallel_map(boom, range(6), 3))
    assert Task(lambda: 41 + 1).result() == 42
    with pytest.raises(ZeroDivisionError):
        Task(lambda: 1 // 0).result()


# ------------------------------------------------------ paths that are not files (issue 22)

_VERIFY_IN_A_CHILD = """\
import json, sys
from envguard.probe import distributions, integrity
found, _ = distributions.scan([sys.argv[1]])
result = integrity.verify(found, sys.argv[2])
print(json.dumps([[i.package, i.path, i.problem, i.actual] for i in result.issues]))
"""


def _verify_in_a_child(env: Venv, mode: str) -> set[tuple[str, str, str, str | None]]:
    """verify() in a subprocess under a timeout and a 2 GiB address-space limit: a check
    that blocks on a FIFO or reads /dev/zero forever fails the test instead of hanging it."""
    import json
    import resource
    import subprocess
    import sys

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    try:
        proc = subprocess.run([sys.executable, "-c", _VERIFY_IN_A_CHILD,
                               str(env.site_packages()), mode], capture_output=True,
                              text=True, timeout=60, check=False, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"--verify {mode} hung")
    assert proc.returncode == 0, proc.stderr
    return {tuple(x) for x in json.loads(proc.stdout)}  # type: ignore[misc]


def _add_record_rows(env: Venv, dist_info: str, *rows: str) -> None:
    record = env.site_packages() / dist_info / "RECORD"
    record.write_text(record.read_text() + "".join(f"{r}\n" for r in rows))


@pytest.mark.parametrize("mode", ["hash", "size"])
def test_a_fifo_in_place_of_a_file_is_reported_not_read(torch_env: Venv, mode: str) -> None:
    target = torch_env.site_packages() / "torch" / "version.py"
    target.unlink()
    os.mkfifo(target)
    found = _verify_in_a_child(torch_env, mode)
    assert ("torch", "torch/version.py", "not-a-regular-file", "FIFO") in found


@pytest.mark.parametrize("mode", ["hash", "size"])
def test_a_symlink_to_dev_zero_is_reported_not_read(torch_env: Venv, mode: str) -> None:
    target = torch_env.site_packages() / "torch" / "fx" / "_symbolic_trace.py"
    target.unlink()
    target.symlink_to("/dev/zero")
    found = _verify_in_a_child(torch_env, mode)
    assert ("torch", "torch/fx/_symbolic_trace.py", "not-a-regular-file",
            "character device") in found


@pytest.mark.parametrize("mode", ["hash", "size"])
def test_a_record_row_leading_out_of_the_prefix_is_never_opened(torch_env: Venv,
                                                                mode: str) -> None:
    """Rows with a hash and no size (allowed by RECORD): the old code hashed /dev/zero."""
    escape = "../" * 12 + "dev/zero"
    _add_record_rows(torch_env, "torch-2.11.0+cu128.dist-info",
                     f"{escape},sha256=AAAA,", "/dev/zero,sha256=AAAA,")
    found = _verify_in_a_child(torch_env, mode)
    assert ("torch", escape, "outside-install-tree", "/dev/zero") in found
    assert ("torch", "/dev/zero", "outside-install-tree", "/dev/zero") in found
    assert not [x for x in found if x[2] not in ("outside-install-tree",)], found


def test_data_files_under_the_prefix_are_inside_the_tree(venvs: VenvFactory,
                                                         wheel_dir: Path) -> None:
    """A wheel's .data/ files (installed with ../../../share/..., ../../../include/...) and
    its scripts are legitimately outside site-packages but inside the prefix."""
    env = venvs.create()
    wheel = build_wheel(wheel_dir, "withdata", "1.0", {
        "withdata/__init__.py": "",
        "withdata-1.0.data/data/share/withdata/notes.txt": "notes\n",
        "withdata-1.0.data/headers/withdata.h": "#define X 1\n",
    }, scripts={"withdata-cli": "withdata:main"})
    venvs.uv_install(env, wheel)
    assert (env.path / "share" / "withdata" / "notes.txt").is_file()
    for mode in ("size", "hash"):
        result = _verify(env, mode)
        assert result.issues == [], result.issues
    record = (env.site_packages() / "withdata-1.0.dist-info" / "RECORD").read_text()
    assert "../../../share/withdata/notes.txt" in record.replace("\\", "/")


def test_a_symlink_to_a_regular_file_elsewhere_is_checked_like_the_file(
        torch_env: Venv, tmp_path: Path) -> None:
    """What ``uv --link-mode symlink`` makes: the files live in uv's cache."""
    target = torch_env.site_packages() / "torch" / "version.py"
    elsewhere = tmp_path / "cache" / "version.py"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(elsewhere)
    for mode in ("size", "hash"):
        assert _verify(torch_env, mode).issues == []
    elsewhere.write_text("__version__ = 'patched'\n")
    assert ("torch", "torch/version.py", "size") in _problems(_verify(torch_env, "hash"))


@pytest.mark.parametrize(("site", "tree"), [
    ("/v/lib/python3.12/site-packages", "/v"),
    ("/v/lib64/python3.12/site-packages", "/v"),
    ("/usr/lib/python3/dist-packages", "/usr"),
    ("/usr/local/lib/python3.11/dist-packages", "/usr/local"),
    ("/opt/pypy/lib/pypy3.10/site-packages", "/opt/pypy"),
    ("/home/u/.local/lib/python3.11/site-packages/", "/home/u/.local"),
    ("/srv/target", "/srv"),
])
def test_install_tree_is_the_prefix_of_the_site_folder(site: str, tree: str) -> None:
    assert integrity.install_tree(site) == tree


def test_special_files_are_explained_in_the_diff(torch_env: Venv) -> None:
    """The new problems reach ``envguard diff``: named in the evidence, explained."""
    from envguard.changes import diff
    from envguard.explain import explain
    from envguard.probe import SnapshotOptions, collect

    options = SnapshotOptions(python=str(torch_env.python), verify="size",
                              use_project_config=False)
    good = collect(options)
    target = torch_env.site_packages() / "torch" / "version.py"
    target.unlink()
    os.mkfifo(target)
    now = collect(options)
    findings = explain(good, now, diff(good, now))
    (finding,) = [f for f in findings if f.rule == "installed-files-modified"]
    assert "torch: torch/version.py (not-a-regular-file)" in finding.evidence
    assert "FIFO" in finding.explanation and "never ends" in finding.explanation


# -- the stat pass shared with forked workers (statahead.StatQueue) ----------------------------

def _broken(env: Venv) -> None:
    """A size change, a missing file and a same-size edit after the install."""
    site = env.site_packages()
    patched = site / "torch" / "fx" / "_symbolic_trace.py"
    patched.write_text(patched.read_text() + "# patched\n")
    (site / "torch" / "version.py").unlink()
    init = site / "torch" / "__init__.py"
    later = os.stat(init).st_mtime + 60
    os.utime(init, (later, later))


def _serial(env: Venv, monkeypatch: pytest.MonkeyPatch) -> integrity.Integrity:
    with monkeypatch.context() as m:
        m.setattr(statahead, "usable_cpus", lambda: 1)
        return _verify(env, "size")


def _workers(pending: integrity.PendingCheck) -> list[Forked]:
    assert pending.queue is not None
    return pending.queue.workers


@pytest.mark.usefixtures("fork_always")
def test_forked_stat_pass_finds_what_the_serial_one_finds(
        torch_env: Venv, monkeypatch: pytest.MonkeyPatch) -> None:
    _broken(torch_env)
    found, _ = distributions.scan([str(torch_env.site_packages())])
    pending = integrity.begin(found, "size")
    assert len(_workers(pending)) >= 2  # up to min(4 - 1 cores, 7) workers
    forked = pending.finish()
    serial = _serial(torch_env, monkeypatch)
    assert forked == serial
    assert {("torch", "torch/fx/_symbolic_trace.py", "size"),
            ("torch", "torch/version.py", "missing"),
            ("torch", "torch/__init__.py", "modified-after-install")} <= _problems(forked)


@pytest.mark.usefixtures("fork_always")
def test_units_a_failed_worker_took_are_checked_in_the_parent(
        torch_env: Venv, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers that raise, that die after taking a batch, and that answer garbage: the
    parent checks every unit nobody answered for, so nothing is lost."""
    _broken(torch_env)
    serial = _serial(torch_env, monkeypatch)

    def raising(self: StatQueue) -> object:
        raise RuntimeError("worker failed")

    def dying(self: StatQueue) -> object:
        self._take()  # a batch taken, never answered
        os._exit(3)

    def garbage(self: StatQueue) -> object:
        while self._take() is not None:
            pass
        return [(0, ("not", "a", "result")), "junk", (10**9, None)]

    found, _ = distributions.scan([str(torch_env.site_packages())])
    for broken in (raising, dying, garbage):
        monkeypatch.setattr(StatQueue, "_work", broken)  # the workers inherit it
        pending = integrity.begin(found, "size")
        assert _workers(pending)
        assert pending.finish() == serial, broken.__name__


@pytest.mark.usefixtures("small_shares")
def test_no_fork_while_another_thread_runs_and_none_for_hashing(torch_env: Venv) -> None:
    found, _ = distributions.scan([str(torch_env.site_packages())])
    assert integrity.begin(found, "hash").queue is None
    release = threading.Event()
    waiter = threading.Thread(target=release.wait)
    waiter.start()
    try:
        assert integrity.begin(found, "size").queue is None
    finally:
        release.set()
        waiter.join()


@pytest.mark.usefixtures("fork_always")
def test_an_interrupt_in_the_parent_kills_and_reaps_the_workers(
        torch_env: Venv, monkeypatch: pytest.MonkeyPatch) -> None:
    found, _ = distributions.scan([str(torch_env.site_packages())])

    def stuck(self: StatQueue) -> object:  # a worker on a hung file system
        time.sleep(120)
        return []

    def interrupted(self: Forked) -> object:  # Ctrl-C while the parent waits for it
        raise KeyboardInterrupt

    monkeypatch.setattr(StatQueue, "_work", stuck)
    pending = integrity.begin(found, "size")
    monkeypatch.setattr(Forked, "result", interrupted)
    pids = [worker._pid for worker in _workers(pending)]
    assert pids
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        pending.finish()
    assert time.monotonic() - started < 60  # killed, not waited for
    for pid in pids:  # reaped: no zombie left behind
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_forked_returns_plain_data_or_none_on_failure() -> None:
    assert Forked(lambda: [("a", 1, None)]).result() == [("a", 1, None)]
    assert Forked(lambda: 1 / 0).result() is None
    assert Forked(lambda: object()).result() is None  # not marshal-able
