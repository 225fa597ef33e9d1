"""envguard's own state against a hostile folder: planted symlinks, shared bytecode and memo
folders, temporaries a ``kill -9`` left, and cache archives that hang or explode.

Everything runs for real: envguard as a subprocess of the envguard this test imported
(``PYTHONPATH``), real uv venvs from tiny wheels, real symlinks, FIFOs and tars. A planted
link points at a "victim" file (or at where one would be made): after the command the
victim has its content and mode, or still does not exist, and envguard said one line.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import os
import py_compile
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

import envguard
from envguard.exitcodes import ExitCode
from tests.envguard.cache.test_cache_store import (
    Builds,
    _rewrite,
    inductor,
    make_cache,
    store,
    tree,
)
from tests.envguard.cache.test_cache_store import builds as builds  # the module's fixture
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files

SRC = Path(envguard.__file__).resolve().parents[1]
"""The folder holding the envguard under test (the subprocesses import the same one)."""
VICTIM_TEXT = "precious, not envguard's\n"
DEMO_MAIN = "import sys\n\ndef main():\n    return int(sys.argv[1]) if sys.argv[1:] else 0\n"
OLD = time.time() - 3 * 3600
"""Older than any write takes: a temporary this old was left by a killed process."""


def envguard_cli(*args: str | Path, cwd: Path, extra: dict[str, str] | None = None,
                 timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ENVGUARD_VERIFIED"}
    env.update({"PYTHONPATH": str(SRC), "COLUMNS": "200", **(extra or {})})
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


@dataclasses.dataclass(frozen=True)
class Victim:
    """A file a planted link points at: it must keep its content and mode."""

    path: Path

    @classmethod
    def make(cls, folder: Path) -> Victim:
        path = folder / "victim.txt"
        path.write_text(VICTIM_TEXT)
        path.chmod(0o644)
        return cls(path)

    def untouched(self) -> bool:
        st = self.path.lstat()
        return stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644 \
            and self.path.read_text() == VICTIM_TEXT


@pytest.fixture(scope="module")
def good(module_venvs: VenvFactory) -> Venv:
    factory = module_venvs
    wheels = factory.wheels
    torch = build_wheel(wheels, "torch", "2.11.0+cu128", fake_torch_files())
    demo = build_wheel(wheels, "demo-train", "1.0", {"demo_train/__init__.py": DEMO_MAIN},
                       requires=("torch",), scripts={"demo-train": "demo_train:main"})
    env = factory.create("good")
    factory.uv_install(env, torch, demo)
    return env


@pytest.fixture
def project(tmp_path: Path) -> Path:
    project = (tmp_path / "project").resolve()
    (project / "lockfiles").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "demo-project"\nversion = "0"\n')
    return project


def lock(project: Path, env: Venv) -> subprocess.CompletedProcess[str]:
    return envguard_cli("lock", "demo-train", "--python", env.python, cwd=project)


def run(project: Path, env: Venv, code: int = 0) -> subprocess.CompletedProcess[str]:
    return envguard_cli("run", "--", env.path / "bin" / "demo-train", str(code), cwd=project)


def refused_in_one_line(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == ExitCode.OUTPUT_ERROR, proc.stderr
    assert len(lines(proc.stderr)) == 1, proc.stderr
    assert "symbolic link" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def not_recorded(proc: subprocess.CompletedProcess[str], code: int) -> None:
    """``envguard run``: the child ran and its status passed on; the record was refused."""
    assert proc.returncode == code, proc.stderr
    last = lines(proc.stderr)[-1]
    assert last.startswith("envguard: could not record this run: ") and \
        "symbolic link" in last, proc.stderr


# ------------------------------------------------------------------- lock: lockfiles/

def test_lock_refuses_a_snapshot_file_that_is_a_link(project: Path, good: Venv,
                                                     tmp_path: Path) -> None:
    assert lock(project, good).returncode == 0
    toml = (project / "lockfiles" / "demo-train.toml").read_text()
    rel = next(ln.split('"')[1] for ln in toml.splitlines() if ln.startswith("snapshot_file"))
    planted = project / "lockfiles" / rel
    victim = Victim.make(tmp_path)
    planted.unlink()
    planted.symlink_to(victim.path)
    refused_in_one_line(lock(project, good))
    assert victim.untouched() and planted.is_symlink()
    assert (project / "lockfiles" / "demo-train.toml").read_text() == toml


def test_lock_refuses_a_dangling_lockfile_link(project: Path, good: Venv,
                                               tmp_path: Path) -> None:
    would_be = tmp_path / "made-through-the-link.toml"
    (project / "lockfiles" / "demo-train.toml").symlink_to(would_be)
    refused_in_one_line(lock(project, good))
    assert not would_be.exists()
    assert not (project / "lockfiles" / "demo-train.snapshots").exists()


def test_lock_refuses_a_snapshots_folder_that_is_a_link(project: Path, good: Venv,
                                                        tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (project / "lockfiles" / "demo-train.snapshots").symlink_to(elsewhere)
    refused_in_one_line(lock(project, good))
    assert list(elsewhere.iterdir()) == []
    assert not (project / "lockfiles" / "demo-train.toml").exists()


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_lock_does_not_follow_its_lock_file(project: Path, good: Venv, tmp_path: Path,
                                            dangling: bool) -> None:
    victim = Victim.make(tmp_path)
    target = tmp_path / "made.lock" if dangling else victim.path
    (project / "lockfiles" / ".demo-train.toml.lock").symlink_to(target)
    proc = lock(project, good)
    assert proc.returncode == ExitCode.OUTPUT_ERROR, proc.stderr
    assert len(lines(proc.stderr)) == 1 and "symbolic link" in proc.stderr, proc.stderr
    assert victim.untouched() and not (tmp_path / "made.lock").exists()


def test_lock_sweeps_stale_temporaries_beside_the_lockfile(project: Path, good: Venv) -> None:
    folder = project / "lockfiles"
    stale = folder / ".demo-train.toml.0123abcd.tmp"
    fresh = folder / ".demo-train.toml.89abcdef.tmp"
    other = folder / "notes.0123abcd.tmp"  # not a name envguard gives its temporaries
    for path in (stale, fresh, other):
        path.write_text("half written")
    for path in (stale, other):
        os.utime(path, (OLD, OLD))
    assert lock(project, good).returncode == 0
    assert not stale.exists() and fresh.exists() and other.exists()


# ------------------------------------------------------------------- run: .envguard/

def test_run_never_writes_through_a_last_good_link(project: Path, good: Venv,
                                                   tmp_path: Path) -> None:
    assert lock(project, good).returncode == 0
    runs = project / ".envguard" / "runs"
    runs.mkdir(parents=True)
    victim = Victim.make(tmp_path)
    (runs / "last-good.json").symlink_to(victim.path)
    not_recorded(run(project, good, 0), 0)
    assert victim.untouched() and (runs / "last-good.json").is_symlink()


@pytest.mark.parametrize("planted", [".envguard", ".envguard/runs"])
def test_run_never_writes_into_a_linked_state_folder(project: Path, good: Venv,
                                                     tmp_path: Path, planted: str) -> None:
    assert lock(project, good).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (project / planted).parent.mkdir(parents=True, exist_ok=True)
    (project / planted).symlink_to(elsewhere)
    not_recorded(run(project, good, 3), 3)
    assert [p for p in elsewhere.rglob("*") if p.is_file()] == []


def test_run_never_writes_through_a_stored_snapshot_link(project: Path, good: Venv,
                                                         tmp_path: Path) -> None:
    assert lock(project, good).returncode == 0
    assert run(project, good, 0).returncode == 0
    stored = list((project / ".envguard" / "snapshots" / "by-digest").iterdir())
    assert len(stored) == 1
    would_be = tmp_path / "made-through-the-link.json"
    stored[0].unlink()
    stored[0].symlink_to(would_be)  # the same environment: the same digest, the same name
    not_recorded(run(project, good, 0), 0)
    assert not would_be.exists()


def test_snapshot_never_writes_into_a_linked_snapshots_folder(good: Venv,
                                                              tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / ".envguard").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (project / ".envguard" / "snapshots").symlink_to(elsewhere)
    proc = envguard_cli("snapshot", "--python", good.python, "--quiet", cwd=project)
    refused_in_one_line(proc)
    assert list(elsewhere.iterdir()) == []


# ------------------------------------------------------------------- runs prune

def test_prune_refuses_a_linked_snapshot_store(project: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    keep = elsewhere / f"sha256-{'0' * 64}.json"
    keep.write_text(VICTIM_TEXT)
    (project / ".envguard" / "snapshots").mkdir(parents=True)
    (project / ".envguard" / "snapshots" / "by-digest").symlink_to(elsewhere)
    refused_in_one_line(envguard_cli("runs", "prune", "--keep", "0", cwd=project))
    assert keep.read_text() == VICTIM_TEXT


def test_prune_refuses_a_last_good_link_and_leaves_a_record_link(project: Path,
                                                                 tmp_path: Path) -> None:
    runs = project / ".envguard" / "runs"
    runs.mkdir(parents=True)
    victim = Victim.make(tmp_path)
    (runs / "20990101T000000000000Z-x.run.json").symlink_to(victim.path)
    (runs / "last-good.json").symlink_to(victim.path)
    refused_in_one_line(envguard_cli("runs", "prune", "--keep", "0", cwd=project))
    assert victim.untouched()
    (runs / "last-good.json").unlink()
    pruned = envguard_cli("runs", "prune", "--keep", "0", cwd=project)
    assert pruned.returncode == 0, pruned.stderr
    assert victim.untouched()


def test_prune_removes_stale_temporaries_only(project: Path) -> None:
    state = project / ".envguard"
    (state / "runs").mkdir(parents=True)
    (state / "snapshots" / "by-digest").mkdir(parents=True)
    stale = [state / "runs" / ".last-good.json.0123abcd.tmp",
             state / "runs" / ".20260101T000000000000Z-x.run.json.deadbeef.tmp",
             state / "snapshots" / "by-digest" / f".sha256-{'1' * 64}.json.00ff00ff.tmp"]
    kept = [state / "runs" / ".last-good.json.89abcdef.tmp",  # fresh: a write in progress
            state / "runs" / "mine.tmp"]  # not a name envguard gives its temporaries
    for path in stale + kept:
        path.write_text("half written")
    for path in stale + kept[1:]:
        os.utime(path, (OLD, OLD))
    linked = state / "runs" / ".x.json.0badf00d.tmp"  # a link, even with the name: left
    linked.symlink_to(kept[1])
    os.utime(linked, (OLD, OLD), follow_symlinks=False)
    proc = envguard_cli("runs", "prune", "--keep", "5", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in kept) and linked.is_symlink()


# ------------------------------------------------------------------- shared folders

def _poisoned_bytecode(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """(source copy, cache dir, bytecode folder, marker): a copy of envguard without any
    ``.pyc``, and in ``<cache>/bytecode`` a ``.pyc`` for its ``envguard.cli.program`` that
    creates the marker when it runs (unchecked-hash: Python never compares it with the
    source)."""
    src = tmp_path / "src"
    shutil.copytree(SRC / "envguard", src / "envguard",
                    ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache"
    folder = cache / "bytecode"
    marker = tmp_path / "pyc-ran"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('ran')\nraise SystemExit(9)\n")
    saved = sys.pycache_prefix
    try:
        sys.pycache_prefix = str(folder)
        pyc = importlib.util.cache_from_source(str(src / "envguard" / "cli" / "program.py"))
    finally:
        sys.pycache_prefix = saved
    py_compile.compile(str(evil), cfile=pyc, doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    cache.chmod(0o700)
    for dirpath, dirnames, _ in os.walk(folder):
        for name in ("", *dirnames):
            os.chmod(os.path.join(dirpath, name), 0o700)
    return src, cache, folder, marker


def _start(src: Path, cache: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPYCACHEPREFIX", "ENVGUARD_NO_BYTECODE_CACHE")}
    env.update(PYTHONPATH=str(src), PYTHONDONTWRITEBYTECODE="1", ENVGUARD_CACHE_DIR=str(cache),
               ENVGUARD_DEBUG="1")
    return subprocess.run([sys.executable, "-m", "envguard", "--version"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("how", ["world-writable", "group-writable-parent", "foreign-owned"])
def test_a_shared_bytecode_folder_is_not_used(tmp_path: Path, how: str) -> None:
    if how == "foreign-owned" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    src, cache, folder, marker = _poisoned_bytecode(tmp_path)
    if how == "world-writable":
        folder.chmod(0o777)
    elif how == "group-writable-parent":
        cache.chmod(0o770)
    else:
        os.chown(folder, 4242, 4242)
    proc = _start(src, cache, tmp_path)
    assert not marker.exists(), proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert f"envguard: not using {folder}: " in proc.stderr, proc.stderr


def test_a_private_bytecode_folder_is_used(tmp_path: Path) -> None:
    """The control: the same poisoned ``.pyc`` in a private folder runs (so the tests above
    prove the check, not a ``.pyc`` Python would have ignored anyway)."""
    src, cache, _, marker = _poisoned_bytecode(tmp_path)
    proc = _start(src, cache, tmp_path)
    assert marker.exists() and proc.returncode == 9, proc.stderr


def test_bytecode_and_memo_folders_are_made_private(tmp_path: Path, good: Venv) -> None:
    cache = tmp_path / "fresh" / "cache"
    env = {"PYTHONDONTWRITEBYTECODE": "1", "ENVGUARD_CACHE_DIR": str(cache)}
    out = tmp_path / "snap.json"
    proc = envguard_cli("snapshot", "--python", good.python, "-o", out, cwd=tmp_path,
                        extra=env)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert list(cache.glob("*.marshal"))  # the memo folder was trusted and used


def test_a_shared_memo_folder_is_neither_read_nor_written(tmp_path: Path, good: Venv) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    out = tmp_path / "snap.json"
    proc = envguard_cli("snapshot", "--python", good.python, "-o", out, cwd=tmp_path,
                        extra={"ENVGUARD_CACHE_DIR": str(cache), "ENVGUARD_DEBUG": "1"})
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in cache.iterdir() if p.name != "bytecode") == []
    assert f"envguard: not using {cache}: " in proc.stderr, proc.stderr


# ------------------------------------------------------------------- cache archives

def _saved(builds: Builds) -> tuple[Path, dict[str, tuple[str, int, str]]]:
    make_cache(inductor())
    saved = envguard_cli("cache", "save", "good", "--python", builds.a.path, cwd=Path.cwd())
    assert saved.returncode == 0, saved.stderr
    shutil.rmtree(inductor())
    make_cache(inductor(), tag="-live")
    return store() / "good", tree(inductor())


def _untouched(live: dict[str, tuple[str, int, str]]) -> None:
    assert tree(inductor()) == live
    assert [p.name for p in inductor().parent.iterdir()
            if ".restoring-" in p.name or ".before-restore-" in p.name] == []


def _restore_refused(builds: Builds, live: dict[str, tuple[str, int, str]], why: str) -> None:
    """``cache restore`` refuses the planted archive in one line (exit 2), within 30 s, and
    the live cache is as it was."""
    proc = envguard_cli("cache", "restore", "good", "--python", builds.a.path, cwd=Path.cwd(),
                        timeout=30)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert len(lines(proc.stderr)) == 1 and why in proc.stderr, proc.stderr
    _untouched(live)


def test_a_fifo_for_a_tar_is_refused_at_once(builds: Builds) -> None:
    folder, live = _saved(builds)
    (folder / "inductor.tar").unlink()
    os.mkfifo(folder / "inductor.tar")
    _restore_refused(builds, live, "not a regular file")


def _bomb(announced: int) -> bytes:
    """A tar whose one member's header announces ``announced`` bytes and holds 512."""
    info = tarfile.TarInfo("fxgraph/huge")
    info.size, info.mode = announced, 0o644
    header = info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
    return header + b"\0" * 512 + b"\0" * 1024


def test_a_tar_bomb_is_refused_from_its_headers(builds: Builds) -> None:
    folder, live = _saved(builds)
    _rewrite(folder, _bomb(2 << 40))  # 2 TiB announced, past any cap
    _restore_refused(builds, live, "announce more than")


def test_extraction_stops_at_the_cap_whatever_was_checked(tmp_path: Path) -> None:
    """The running count: an archive that reads bigger at extraction than when checked
    (replaced in between) stops before the member that passes the cap."""
    from envguard.cache.tar import extract_into
    from envguard.errors import InputError

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(3):
            info = tarfile.TarInfo(f"f{i}")
            info.size = 1000
            tar.addfile(info, io.BytesIO(b"x" * 1000))
    path = tmp_path / "inductor.tar"
    path.write_bytes(buf.getvalue())
    with pytest.raises(InputError, match="announce more than"):
        extract_into(path, str(tmp_path / "staging"), 2500)
    written = sum(p.stat().st_size for p in (tmp_path / "staging").rglob("*") if p.is_file())
    assert written <= 2500
