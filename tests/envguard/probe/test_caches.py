"""Compile caches: where they are, what is in them, and which builds populated them."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import envguard
import envguard.cache
from envguard.cache import provenance
from envguard.errors import InputError
from envguard.model import CacheDir, ProbeIssue, TorchIdentity
from envguard.probe import caches, sightings
from tests.conftest import is_root

BUILD_A = TorchIdentity(present=True, version="2.11.0+cu128", git_version="a" * 40,
                        triton_version="3.5.0", compat_key="sha256:" + "a" * 64)
BUILD_B = TorchIdentity(present=True, version="2.11.0+cu130", git_version="b" * 40,
                        triton_version="3.5.1", compat_key="sha256:" + "b" * 64)
FACTS = {"home": "/home/alice", "tempdir": "/scratch/tmp", "user": "alice"}


def _env(root: Path) -> dict[str, str]:
    return {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
            "TRITON_CACHE_DIR": str(root / "triton"), "CUDA_CACHE_PATH": str(root / "nv")}


def _probe(root: Path, torch: TorchIdentity = BUILD_A, *, remember: bool = True,
           ) -> tuple[dict[str, CacheDir], list[ProbeIssue]]:
    found, issues = caches.probe(_env(root), FACTS, torch, remember=remember,
                                 state_root=root / "state", mounts=[])
    return {c.kind: c for c in found}, issues


def _write(path: Path, size: int, mtime: float | None = None) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return size


def test_locations_follow_the_variables_else_the_defaults_of_torch_triton_and_cuda() -> None:
    env = {"TORCHINDUCTOR_CACHE_DIR": "/fast/inductor", "TRITON_CACHE_DIR": "/fast/triton",
           "TRITON_HOME": "/ignored", "CUDA_CACHE_PATH": "/fast/nv"}
    assert caches.locations(env, FACTS) == [
        ("inductor", "/fast/inductor", "TORCHINDUCTOR_CACHE_DIR"),
        ("triton", "/fast/triton", "TRITON_CACHE_DIR"), ("cuda", "/fast/nv", "CUDA_CACHE_PATH")]
    assert caches.locations({}, FACTS) == [
        ("inductor", "/scratch/tmp/torchinductor_alice", "default"),
        ("triton", "/home/alice/.triton/cache", "default"),
        ("cuda", "/home/alice/.nv/ComputeCache", "default"),
    ]
    by_home = caches.locations({"TRITON_HOME": "/opt/th"}, FACTS)
    assert by_home[1] == ("triton", "/opt/th/.triton/cache", "TRITON_HOME")


def test_default_inductor_user_is_sanitized_like_torch() -> None:
    facts = {**FACTS, "user": 'CORP\\bob:x'}
    assert caches.locations({}, facts)[0][1] == "/scratch/tmp/torchinductor_CORP_bob_x"
    # No passwd entry: torch falls back to uid_<uid> (cache_dir_utils.default_cache_dir).
    nouser = caches.locations({}, {**FACTS, "user": None})[0][1]
    assert nouser == f"/scratch/tmp/torchinductor_uid_{os.getuid()}"


def test_relative_or_empty_inductor_variable_is_made_absolute_like_torch(
        clean_cwd: Path) -> None:
    assert caches.locations({"TORCHINDUCTOR_CACHE_DIR": "rel/c"}, FACTS)[0] == (
        "inductor", str(clean_cwd / "rel" / "c"), "TORCHINDUCTOR_CACHE_DIR")
    # torch uses the variable whenever it is set: an empty one means the current directory.
    assert caches.locations({"TORCHINDUCTOR_CACHE_DIR": ""}, FACTS)[0][1] == str(clean_cwd)


def test_walk_counts_sizes_entries_and_newest_mtime(tmp_path: Path) -> None:
    ind = tmp_path / "inductor"
    total = _write(ind / "fxgraph" / "ab" / "entry1", 100, 1_000_000)
    total += _write(ind / "fxgraph" / "cd" / "entry2", 200, 1_000_500)
    total += _write(ind / "aotautograd" / "x" / "entry", 30, 1_000_100)
    total += _write(ind / "triton" / "0" / "KEY" / "k.cubin", 4000, 1_700_000_000)
    total += _write(ind / "lockfile", 1, 999)
    _write(tmp_path / "nv" / "ptx" / "a.bin", 7)
    found, issues = _probe(tmp_path)
    assert issues == []
    inductor = found["inductor"]
    assert inductor.exists and inductor.source == "TORCHINDUCTOR_CACHE_DIR"
    assert inductor.total_bytes == total == 4331
    assert inductor.files == 5
    assert inductor.entries == {".": 1, "aotautograd": 1, "fxgraph": 2, "triton": 1}
    assert inductor.newest_mtime == 1_700_000_000
    assert not inductor.truncated
    assert (found["cuda"].files, found["cuda"].total_bytes) == (1, 7)
    assert not found["triton"].exists and found["triton"].files == 0


def test_walk_never_follows_symlinks(tmp_path: Path) -> None:
    ind = tmp_path / "inductor"
    size = _write(ind / "fxgraph" / "a" / "entry", 10)
    outside = tmp_path / "outside"
    _write(outside / "big.bin", 3 << 20)
    for i in range(50):
        _write(outside / "many" / f"f{i}", 1)
    os.symlink(ind, ind / "fxgraph" / "loop")  # a loop back to the cache root
    os.symlink("..", ind / "fxgraph" / "a" / "up")  # and one more, relative
    os.symlink(outside / "big.bin", ind / "fxgraph" / "big.bin")
    os.symlink(outside / "many", ind / "linked_dir")
    os.symlink(tmp_path / "missing", ind / "dangling")
    result: list[tuple[dict[str, CacheDir], list[ProbeIssue]]] = []
    worker = threading.Thread(target=lambda: result.append(_probe(tmp_path)), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "the walk hung on a symlink loop"
    found, issues = result[0]
    assert issues == []
    assert (found["inductor"].files, found["inductor"].total_bytes) == (1, size)
    assert found["inductor"].entries == {"fxgraph": 1}


def test_symlinked_cache_root_is_walked_and_dangling_root_is_reported(tmp_path: Path) -> None:
    real = tmp_path / "real-cache"
    _write(real / "fxgraph" / "e", 5)
    os.symlink(real, tmp_path / "inductor")
    os.symlink(tmp_path / "gone", tmp_path / "triton")
    found, issues = _probe(tmp_path, remember=False)
    assert found["inductor"].exists and found["inductor"].files == 1
    assert not found["triton"].exists
    assert [(i.section, i.path) for i in issues] == [("caches", str(tmp_path / "triton"))]
    assert "dangling" in issues[0].message


def test_walk_stops_at_the_entry_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(5):
        _write(tmp_path / "inductor" / "fxgraph" / f"e{i}", 1)
    monkeypatch.setattr(caches, "MAX_ENTRIES", 3)
    inductor = _probe(tmp_path, remember=False)[0]["inductor"]
    assert inductor.truncated and inductor.files == 3


# --- unreadable folders: root ignores permissions, so run the probe as nobody -------------------

_SNIPPET = """
import json, sys
from envguard.model import TorchIdentity
from envguard.cache import provenance
from envguard.errors import InputError
from envguard.probe import caches, sightings
env = {"TORCHINDUCTOR_CACHE_DIR": sys.argv[1], "TRITON_CACHE_DIR": sys.argv[1] + "/no",
       "CUDA_CACHE_PATH": sys.argv[1] + "/no"}
found, issues = caches.probe(env, {}, TorchIdentity(present=False), mounts=[])
print(json.dumps({"files": found[0].files, "issues": [[i.message, i.path] for i in issues]}))
"""


def _as_nobody() -> list[str]:
    nobody = pwd.getpwnam("nobody")
    if shutil.which("setpriv"):
        return ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
                "--clear-groups"]
    if shutil.which("runuser"):
        return ["runuser", "-u", "nobody", "--"]
    pytest.skip("running as root, and neither setpriv nor runuser can drop to 'nobody'")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder 'nobody' can reach (pytest's tmp_path sits under a 0700 folder)."""
    path = Path(tempfile.mkdtemp(prefix="envguard-test-"))
    path.chmod(0o755)
    yield path
    for folder, _, _ in os.walk(path):
        os.chmod(folder, 0o700)
    shutil.rmtree(path)


def _probe_unreadable(cache: Path) -> dict[str, object]:
    repo = str(Path(envguard.__file__).resolve().parent.parent)
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": repo, "PYTHONDONTWRITEBYTECODE": "1"}
    prefix, python = [], sys.executable
    if is_root():
        prefix = _as_nobody()
        # The venv's interpreter may live under root's 0700 home; find one nobody can run.
        candidates = [os.path.realpath(sys.executable), shutil.which("python3"), "/usr/bin/python3"]
        usable = [p for p in candidates if p and subprocess.run(
            [*prefix, p, "-c", "import envguard.probe.caches"], env=env, cwd="/",
            capture_output=True, timeout=60, check=False).returncode == 0]
        if not usable:
            pytest.skip("no Python that 'nobody' can run and import envguard with")
        python = usable[0]
    proc = subprocess.run([*prefix, python, "-c", _SNIPPET, str(cache)], env=env, cwd="/",
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr  # the probe itself must never raise
    return dict(json.loads(proc.stdout))


def test_unreadable_folder_is_an_issue_not_an_exception(shared_dir: Path) -> None:
    cache = shared_dir / "inductor"
    _write(cache / "fxgraph" / "ok", 3)
    locked = cache / "aotautograd"
    _write(locked / "hidden", 3)
    locked.chmod(0)
    result = _probe_unreadable(cache)
    assert result["files"] == 1
    issues = result["issues"]
    assert isinstance(issues, list) and len(issues) == 1
    [message, path] = issues[0]
    assert (path, message) == (str(locked), "cannot read folder: Permission denied")


def test_filesystem_of_picks_the_longest_matching_mount() -> None:
    mounts = [("/data/fast", "tmpfs"), ("/data", "xfs"), ("/", "ext4")]
    assert caches.filesystem_of("/data/fast/inductor", mounts) == "tmpfs"
    assert caches.filesystem_of("/data", mounts) == "xfs"
    assert caches.filesystem_of("/data/slow/x", mounts) == "xfs"
    assert caches.filesystem_of("/database/x", mounts) == "ext4"
    assert caches.filesystem_of("/x", [("/data", "xfs")]) is None


def test_read_mounts_unescapes_and_lets_the_last_mount_win(tmp_path: Path) -> None:
    table = tmp_path / "mounts"
    table.write_text("rootfs / rootfs rw 0 0\n"
                     "overlay / overlay rw,lowerdir=/l 0 0\n"
                     "server:/vol /mnt/my\\040disk nfs4 rw 0 0\n"
                     "short line\n")
    mounts = caches.read_mounts(str(table))
    assert mounts == [("/mnt/my disk", "nfs4"), ("/", "overlay")]
    assert caches.filesystem_of("/mnt/my disk/cache", mounts) == "nfs4"
    assert caches.read_mounts(str(tmp_path / "absent")) == []


def test_real_mount_table(tmp_path: Path) -> None:
    mounts = caches.read_mounts()
    if not mounts:
        pytest.skip("no /proc/self/mounts on this system")
    assert caches.filesystem_of(str(tmp_path), mounts) is not None
    if any(point == "/dev/shm" and fs == "tmpfs" for point, fs in mounts):
        assert caches.filesystem_of("/dev/shm", mounts) == "tmpfs"
        assert caches.filesystem_of("/dev/shm/torchinductor_x", mounts) == "tmpfs"
    # probe() reads the real table by default; a missing cache reports its parent's filesystem.
    found, _ = caches.probe(_env(tmp_path), FACTS, BUILD_A)
    assert all(c.filesystem == caches.filesystem_of(str(tmp_path), mounts) for c in found)


# --- the build marker ------------------------------------------------------------------------

def _marker(root: Path) -> list[dict[str, object]]:
    builds = json.loads((root / caches.MARKER_NAME).read_text())["builds"]
    assert isinstance(builds, list)
    return builds


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_a_snapshot_never_writes_into_a_cache_and_only_remembers_a_sighting(
        tmp_path: Path) -> None:
    _write(tmp_path / "inductor" / "fxgraph" / "e", 10)
    _write(tmp_path / "triton" / "KEY" / "k.cubin", 10)
    _write(tmp_path / "nv" / "ptx", 10)
    before = {kind: _tree(tmp_path / kind) for kind in ("inductor", "triton", "nv")}
    first, issues = _probe(tmp_path)
    assert issues == []
    for kind in ("inductor", "triton"):
        assert (first[kind].marker, first[kind].populated_under) == ("none", [])
    assert {kind: _tree(tmp_path / kind) for kind in before} == before
    # The sighting is envguard's own state, keyed by the cache's real path.
    state = sightings.load(tmp_path / "state")
    assert set(state) == {os.path.realpath(tmp_path / k) for k in ("inductor", "triton")}
    assert sightings.seen_under(state, str(tmp_path / "inductor"), BUILD_A.compat_key)
    assert not sightings.seen_under(state, str(tmp_path / "inductor"), BUILD_B.compat_key)
    written = (tmp_path / "state" / sightings.FILE_NAME).stat().st_mtime_ns
    _probe(tmp_path)  # nothing new: the state file is not rewritten
    assert (tmp_path / "state" / sightings.FILE_NAME).stat().st_mtime_ns == written
    _probe(tmp_path, BUILD_B)
    state = sightings.load(tmp_path / "state")
    assert [b["compat_key"] for b in state[os.path.realpath(tmp_path / "inductor")]] == [
        BUILD_A.compat_key, BUILD_B.compat_key]
    assert {kind: _tree(tmp_path / kind) for kind in before} == before


def test_no_sighting_when_disabled_empty_or_without_torch(tmp_path: Path) -> None:
    _write(tmp_path / "inductor" / "fxgraph" / "e", 10)
    (tmp_path / "triton").mkdir()
    _probe(tmp_path, remember=False)
    assert sightings.load(tmp_path / "state") == {}
    _probe(tmp_path, TorchIdentity(present=False))  # no torch, no compat key
    assert sightings.load(tmp_path / "state") == {}
    _probe(tmp_path)  # the empty triton cache was seen holding nothing: not remembered
    assert set(sightings.load(tmp_path / "state")) == {os.path.realpath(tmp_path / "inductor")}


@pytest.mark.parametrize("text", ["{not json", "[]", '{"caches": 3}', '{"caches": {"/x": 5}}',
                                  "\udcff"])
def test_corrupt_sightings_are_treated_as_empty_and_replaced(tmp_path: Path, text: str) -> None:
    _write(tmp_path / "inductor" / "fxgraph" / "e", 10)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / sightings.FILE_NAME).write_bytes(text.encode("utf-8",
                                                                       "surrogateescape"))
    assert sightings.load(tmp_path / "state") == {}
    _, issues = _probe(tmp_path)
    assert issues == []
    assert set(sightings.load(tmp_path / "state")) == {os.path.realpath(tmp_path / "inductor")}


def test_unwritable_state_does_not_fail_the_probe(tmp_path: Path) -> None:
    _write(tmp_path / "inductor" / "fxgraph" / "e", 10)
    (tmp_path / "state").write_text("a file where the folder should be")
    found, issues = _probe(tmp_path)
    assert issues == [] and found["inductor"].files == 1


def test_mark_records_the_builds_that_filled_a_cache(tmp_path: Path) -> None:
    _write(tmp_path / "inductor" / "fxgraph" / "e", 10)
    assert provenance.mark_folder(tmp_path / "inductor",
                                  provenance.stamp_of(BUILD_A)) == "created"
    found, _ = _probe(tmp_path)
    inductor = found["inductor"]
    assert inductor.marker == "seen"  # the marker names the current build
    assert [s.compat_key for s in inductor.populated_under] == [BUILD_A.compat_key]
    stamp = inductor.populated_under[0]
    assert (stamp.torch_version, stamp.torch_git_version, stamp.triton_version) == (
        "2.11.0+cu128", "a" * 40, "3.5.0")
    assert stamp.first_seen and stamp.first_seen.endswith("Z")
    assert (inductor.files, inductor.total_bytes) == (1, 10)  # the marker is not an entry
    other, _ = _probe(tmp_path, BUILD_B)
    assert other["inductor"].marker == "none"
    assert [s.torch_version for s in other["inductor"].populated_under] == ["2.11.0+cu128"]
    assert provenance.mark_folder(tmp_path / "inductor",
                                  provenance.stamp_of(BUILD_B)) == "added"
    assert provenance.mark_folder(tmp_path / "inductor",
                                  provenance.stamp_of(BUILD_B)) == "present"
    assert [b["compat_key"] for b in _marker(tmp_path / "inductor")] == [
        BUILD_A.compat_key, BUILD_B.compat_key]


def test_mark_for_a_trainer_takes_the_folder_and_the_snapshots_build(tmp_path: Path) -> None:
    _write(tmp_path / "inductor" / "fxgraph" / "e", 10)
    done = envguard.cache.mark(tmp_path / "inductor", torch=BUILD_A)
    assert [(m.path, m.result) for m in done] == [(str(tmp_path / "inductor"), "created")]
    with pytest.raises(InputError, match="torch is not installed"):
        envguard.cache.mark(tmp_path / "inductor", torch=TorchIdentity(present=False))
    with pytest.raises(InputError, match="not a compile-cache folder"):
        envguard.cache.mark(tmp_path / "absent", torch=BUILD_A)


@pytest.mark.parametrize("text", [
    "{not json", "", "[1, 2]", '{"builds": 5}', '{"builds": null}', '{"builds": "ab"}',
    '{"builds": [{"compat_key": 3}, "x", null]}', "\udcff",
])
def test_corrupt_marker_is_tolerated(tmp_path: Path, text: str) -> None:
    _write(tmp_path / "inductor" / "fxgraph" / "e", 10)
    (tmp_path / "inductor" / caches.MARKER_NAME).write_bytes(text.encode("utf-8",
                                                                        "surrogateescape"))
    found, issues = _probe(tmp_path)
    assert issues == []
    assert (found["inductor"].marker, found["inductor"].populated_under) == ("none", [])
    assert provenance.mark_folder(tmp_path / "inductor",
                                  provenance.stamp_of(BUILD_A)) == "created"
    assert [b["compat_key"] for b in _marker(tmp_path / "inductor")] == [BUILD_A.compat_key]
