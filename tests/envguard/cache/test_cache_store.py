"""``envguard cache save|restore|status`` on real folders, real tars and real venvs.

The builds come from fake torch wheels installed with uv into real venvs (two
builds of 2.11.0+cu128 that differ only in their git commit), so compat keys are
real. GPU names cannot exist on this machine (no GPU, no nvidia-smi): every key
here is computed without GPUs, which is what ``envguard snapshot`` does on a
CPU-only host too. Every command runs as a subprocess, as a user runs it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from envguard.exitcodes import ExitCode
from envguard.probe import caches
from tests.conftest import is_root
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files

GIT_A = "a1" * 20
GIT_B = "b2" * 20


@dataclass
class Builds:
    a: Venv
    b: Venv


@pytest.fixture(scope="module")
def builds(module_venvs: VenvFactory) -> Builds:
    factory = module_venvs
    root = factory.root.parent
    wheel_a = build_wheel(root / "wheels", "torch", "2.11.0+cu128",
                          fake_torch_files(git_version=GIT_A))
    # The same version rebuilt from another commit: kept out of the --find-links folder.
    wheel_b = build_wheel(root / "rebuilt", "torch", "2.11.0+cu128",
                          fake_torch_files(git_version=GIT_B))
    a, b = factory.create("a"), factory.create("b")
    factory.uv_install(a, wheel_a)
    factory.uv_install(b, wheel_b)
    return Builds(a=a, b=b)


def envguard(*args: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "COLUMNS": "200"})


def inductor() -> Path:
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def triton() -> Path:
    return Path(os.environ["TRITON_CACHE_DIR"])


def store() -> Path:
    return Path(os.environ["ENVGUARD_CACHE_DIR"]) / "compile-caches"


def tree(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under root: (type, mode, sha256 of a file or target of a link). The
    provenance marker at the top is not cache content (save and restore write it; the
    marker tests below check it)."""
    out: dict[str, tuple[str, int, str]] = {".": ("dir", stat.S_IMODE(root.stat().st_mode), "")}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            if path == root / caches.MARKER_NAME:
                continue
            rel = str(path.relative_to(root))
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), "")
            elif not stat.S_ISREG(st.st_mode):
                out[rel] = ("special", 0, "")  # fifo, socket: never opened
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode),
                            hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def make_cache(root: Path, *, tag: str = "") -> None:
    """An inductor-like cache: nested hash folders, text and binary files, odd modes."""
    (root / "fxgraph" / "ab").mkdir(parents=True)
    (root / "fxgraph" / "ab" / f"fabcdef{tag}").write_bytes(os.urandom(3000))
    kernels = root / "triton" / "0" / "KEHASH"
    kernels.mkdir(parents=True)
    for i in range(20):
        (kernels / f"triton_poi_{i}{tag}.py").write_text(f"# kernel {i} {tag}\n" * 40)
        (kernels / f"triton_poi_{i}.cubin").write_bytes(os.urandom(500 + i))
    so = root / "cxx" / "lib.so"
    so.parent.mkdir()
    so.write_bytes(b"\x7fELF" + os.urandom(100))
    so.chmod(0o755)
    (root / "cxx" / "private.json").write_text("{}")
    (root / "cxx" / "private.json").chmod(0o600)
    (root / "aotautograd").mkdir(mode=0o700)
    (root / "aotautograd" / "entry").write_bytes(b"x")
    (root / "aotautograd").chmod(0o700)
    os.link(kernels / "triton_poi_0.cubin", root / "cxx" / "hardlinked.cubin")
    os.symlink("triton/0/KEHASH", root / "latest")  # in-tree, relative: kept


def lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def only_archive() -> Path:
    found = [p for p in store().iterdir()]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("gzip", [False, True], ids=["tar", "gzip"])
def test_save_delete_restore_gives_back_the_same_tree(builds: Builds, gzip: bool) -> None:
    make_cache(inductor())
    (triton() / "kernels").mkdir(parents=True)
    (triton() / "kernels" / "k.cubin").write_bytes(os.urandom(700))
    before_inductor, before_triton = tree(inductor()), tree(triton())
    saved = envguard("cache", "save", "--python", builds.a.path, *(["--gzip"] if gzip else []))
    assert saved.returncode == ExitCode.OK, saved.stderr
    folder = only_archive()
    assert not [p for p in store().iterdir() if p.name.startswith(".")]  # no .partial left
    manifest = json.loads((folder / "manifest.json").read_text())
    snap = json.loads(envguard("snapshot", "--json", "-q", "--no-cache-marker",
                               "--python", builds.a.path).stdout)
    assert manifest["build"]["compat_key"] == snap["torch"]["compat_key"]
    assert folder.name.startswith(snap["torch"]["compat_key"][len("sha256:"):][:12] + "-")
    assert manifest["build"]["torch_git_version"] == GIT_A
    assert manifest["build"]["host"] == socket.gethostname()
    parts = {p["kind"]: p for p in manifest["archives"]}
    assert set(parts) == {"inductor", "triton"}
    for part in parts.values():
        data = (folder / part["file"]).read_bytes()
        assert part["sha256"] == hashlib.sha256(data).hexdigest()
        assert part["tar_bytes"] == len(data)
    assert parts["inductor"]["files"] == sum(1 for v in before_inductor.values()
                                             if v[0] == "file")
    shutil.rmtree(inductor())  # the incident: /tmp/torchinductor_root deleted
    shutil.rmtree(triton())
    restored = envguard("cache", "restore", "--python", builds.a.path)
    assert restored.returncode == ExitCode.OK, restored.stderr
    assert tree(inductor()) == before_inductor
    assert tree(triton()) == before_triton
    assert os.stat(inductor() / "cxx" / "hardlinked.cubin").st_nlink == 2
    assert "kept at" not in restored.stdout  # there was nothing to keep
    assert not list(inductor().parent.glob("*.restoring-*"))


def test_restore_keeps_the_cache_it_replaces(builds: Builds, tmp_path: Path) -> None:
    make_cache(inductor())
    saved_tree = tree(inductor())
    assert envguard("cache", "save", "mine", "--python", builds.a.path).returncode == 0
    shutil.rmtree(inductor())
    make_cache(inductor(), tag="-newer")
    newer = tree(inductor())
    proc = envguard("cache", "restore", "--python", builds.a.path)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert tree(inductor()) == saved_tree
    kept = list(inductor().parent.glob(f"{inductor().name}.before-restore-*"))
    assert len(kept) == 1 and tree(kept[0]) == newer
    assert str(kept[0]) in proc.stdout
    # --into: somewhere else, leaving the live cache alone.
    into = envguard("cache", "restore", "mine", "--python", builds.a.path,
                    "--into", tmp_path / "elsewhere")
    assert into.returncode == ExitCode.OK, into.stderr
    assert tree(tmp_path / "elsewhere" / "inductor") == saved_tree


def test_a_cache_reached_through_a_symlink_is_restored_behind_it(builds: Builds,
                                                                 tmp_path: Path) -> None:
    real = tmp_path / "scratch" / "inductor"
    make_cache(real)
    inductor().parent.mkdir(parents=True, exist_ok=True)
    os.symlink(real, inductor())
    saved_tree = tree(real)
    assert envguard("cache", "save", "linked", "--python", builds.a.path).returncode == 0
    shutil.rmtree(real)
    real.mkdir()
    proc = envguard("cache", "restore", "--python", builds.a.path)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert inductor().is_symlink() and os.readlink(inductor()) == str(real)
    assert tree(real) == saved_tree
    assert "kept at" not in proc.stdout  # the empty folder it replaced is not kept


def test_stale_archive_is_refused_naming_both_builds_unless_forced(builds: Builds) -> None:
    make_cache(inductor())
    saved_tree = tree(inductor())
    assert envguard("cache", "save", "from-a", "--python", builds.a.path).returncode == 0
    shutil.rmtree(inductor())
    refused = envguard("cache", "restore", "from-a", "--python", builds.b.path)
    assert refused.returncode == ExitCode.REFUSED == 3
    assert len(lines(refused.stderr)) == 1, refused.stderr
    assert GIT_A[:12] in refused.stderr and GIT_B[:12] in refused.stderr
    assert "torch 2.11.0+cu128" in refused.stderr and "--force" in refused.stderr
    assert not inductor().exists()
    # Unnamed: the newest archive of this build; there is none, so also refused.
    unnamed = envguard("cache", "restore", "--python", builds.b.path)
    assert unnamed.returncode == 3 and len(lines(unnamed.stderr)) == 1
    assert "no archive in the store was saved under this build" in unnamed.stderr
    status = json.loads(envguard("cache", "status", "--format", "json",
                                 "--python", builds.b.path).stdout)
    assert [a["matches"] for a in status["archives"]] == [False]
    md = envguard("cache", "status", "--format", "markdown", "--python", builds.b.path)
    assert md.returncode == 0, md.stderr
    assert "| kind | state | files | size | fs | path |" in md.stdout
    assert "| from-a | no |" in md.stdout and "compat key `" in md.stdout
    forced = envguard("cache", "restore", "from-a", "--force", "--python", builds.b.path)
    assert forced.returncode == ExitCode.OK, forced.stderr
    assert "--force" in forced.stderr and GIT_A[:12] in forced.stderr
    assert tree(inductor()) == saved_tree


def _writable_tmpfs() -> str | None:
    for point, fstype in caches.read_mounts():
        if fstype == "tmpfs" and os.access(point, os.W_OK) and os.path.isdir(point):
            return point
    return None


@pytest.fixture
def on_tmpfs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    point = _writable_tmpfs()
    if point is None:
        pytest.skip("no writable tmpfs mount in /proc/self/mounts")
    folder = Path(tempfile.mkdtemp(prefix="envguard-test-", dir=point))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder / "inductor"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_status_flags_a_cache_on_tmpfs(builds: Builds, on_tmpfs: Path) -> None:
    make_cache(inductor())
    proc = envguard("cache", "status", "--format", "json", "--python", builds.a.path)
    assert proc.returncode == ExitCode.OK, proc.stderr
    rows = {c["kind"]: c for c in json.loads(proc.stdout)["caches"]}
    assert rows["inductor"]["filesystem"] == "tmpfs" and rows["inductor"]["tmpfs"] is True
    assert rows["triton"]["tmpfs"] is False
    text = envguard("cache", "status", "--python", builds.a.path)
    assert "inductor cache is on tmpfs: lost at reboot" in text.stdout


def _status(python: Path) -> dict[str, dict[str, object]]:
    proc = envguard("cache", "status", "--format", "json", "--python", python)
    assert proc.returncode == ExitCode.OK, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "envguard.cache-status/1"
    return {c["kind"]: c for c in doc["caches"]}


def _marker_keys(root: Path) -> list[str]:
    return [b["compat_key"] for b in json.loads((root / caches.MARKER_NAME).read_text())["builds"]]


def _key(python: Path) -> str:
    snap = json.loads(envguard("snapshot", "--json", "-q", "--python", python).stdout)
    key = snap["torch"]["compat_key"]
    assert isinstance(key, str)
    return key


def test_status_says_valid_seen_stale_unknown_empty_missing(builds: Builds) -> None:
    make_cache(inductor())
    triton().mkdir()
    rows = _status(builds.a.path)
    assert (rows["inductor"]["state"], rows["triton"]["state"], rows["cuda"]["state"]) == (
        "unknown", "empty", "missing")
    assert not (inductor() / caches.MARKER_NAME).exists()  # status never writes the marker
    # A snapshot of build A writes nothing into the cache: it only remembers, in envguard's
    # own state, that it saw the cache under A. That is "seen", not "valid".
    before = tree(inductor())
    proc = envguard("snapshot", "-q", "--json", "--python", builds.a.path)
    assert proc.returncode == 0, proc.stderr
    assert not (inductor() / caches.MARKER_NAME).exists()
    assert sorted(os.listdir(inductor())) == sorted(p for p in before if "/" not in p
                                                    and p != ".")
    sightings = json.loads((Path(os.environ["ENVGUARD_CACHE_DIR"])
                            / "cache-sightings.json").read_text())
    assert list(sightings["caches"]) == [os.path.realpath(inductor())]
    assert _status(builds.a.path)["inductor"]["state"] == "seen"
    assert _status(builds.b.path)["inductor"]["state"] == "unknown"  # seen under A only
    # --no-cache-marker is accepted and changes nothing.
    assert envguard("snapshot", "-q", "--json", "--no-cache-marker", "--python",
                    builds.a.path).returncode == 0
    assert not (inductor() / caches.MARKER_NAME).exists()
    # envguard cache mark: the user says A filled it. Valid for A, stale for B.
    marked = envguard("cache", "mark", "--python", builds.a.path)
    assert marked.returncode == ExitCode.OK, marked.stderr
    assert lines(marked.stdout) == [f"inductor: {inductor()}: marked under torch 2.11.0+cu128"]
    assert _marker_keys(inductor()) == [_key(builds.a.path)]
    assert _status(builds.a.path)["inductor"]["state"] == "valid"
    stale = _status(builds.b.path)["inductor"]
    assert stale["state"] == "stale"
    assert stale["other_builds"] == [f"torch 2.11.0+cu128 (git {GIT_A[:12]})"]
    # A snapshot of B does not make it B's; marking under B does, with A named as another.
    assert envguard("snapshot", "-q", "--json", "--python", builds.b.path).returncode == 0
    assert _status(builds.b.path)["inductor"]["state"] == "stale"
    assert envguard("cache", "mark", "--python", builds.b.path).returncode == 0
    both = _status(builds.b.path)["inductor"]
    assert both["state"] == "valid" and both["other_builds"] == stale["other_builds"]
    again = envguard("cache", "mark", "--python", builds.b.path)
    assert "already marked" in again.stdout


def test_mark_with_nothing_to_mark_is_one_line_exit_2(builds: Builds) -> None:
    proc = envguard("cache", "mark", "--python", builds.a.path)
    assert proc.returncode == ExitCode.USAGE == 2
    assert len(lines(proc.stderr)) == 1 and "nothing to mark" in proc.stderr


def test_save_and_restore_record_provenance(builds: Builds) -> None:
    make_cache(inductor())
    assert _status(builds.a.path)["inductor"]["state"] == "unknown"
    saved = envguard("cache", "save", "a1", "--python", builds.a.path)
    assert saved.returncode == 0, saved.stderr
    # The archive is labelled with A, so the cache it was saved from now says A too.
    assert _marker_keys(inductor()) == [_key(builds.a.path)]
    assert _status(builds.a.path)["inductor"]["state"] == "valid"
    shutil.rmtree(inductor())
    assert envguard("cache", "restore", "a1", "--force", "--python",
                    builds.b.path).returncode == 0
    # Restored under B with --force: the marker names the archive's build, A, so the
    # restored cache is stale for B, not valid.
    assert _marker_keys(inductor()) == [_key(builds.a.path)]
    assert _status(builds.b.path)["inductor"]["state"] == "stale"
    # Saving a stale cache under B labels the archive B but leaves the marker alone.
    saved_b = envguard("cache", "save", "b1", "--python", builds.b.path)
    assert saved_b.returncode == 0 and "marker names only other builds" in saved_b.stderr
    assert _marker_keys(inductor()) == [_key(builds.a.path)]


def _rewrite(folder: Path, member_tar: bytes) -> None:
    """Replace the inductor tar of an archive and make the manifest agree with it."""
    (folder / "inductor.tar").write_bytes(member_tar)
    manifest = json.loads((folder / "manifest.json").read_text())
    for part in manifest["archives"]:
        if part["kind"] == "inductor":
            part["sha256"] = hashlib.sha256(member_tar).hexdigest()
            part["tar_bytes"] = len(member_tar)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _tar(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple[tarfile.TarInfo,
                                                                                bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info, b"evil\n"


def _save_and_break(builds: Builds) -> tuple[Path, dict[str, tuple[str, int, str]]]:
    make_cache(inductor())
    assert envguard("cache", "save", "good", "--python", builds.a.path).returncode == 0
    shutil.rmtree(inductor())
    make_cache(inductor(), tag="-live")  # the cache a bad archive must not disturb
    return store() / "good", tree(inductor())


def _nothing_touched(live: dict[str, tuple[str, int, str]]) -> None:
    assert tree(inductor()) == live
    leftovers = [p.name for p in inductor().parent.iterdir()
                 if ".restoring-" in p.name or ".before-restore-" in p.name]
    assert leftovers == []


def test_truncated_tar_is_refused_and_nothing_is_touched(builds: Builds) -> None:
    folder, live = _save_and_break(builds)
    tar = folder / "inductor.tar"
    tar.write_bytes(tar.read_bytes()[: tar.stat().st_size // 2])
    proc = envguard("cache", "restore", "good", "--python", builds.a.path)
    assert proc.returncode == ExitCode.USAGE
    assert len(lines(proc.stderr)) == 1 and "damaged" in proc.stderr, proc.stderr
    _nothing_touched(live)


@pytest.mark.parametrize(
    ("members", "needle"),
    [
        ([_member("../evil")], "'..'"),
        ([_member("/tmp/envguard-abs-evil")], "absolute"),
        ([_member("etc", tarfile.SYMTYPE, "/etc")], "symlink"),
        ([_member("up", tarfile.SYMTYPE, "../.."), _member("up/evil")], "symlink"),
        ([_member("here", tarfile.SYMTYPE, "."), _member("here/evil")], "below a symlink"),
        ([_member("pw", tarfile.LNKTYPE, "/etc/passwd")], "hard link"),
        ([_member("null", tarfile.CHRTYPE)], "special file"),
    ],
    ids=["dotdot", "absolute", "symlink-etc", "symlink-up", "through-symlink", "hardlink",
         "device"])
def test_malicious_members_are_refused_and_nothing_is_written_outside(
        builds: Builds, members: list[tuple[tarfile.TarInfo, bytes]], needle: str) -> None:
    folder, live = _save_and_break(builds)
    _rewrite(folder, _tar(*members))
    outside = [inductor().parent / "evil", Path("/tmp/envguard-abs-evil"),
               inductor().parent.parent / "evil"]
    proc = envguard("cache", "restore", "good", "--python", builds.a.path)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert len(lines(proc.stderr)) == 1 and needle in proc.stderr, proc.stderr
    assert not any(p.exists() for p in outside)
    _nothing_touched(live)


@pytest.mark.parametrize(
    ("manifest", "needle"),
    [
        ('{"name": "wheel", "version": 3, "files": []}', "not an envguard cache archive"),
        ('{"schema": "envguard.cache-archive/2"}', "upgrade envguard"),
        ('{"schema": "envguard.cache-archive/1", "name": 3}', "malformed"),
        ("[1, 2", "not JSON"),
    ],
    ids=["foreign", "future", "malformed", "not-json"])
def test_unusable_manifest_is_a_one_line_error(builds: Builds, manifest: str,
                                               needle: str) -> None:
    (store() / "odd").mkdir(parents=True)
    (store() / "odd" / "manifest.json").write_text(manifest)
    proc = envguard("cache", "restore", "odd", "--python", builds.a.path)
    assert proc.returncode == ExitCode.USAGE
    assert len(lines(proc.stderr)) == 1 and needle in proc.stderr, proc.stderr
    # status lists it as unusable and still succeeds
    status = envguard("cache", "status", "--format", "json", "--python", builds.a.path)
    assert status.returncode == ExitCode.OK, status.stderr
    (row,) = json.loads(status.stdout)["archives"]
    assert row["manifest"] is None and needle in row["problem"]


def test_store_that_cannot_be_read_is_a_one_line_error(builds: Builds, tmp_path: Path) -> None:
    not_a_folder = tmp_path / "store-file"
    not_a_folder.write_text("")
    for action in ("status", "restore"):
        proc = envguard("cache", action, "--store", not_a_folder, "--python", builds.a.path)
        assert proc.returncode == ExitCode.USAGE, proc.stderr
        assert len(lines(proc.stderr)) == 1 and "cannot read" in proc.stderr
    empty = envguard("cache", "restore", "--store", tmp_path / "none", "--python",
                     builds.a.path)
    assert empty.returncode == ExitCode.USAGE and "no cache archives" in empty.stderr
    if is_root():
        return  # root reads a mode-000 folder anyway
    locked = tmp_path / "locked"
    locked.mkdir(mode=0)
    try:
        proc = envguard("cache", "status", "--store", locked, "--python", builds.a.path)
        assert proc.returncode == ExitCode.USAGE and "cannot read" in proc.stderr
    finally:
        locked.chmod(0o700)


def test_symlink_loops_and_special_files_do_not_hang_a_save(builds: Builds) -> None:
    make_cache(inductor())
    os.symlink("loop2", inductor() / "loop1")
    os.symlink("loop1", inductor() / "loop2")
    os.symlink(".", inductor() / "fxgraph" / "self")
    os.symlink("..", inductor() / "fxgraph" / "parent")  # leaves its folder: left out
    os.symlink("/etc", inductor() / "etc")  # out of the cache: left out
    os.mkfifo(inductor() / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    has_socket = True
    try:
        sock.bind(str(inductor() / "s"))
    except OSError:  # path too long for AF_UNIX: the fifo covers special files
        has_socket = False
    try:
        before = tree(inductor())
        proc = envguard("cache", "save", "--python", builds.a.path, timeout=60)
    finally:
        sock.close()
    assert proc.returncode == ExitCode.OK, proc.stderr
    skipped = json.loads((only_archive() / "manifest.json").read_text())["archives"][0]["skipped"]
    expect = {"fxgraph/parent", "etc", "fifo"} | ({"s"} if has_socket else set())
    assert {s.split(" ")[0] for s in skipped} == expect
    assert "left out" in proc.stderr
    shutil.rmtree(inductor())
    assert envguard("cache", "restore", "--python", builds.a.path).returncode == 0
    restored = tree(inductor())
    assert {k: v for k, v in before.items() if k not in expect} == restored
    assert restored["loop1"] == ("link", 0, "loop2")


def test_nothing_to_save_and_bad_names(builds: Builds) -> None:
    proc = envguard("cache", "save", "--python", builds.a.path)
    assert proc.returncode == ExitCode.USAGE and "nothing to save" in proc.stderr
    inductor().mkdir()
    assert "nothing to save" in envguard("cache", "save", "--python", builds.a.path).stderr
    make_cache(inductor())
    for bad in ("../x", ".hidden", "a/b"):
        proc = envguard("cache", "save", bad, "--python", builds.a.path)
        assert proc.returncode == ExitCode.USAGE and "invalid archive name" in proc.stderr
    assert envguard("cache", "save", "twice", "--python", builds.a.path).returncode == 0
    again = envguard("cache", "save", "twice", "--python", builds.a.path)
    assert again.returncode == ExitCode.USAGE and "already exists" in again.stderr


def test_save_from_a_snapshot_records_it(builds: Builds, tmp_path: Path) -> None:
    make_cache(inductor())
    snap_path = tmp_path / "good.json"
    assert envguard("snapshot", "-q", "-o", snap_path, "--python", builds.b.path).returncode == 0
    snap = json.loads(snap_path.read_text())
    proc = envguard("cache", "save", "--from-snapshot", snap_path)
    assert proc.returncode == ExitCode.OK, proc.stderr
    manifest = json.loads((only_archive() / "manifest.json").read_text())
    assert manifest["snapshot"] == {"created_at": snap["created_at"], "file": str(snap_path)}
    assert manifest["build"]["compat_key"] == snap["torch"]["compat_key"]
    assert manifest["build"]["torch_git_version"] == GIT_B
    # The snapshot saw the cache under B but wrote nothing into it: seen, not valid.
    assert manifest["archives"][0]["state_at_save"] == "seen"


@pytest.mark.parametrize(
    "members",
    [[_member("../evil")], [_member("etc", tarfile.SYMTYPE, "/etc")],
     [_member("up", tarfile.SYMTYPE, "../.."), _member("up/evil")]],
    ids=["dotdot", "symlink-etc", "symlink-up"])
def test_extraction_filter_refuses_on_its_own(tmp_path: Path,
                                              members: list[tuple[tarfile.TarInfo, bytes]],
                                              ) -> None:
    """The second line of defence: tarfile's data filter, without envguard's own checks."""
    from envguard.cache import tar as cache_tar
    from envguard.errors import InputError

    tar = tmp_path / "inductor.tar"
    tar.write_bytes(_tar(*members))
    staging = tmp_path / "deep" / "cache.restoring-1"
    with pytest.raises(InputError, match="refused while extracting"):
        cache_tar.extract_into(tar, str(staging))
    assert not (tmp_path / "deep" / "evil").exists() and not (tmp_path / "evil").exists()


def test_swap_without_an_atomic_exchange_keeps_the_previous_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where renameat2(RENAME_EXCHANGE) is missing (macOS, some filesystems): two renames."""
    from envguard.cache import tar as cache_tar

    for exchange in (True, False):
        root = tmp_path / str(exchange)
        target, staging = root / "cache", root / "cache.restoring-1"
        make_cache(target, tag="-old")
        make_cache(staging, tag="-new")
        old, new = tree(target), tree(staging)
        if not exchange:
            monkeypatch.setattr(cache_tar, "_exchange", lambda a, b: False)
        kept = cache_tar.swap_into_place(str(staging), str(target), "20260101T000000Z")
        assert kept == str(root / "cache.before-restore-20260101T000000Z")
        assert tree(target) == new and tree(Path(kept)) == old
        assert not staging.exists()
    # An empty folder in the way is not worth keeping.
    empty, staging = tmp_path / "empty", tmp_path / "empty.restoring-1"
    empty.mkdir()
    make_cache(staging)
    assert cache_tar.swap_into_place(str(staging), str(empty), "20260101T000000Z") is None
    assert (empty / "latest").is_symlink() and list(tmp_path.glob("empty.*")) == []
