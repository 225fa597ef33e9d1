"""Hostile files inside an environment, a conda prefix and envguard's memo folder.

A dist-info's METADATA, RECORD, WHEEL, INSTALLER, direct_url.json or entry_points.txt, a
conda prefix's ``conda-meta/history`` or record, or a memo file is replaced by a FIFO, a
symlink to ``/dev/zero``, a symlink loop or a sparse file over its cap: ``envguard
snapshot``, ``lock`` and ``history`` (real subprocesses, each with a timeout) finish with
a documented exit code, at most one line on stderr and no traceback, and the snapshot
names the file in its ``errors``. A forged memo (valid marshal of the wrong types, a code
object inside) is no memo. SIGTERM to envguard while its interpreter probe is blocked
kills the probe's process group.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.conftest import UV
from tests.wheelfactory import Venv, VenvFactory, build_wheel, interruptible

pytestmark = pytest.mark.skipif(UV is None, reason="uv is not installed")

TIMEOUT_S = 45
# The caps of docs/SNAPSHOT.md (envguard.input_file), written out so that this file runs
# against older code too.
METADATA_BYTES, RECORD_BYTES, SMALL_FILE_BYTES = 16 << 20, 64 << 20, 1 << 20
CAPS = {"METADATA": METADATA_BYTES, "RECORD": RECORD_BYTES, "WHEEL": SMALL_FILE_BYTES,
        "INSTALLER": SMALL_FILE_BYTES, "direct_url.json": SMALL_FILE_BYTES,
        "entry_points.txt": METADATA_BYTES, "history": METADATA_BYTES,
        "tiny-1.0-0.json": RECORD_BYTES}
HOSTILE = ("fifo", "dev-zero", "loop", "huge")
# What the finding says for each (the snapshot's errors, the history's notes).
SAYS = {"fifo": "FIFO", "dev-zero": "character device", "loop": "symlink loop",
        "huge": "too large"}


@pytest.fixture(scope="module")
def env(module_venvs: VenvFactory) -> Venv:
    """A uv venv with ``tiny`` (a console script, so an entry_points.txt) and a conda-like
    ``conda-meta/`` (a history and one record)."""
    factory = module_venvs
    wheels = factory.wheels
    made = factory.create("venv")
    wheel = build_wheel(wheels, "tiny", "1.0", {"tiny/__init__.py": "def main():\n    pass\n"},
                        scripts={"tiny": "tiny:main"})
    factory.uv_install(made, wheel)
    info = made.site_packages() / "tiny-1.0.dist-info"
    if not (info / "direct_url.json").exists():
        (info / "direct_url.json").write_text(json.dumps(
            {"url": "file:///wheels/tiny-1.0-py3-none-any.whl", "archive_info": {}}))
    meta = made.path / "conda-meta"
    meta.mkdir()
    (meta / "history").write_text("==> 2024-01-02 03:04:05 <==\n# cmd: conda install tiny\n"
                                  "+conda-forge/linux-64::tiny-1.0-0\n")
    (meta / "tiny-1.0-0.json").write_text(json.dumps(
        {"name": "tiny", "version": "1.0", "build": "0", "channel": "conda-forge",
         "paths_data": {"paths": []}}))
    return made


def _target(env: Venv, name: str) -> Path:
    if name in ("history", "tiny-1.0-0.json"):
        return env.path / "conda-meta" / name
    return env.site_packages() / "tiny-1.0.dist-info" / name


def make_hostile(path: Path, kind: str, cap: int) -> None:
    """Replace ``path`` by a FIFO, a link to /dev/zero, a link loop or a sparse file."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "loop":
        path.symlink_to(path.name)  # points at itself
    else:
        with open(path, "wb") as fh:
            fh.truncate(cap + 1)  # sparse: no disk used


@pytest.fixture
def replaced(env: Venv, request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """The file of the test's parameters replaced, put back afterwards."""
    name, kind = request.param
    path = _target(env, name)
    saved = path.with_name(path.name + ".saved")
    os.replace(path, saved)
    make_hostile(path, kind, CAPS[name])
    try:
        yield name, kind
    finally:
        path.unlink()
        os.replace(saved, path)


def envguard(*args: str | Path, cwd: Path,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in (env or os.environ).items()
             if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "ENVGUARD_PYTHON", "ENVGUARD_DEBUG")}
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd,
                          env=clean, capture_output=True, text=True, timeout=TIMEOUT_S,
                          check=False)


def assert_clean(proc: subprocess.CompletedProcess[str], codes: tuple[int, ...]) -> None:
    assert proc.returncode in codes, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 1, proc.stderr


# entry_points.txt is read by `lock` alone, and a loop or a huge one already did no harm.
CASES = [(name, kind) for name in ("METADATA", "RECORD", "WHEEL", "INSTALLER",
                                   "direct_url.json", "entry_points.txt") for kind in HOSTILE
         if name != "entry_points.txt" or kind in ("fifo", "dev-zero")]


@pytest.mark.parametrize("replaced", CASES, indirect=True, ids=["-".join(c) for c in CASES])
def test_dist_info_file(replaced: tuple[str, str], env: Venv, clean_cwd: Path) -> None:
    name, kind = replaced
    out = clean_cwd / "snap.json"
    proc = envguard("snapshot", "--python", env.python, "-q", "-o", out, cwd=clean_cwd)
    assert_clean(proc, (0,))
    errors = json.loads(out.read_text())["errors"]
    if name != "entry_points.txt":  # not part of a snapshot: read by lock only
        found = [e for e in errors if name in (e.get("path") or "") + e["message"]]
        assert found, errors
        assert any(SAYS[kind] in e["message"] for e in found), found
        assert all("\n" not in e["message"] for e in found)
    lock = envguard("lock", "tiny", "--python", env.python, "--lock", clean_cwd / "l.toml",
                    cwd=clean_cwd)
    assert_clean(lock, (0, 2, 4))
    history = envguard("history", "--python", env.python, "-q", "--format", "json",
                       cwd=clean_cwd)
    assert_clean(history, (0,))
    json.loads(history.stdout)


# A conda record was already read as a bounded document; its symlink loop now says so.
CONDA = [*(("history", kind) for kind in HOSTILE), ("tiny-1.0-0.json", "loop")]


@pytest.mark.parametrize("replaced", CONDA, indirect=True, ids=["-".join(c) for c in CONDA])
def test_conda_meta_file(replaced: tuple[str, str], env: Venv, clean_cwd: Path) -> None:
    name, kind = replaced
    out = clean_cwd / "snap.json"
    proc = envguard("snapshot", "--python", env.python, "-q", "-o", out, cwd=clean_cwd)
    assert_clean(proc, (0,))
    history = envguard("history", "--python", env.python, "-q", "--format", "json",
                       cwd=clean_cwd)
    assert_clean(history, (0,))
    timeline = json.loads(history.stdout)
    if name == "history":
        assert any("conda-meta/history not read" in b and SAYS[kind] in b
                   for b in timeline["blind_spots"]), timeline["blind_spots"]
    else:
        errors = json.loads(out.read_text())["errors"]
        assert any(name in (e.get("path") or "") and SAYS[kind] in e["message"]
                   for e in errors), errors


@pytest.mark.parametrize("kind", HOSTILE)
def test_torch_version_py(kind: str, venvs: VenvFactory, wheel_dir: Path,
                          clean_cwd: Path) -> None:
    """``torch/version.py`` is read too (torch is never imported)."""
    made = venvs.create()
    venvs.uv_install(made, build_wheel(wheel_dir, "torch", "2.11.0", {
        "torch/__init__.py": "", "torch/version.py": "__version__ = '2.11.0'\n"}))
    path = made.site_packages() / "torch" / "version.py"
    path.unlink()
    make_hostile(path, kind, SMALL_FILE_BYTES)
    out = clean_cwd / "snap.json"
    proc = envguard("snapshot", "--python", made.python, "-q", "-o", out, cwd=clean_cwd)
    assert_clean(proc, (0,))
    errors = json.loads(out.read_text())["errors"]
    assert any("cannot read torch/version.py" in e["message"] and SAYS[kind] in e["message"]
               for e in errors), errors


def test_invalid_utf8_is_replaced_not_fatal(env: Venv, clean_cwd: Path) -> None:
    """Invalid UTF-8 in METADATA, WHEEL, INSTALLER and RECORD: read with U+FFFD, no error;
    in direct_url.json: a one-line finding."""
    info = env.site_packages() / "tiny-1.0.dist-info"
    saved = {n: (info / n).read_bytes() for n in ("METADATA", "WHEEL", "INSTALLER", "RECORD",
                                                  "direct_url.json")}
    try:
        for n, data in saved.items():
            (info / n).write_bytes(data + b"\xff\xfe\xc3(\n")
        out = clean_cwd / "snap.json"
        proc = envguard("snapshot", "--python", env.python, "-q", "-o", out, cwd=clean_cwd)
        assert_clean(proc, (0,))
        doc = json.loads(out.read_text())
        assert [p["version"] for p in doc["packages"] if p["name"] == "tiny"] == ["1.0"]
        assert [e for e in doc["errors"] if "direct_url.json" in e["message"]], doc["errors"]
    finally:
        for n, data in saved.items():
            (info / n).write_bytes(data)


# ------------------------------------------------------------------------------- memo files

def _memo_files(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("*") if p.is_file() and p.suffix in (".marshal",
                                                                              ".json"))


def _forge(value: object, junk: object) -> object:
    """A memo value of the right shape holding ``junk`` where strings and numbers belong."""
    if isinstance(value, tuple) and len(value) == 5:  # a dist-info folder's entry
        rows, _, _, _, fields = value  # (rows, total, mtime, issues, the distribution's fields)
        return (rows, junk, junk, [(junk, junk, junk)],
                tuple([junk] if isinstance(v, list) else junk for v in fields))
    if isinstance(value, tuple) and len(value) == 3:  # a RECORD's: (rows, packed, fingerprint)
        return (junk, value[1], junk)
    return junk


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "forged", "code"])
def test_memo_file(kind: str, env: Venv, clean_cwd: Path) -> None:
    """Every memo file replaced by a FIFO, a link to /dev/zero, or a forged one (valid
    marshal, the right tag, values of the wrong types or code objects): the snapshot is the
    same as without a memo, only slower; the code is never run."""
    cache = Path(os.environ["ENVGUARD_CACHE_DIR"])
    first = clean_cwd / "first.json"
    assert_clean(envguard("snapshot", "--python", env.python, "-q", "-o", first,
                          cwd=clean_cwd), (0,))
    memos = sorted(cache.rglob("*.marshal"))
    assert memos, list(cache.rglob("*"))
    code = compile("import os; os._exit(99)", "<memo>", "exec")
    for path in memos:
        data = path.read_bytes()
        path.unlink()
        if kind in ("forged", "code"):
            tag, entries = marshal.loads(data)  # noqa: S302 - the test's own memo file
            junk = 7 if kind == "forged" else code
            path.write_bytes(marshal.dumps((tag, {
                k: (v[0], _forge(v[1], junk)) if isinstance(v, tuple) and len(v) == 2
                else junk for k, v in entries.items()})))
        else:
            make_hostile(path, kind, 0)
    second = clean_cwd / "second.json"
    proc = envguard("snapshot", "--python", env.python, "-q", "-o", second, cwd=clean_cwd)
    assert_clean(proc, (0,))
    before, after = json.loads(first.read_text()), json.loads(second.read_text())
    assert after["packages"] == before["packages"]
    assert after["torch"] == before["torch"]
    assert after["integrity"]["checked_files"] == before["integrity"]["checked_files"]
    # Only notes about the memo file itself (ignored; not replaced when not a regular file).
    assert not [e for e in after["errors"] if "memo" not in e["message"]
                and ".marshal" not in e["message"] and e not in before["errors"]], after["errors"]


# ---------------------------------------------------------------------------------- SIGTERM

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_signal_kills_blocked_probe(signum: int, venvs: VenvFactory,
                                    clean_cwd: Path) -> None:
    """A venv whose interpreter blocks at start (a .pth file that waits on a FIFO): the
    probe envguard starts in it (in a session of its own) dies with envguard. (SIGINT
    already did: KeyboardInterrupt unwinds through the code that kills it.)"""
    made = venvs.create()
    fifo = clean_cwd / "block.fifo"
    os.mkfifo(fifo)
    (made.site_packages() / "zz_block.pth").write_text(f"import os; open({str(fifo)!r}).read()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    err = clean_cwd / "stderr.txt"
    with err.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "envguard", "snapshot", "--python",
                                 str(made.python), "-q", "-o", str(clean_cwd / "s.json")],
                                cwd=clean_cwd, env=env, stdout=subprocess.DEVNULL, stderr=sink,
                                start_new_session=True, preexec_fn=interruptible)
    probes: list[psutil.Process] = []
    try:
        parent = psutil.Process(proc.pid)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not probes:
            probes = [c for c in parent.children(recursive=True) if _is_probe(c)]
            time.sleep(0.1)
        assert probes, "the probe never started"
        time.sleep(0.5)  # blocked in its .pth by now
        proc.send_signal(signum)
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(probes, timeout=5)
        assert not alive, [p.pid for p in alive]
        assert proc.returncode in (-signum, 130), proc.returncode
        assert "Traceback" not in err.read_text()
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        for leftover in probes:  # on the old code: the orphaned probe
            with contextlib.suppress(psutil.Error):
                leftover.kill()
        proc.wait(timeout=10)
        _unblock(fifo)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _is_probe(p: psutil.Process) -> bool:
    return any(part.endswith("_inprocess.py") for part in _cmdline(p))


def _unblock(fifo: Path) -> None:
    """Open the FIFO for writing without blocking, so that a leftover reader (on the old
    code) can end; then remove it."""
    with contextlib.suppress(OSError):
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    fifo.unlink(missing_ok=True)

