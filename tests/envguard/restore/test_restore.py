"""``envguard restore`` end to end: real uv venvs from wheels built here, offline.

The good venv holds alpha (with a console script), beta 2.0, gamma and a fake torch
2.11.0+cu128. The polluted venv is the same set spoiled the four usual ways: a foreign
package added (junk), a version bumped (beta 2.1), a same-version rebuild of torch swapped
in (another git_version, so another RECORD fingerprint) and a package removed (gamma).
Both torch builds are kept in separate folders; ``good-wheels`` (the --find-links folder
for a restore) holds only the good one. envguard runs as a real subprocess.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path
from typing import Any

import pytest

from envguard.errors import RestoreError
from envguard.exitcodes import ExitCode
from envguard.model import DirectUrl, Distribution
from envguard.restore.build import (
    build_venv,
    error_line,
    find_uv,
    run_uv,
    sync_requirements,
)
from envguard.restore.export import pylock_text, requirements_text
from envguard.restore.plan import (
    CHANGE,
    INSTALL,
    KEEP,
    REMOVE,
    SKIP,
    IndexOptions,
    plan_restore,
    requirement_for,
)
from envguard.snapshot_file import read_snapshot
from tests.wheelfactory import build_wheel, fake_torch_files, interruptible
from tests.wheelfactory import find_uv as find_uv_for_tests

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

GOOD_GIT = "70d99e998b4955e0049d13a98d77ae1b14db1f45"
REBUILT_GIT = "e2b8a1c7" * 5
ALPHA = "def main():\n    print('alpha ok')\n"


@dataclasses.dataclass(frozen=True)
class World:
    root: Path
    uv: str
    good_wheels: Path
    """alpha, beta 2.0, gamma and the good torch build: the restore's --find-links folder."""
    rebuild_only: Path
    """The same, except torch: only the *other* build of 2.11.0+cu128."""
    good: Path
    polluted: Path
    good_json: Path
    env: dict[str, str]


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("UV_", "PIP_")) and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update({"UV_NO_CONFIG": "1", "UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never",
                "ENVGUARD_CACHE_DIR": str(home / "cache"), "XDG_CONFIG_HOME": str(home / "cfg"),
                "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"),
                "TRITON_CACHE_DIR": str(home / "triton"), "CUDA_CACHE_PATH": str(home / "nv"),
                "COLUMNS": "250"})
    env.pop("NO_COLOR", None)
    return env


def _run(args: list[str], env: dict[str, str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, check=False,
                          timeout=120, **kw)


def _uv_venv(uv: str, env: dict[str, str], path: Path, links: Path, *reqs: str) -> Path:
    """Create ``path`` with uv (unless it exists) and install ``reqs`` from ``links``."""
    steps = [] if path.exists() else [[uv, "venv", "--quiet", "--python",
                                       os.path.realpath(sys.executable), str(path)]]
    if reqs:
        steps.append([uv, "pip", "install", "--quiet", "--python", str(path / "bin" / "python"),
                      "--no-index", "--find-links", str(links), *reqs])
    for args in steps:
        proc = _run(args, env)
        assert proc.returncode == 0, proc.stderr
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    uv = find_uv_for_tests()
    if uv is None:
        pytest.skip("uv is not installed")
    root = tmp_path_factory.mktemp("restore")
    env = _env(root / "home")
    good_wheels, other, rebuild_only = root / "good-wheels", root / "other", root / "rebuild"
    for folder in (good_wheels, rebuild_only):
        build_wheel(folder, "alpha", "1.0", {"alpha/__init__.py": ALPHA},
                    scripts={"alpha-run": "alpha:main"})
        build_wheel(folder, "beta", "2.0", {"beta/__init__.py": "V = 2\n"})
        build_wheel(folder, "gamma", "1.0", {"gamma/__init__.py": ""})
    build_wheel(good_wheels, "torch", "2.11.0+cu128", fake_torch_files(git_version=GOOD_GIT))
    for folder in (other, rebuild_only):
        build_wheel(folder, "torch", "2.11.0+cu128", fake_torch_files(git_version=REBUILT_GIT))
    build_wheel(other, "beta", "2.1", {"beta/__init__.py": "V = 21\n"})
    build_wheel(other, "junk", "0.1", {"junk/__init__.py": ""})
    venvs = root / "venvs"
    good = _uv_venv(uv, env, venvs / "good", good_wheels, "alpha==1.0", "beta==2.0",
                    "gamma==1.0", "torch==2.11.0+cu128")
    polluted = _uv_venv(uv, env, venvs / "polluted", good_wheels, "alpha==1.0")
    _uv_venv(uv, env, polluted, other, "beta==2.1", "junk==0.1", "torch==2.11.0+cu128")
    good_json = root / "good.json"
    proc = _run([sys.executable, "-m", "envguard", "snapshot", "-q", "--python",
                 str(good / "bin" / "python"), "-o", str(good_json)], env)
    assert proc.returncode == 0, proc.stderr
    return World(root=root, uv=uv, good_wheels=good_wheels, rebuild_only=rebuild_only,
                 good=good, polluted=polluted, good_json=good_json, env=env)


def envguard(w: World, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "envguard", *map(str, args)], w.env, cwd=w.root)


def restore(w: World, *args: str | Path, links: Path | None = None,
            python: Path | None = None) -> subprocess.CompletedProcess[str]:
    return envguard(w, "restore", w.good_json, "--python", python or w.polluted, "--no-index",
                    "--find-links", links or w.good_wheels, *args)


def flat(text: str) -> str:
    return " ".join(text.split())


def tree_digest(folder: Path) -> dict[str, str]:
    """Every file and link under ``folder``: its sha256 or link target (byte-for-byte)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def freeze(w: World, venv: Path) -> str:
    proc = _run([w.uv, "pip", "freeze", "--python", str(venv / "bin" / "python")], w.env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def leftovers(target: Path) -> list[Path]:
    return sorted(target.parent.glob(target.name + ".partial-*"))


def package_changes(w: World, new: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """(material package changes, package-rule findings) of envguard diff GOOD NEW."""
    new_json = new.parent / (new.name + ".json")
    proc = envguard(w, "snapshot", "-q", "--python", new, "-o", new_json)
    assert proc.returncode == 0, proc.stderr
    proc = envguard(w, "diff", w.good_json, new_json, "--format", "json")
    doc = json.loads(proc.stdout)
    changes = [c for c in doc["changes"] if c["section"] == "packages" and c["material"]]
    rules = [f["rule"] for f in doc["findings"]
             if f["rule"].startswith(("package-", "torch-", "foreign-"))]
    return changes, rules


# --- the whole restore -------------------------------------------------------------------


def test_restore_rebuilds_the_good_set_and_leaves_the_polluted_env_alone(world: World) -> None:
    w = world
    before = (freeze(w, w.polluted), tree_digest(w.polluted))
    new = w.root / "restored"
    started = time.perf_counter()
    proc = restore(w, "--into", new, "--format", "json")
    elapsed = time.perf_counter() - started
    assert proc.returncode == ExitCode.OK, proc.stderr
    doc = json.loads(proc.stdout)
    rows = {r["name"]: r["action"] for r in doc["plan"]["rows"]}
    assert rows == {"alpha": KEEP, "beta": CHANGE, "gamma": INSTALL, "junk": REMOVE,
                    "torch": CHANGE}
    assert doc["verification"]["ok"] is True and doc["verification"]["unreproduced"] == []
    assert doc["target"] == str(new)

    assert (new / "pyvenv.cfg").is_file() and not leftovers(new)
    assert freeze(w, new) == freeze(w, w.good)
    changes, rules = package_changes(w, new)
    assert changes == [] and rules == []
    # Built in NEW.partial-*, then renamed: its console scripts must still run.
    script = _run([str(new / "bin" / "alpha-run")], w.env)
    assert script.stdout.strip() == "alpha ok", script.stderr
    assert (freeze(w, w.polluted), tree_digest(w.polluted)) == before
    print(f"restore of the 4-package test env took {elapsed:.2f} s")


def test_a_build_the_index_no_longer_serves_is_reported_as_a_build_change(world: World) -> None:
    w = world
    new = w.root / "restored-from-rebuild"
    proc = restore(w, "--into", new, links=w.rebuild_only)
    assert proc.returncode == ExitCode.DRIFT, proc.stderr
    out = flat(proc.stdout)
    good_fp = read_snapshot(w.good_json).package("torch")
    assert good_fp is not None and good_fp.fingerprint
    assert "torch 2.11.0+cu128: same version, different build" in out
    assert f"RECORD fingerprint {good_fp.fingerprint}" in out
    assert "[torch-build-changed]" in out and f"git_version: {GOOD_GIT} → {REBUILT_GIT}" in out
    assert "could not be reproduced" in out
    _, rules = package_changes(w, new)
    assert rules == ["torch-build-changed"]
    # It says how to switch to the new venv (text only: JSON has "target").
    assert f"envguard: to use it: source {new / 'bin' / 'activate'} (envguard commands take " \
           f"it as --python {new})" in proc.stderr


def test_dry_run_shows_the_plan_and_creates_nothing(world: World) -> None:
    w = world
    siblings = sorted(p.name for p in w.polluted.parent.iterdir())
    new = w.root / "never-built"
    proc = restore(w, "--into", new, "--dry-run", "--all")
    assert proc.returncode == ExitCode.OK, proc.stderr
    cells = [[c.strip() for c in ln.split("│")] for ln in proc.stdout.splitlines()]
    rows = {c[1]: c for c in cells if len(c) == 5}
    assert rows["gamma"] == [INSTALL, "gamma", "–", "1.0", "not installed"]
    assert rows["beta"] == [CHANGE, "beta", "2.1", "2.0", "version 2.1 → 2.0"]
    assert rows["junk"] == [REMOVE, "junk", "0.1", "–", f"not in {w.good_json}"]
    assert rows["alpha"][0] == KEEP and rows["torch"][0] == CHANGE
    assert "same version, another build (fingerprint" in flat(proc.stdout)
    assert "1 install, 2 change, 1 remove" in flat(proc.stdout)
    assert not new.exists() and not leftovers(new)
    # Without --into the default target sits next to the polluted venv: still nothing there.
    proc = restore(w, "--dry-run")
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert sorted(p.name for p in w.polluted.parent.iterdir()) == siblings


def test_index_hints_come_from_local_labels_unless_indexes_are_given(world: World) -> None:
    w = world
    proc = envguard(w, "restore", w.good_json, "--python", w.polluted, "--dry-run",
                    "--format", "json")
    plan = json.loads(proc.stdout)["plan"]
    assert plan["index_hints"] == ["https://download.pytorch.org/whl/cu128"]
    assert plan["uv_index_args"] == ["--extra-index-url", "https://download.pytorch.org/whl/cu128",
                                     "--index-strategy", "unsafe-best-match"]
    proc = envguard(w, "restore", w.good_json, "--python", w.polluted, "--dry-run",
                    "--format", "json", "--index-url", "https://mirror.example/simple")
    plan = json.loads(proc.stdout)["plan"]
    assert plan["hints_applied"] is False
    assert plan["uv_index_args"] == ["--index-url", "https://mirror.example/simple"]


def test_find_links_alone_adds_no_index_of_ours(world: World) -> None:
    """The old code added the PyTorch index for torch's +cu128 even with --find-links, and
    an offline restore then failed reaching it."""
    w = world
    proc = envguard(w, "restore", w.good_json, "--python", w.polluted, "--dry-run",
                    "--format", "json", "--find-links", w.good_wheels)
    assert proc.returncode == ExitCode.OK, proc.stderr
    plan = json.loads(proc.stdout)["plan"]
    assert plan["hints_applied"] is False
    assert plan["uv_index_args"] == ["--find-links", str(w.good_wheels)]
    assert "not used" in envguard(w, "restore", w.good_json, "--python", w.polluted,
                                  "--dry-run", "--find-links", w.good_wheels).stdout
    requirements = w.root / "fl-requirements.txt"
    proc = envguard(w, "restore", w.good_json, "--python", w.polluted, "--dry-run",
                    "--find-links", w.good_wheels, "--requirements-out", requirements)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "download.pytorch.org" not in requirements.read_text()


def test_offline_restore_from_find_links_needs_no_network(world: World) -> None:
    """--offline is uv's offline mode. The network is made unusable here (uv's own offline
    variable unset, every proxy a closed port), so anything that reaches out fails."""
    w = world
    env = {k: v for k, v in w.env.items() if k not in ("UV_OFFLINE", "NO_PROXY", "no_proxy")}
    dead = "http://127.0.0.1:9"
    env.update({"HTTPS_PROXY": dead, "HTTP_PROXY": dead, "ALL_PROXY": dead,
                "https_proxy": dead, "http_proxy": dead, "all_proxy": dead})
    new = w.root / "restored-offline"
    proc = _run([sys.executable, "-m", "envguard", "restore", str(w.good_json), "--python",
                 str(w.polluted), "--into", str(new), "--find-links", str(w.good_wheels),
                 "--offline"], env, cwd=w.root)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert freeze(w, new) == freeze(w, w.good)
    assert "download.pytorch.org" not in proc.stderr


def test_uv_activate_line_names_the_final_venv(world: World) -> None:
    """uv built in NEW.partial-<pid>, which is renamed a moment later: the old code showed
    'Activate with: source NEW.partial-<pid>/bin/activate', a folder that no longer exists."""
    w = world
    new = w.root / "restored-activate"
    # uv prints its activation hint only when it can name the user's shell, from $SHELL
    # (CI runs without one), so the test names it.
    env = {**w.env, "SHELL": "/bin/bash"}
    proc = _run([sys.executable, "-m", "envguard", "restore", str(w.good_json), "--python",
                 str(w.polluted), "--no-index", "--find-links", str(w.good_wheels),
                 "--into", str(new)], env, cwd=w.root)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert ".partial-" not in proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "Activate with" in ln]
    assert line.startswith("envguard: uv: Activate with: source "), line
    shown = Path(line.rsplit(" ", 1)[1])  # uv names it relative to the working directory
    assert (w.root / shown).resolve() == (new / "bin" / "activate").resolve()
    assert (new / "bin" / "activate").is_file()


def test_requirements_and_pylock_files(world: World) -> None:
    w = world
    out = w.root / "out"
    out.mkdir()
    (out / "requirements.txt").write_text("old contents\n")
    proc = envguard(w, "restore", w.good_json, "--python", w.polluted, "--dry-run",
                    "--requirements-out", out / "requirements.txt",
                    "--pylock-out", out / "pylock.toml")
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["pylock.toml", "requirements.txt"]
    lines = (out / "requirements.txt").read_text().splitlines()
    assert [ln for ln in lines if not ln.startswith("#")] == [
        "--extra-index-url https://download.pytorch.org/whl/cu128",
        "alpha==1.0", "beta==2.0", "gamma==1.0", "torch==2.11.0+cu128"]
    lock = tomllib.loads((out / "pylock.toml").read_text())
    good = read_snapshot(w.good_json)
    assert lock["lock-version"] == "1.0" and lock["created-by"] == "envguard"
    minor = ".".join(good.interpreter.version.split(".")[:2])
    assert lock["requires-python"] == f"=={minor}.*"
    pkgs = {p["name"]: p for p in lock["packages"]}
    assert {n: p["version"] for n, p in pkgs.items()} == {
        "alpha": "1.0", "beta": "2.0", "gamma": "1.0", "torch": "2.11.0+cu128"}
    assert pkgs["torch"]["index"] == "https://download.pytorch.org/whl/cu128"
    assert "index" not in pkgs["alpha"]
    torch = good.package("torch")
    assert torch is not None
    assert pkgs["torch"]["tool"]["envguard"]["record-fingerprint"] == torch.fingerprint
    # The files really are what uv pip sync installs: a venv from requirements.txt matches.
    venv = w.root / "from-requirements"
    _uv_venv(w.uv, w.env, venv, w.good_wheels)
    proc = _run([w.uv, "pip", "sync", "--python", str(venv / "bin" / "python"), "--no-index",
                 "--find-links", str(w.good_wheels), str(out / "requirements.txt")], w.env)
    assert proc.returncode == 0, proc.stderr
    assert freeze(w, venv) == freeze(w, w.good)


def test_an_output_that_cannot_be_written_is_exit_5_and_builds_nothing(world: World) -> None:
    w = world
    blocker = w.root / "a-file"
    blocker.write_text("x")
    new = w.root / "not-built-5"
    proc = restore(w, "--into", new, "--requirements-out", blocker / "req.txt")
    assert proc.returncode == ExitCode.OUTPUT_ERROR
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("envguard: error: ")
    assert not new.exists() and blocker.read_text() == "x"


def test_a_failure_midway_leaves_nothing_behind(world: World) -> None:
    w = world
    data = json.loads(w.good_json.read_text())
    data["packages"].append({**data["packages"][0], "name": "unobtainium", "version": "9.9",
                             "direct_url": None, "metadata_dir": "unobtainium-9.9.dist-info"})
    bad_good = w.root / "good-plus-missing.json"
    bad_good.write_text(json.dumps(data))
    before = tree_digest(w.polluted)
    new = w.root / "failed"
    proc = envguard(w, "restore", bad_good, "--python", w.polluted, "--into", new,
                    "--no-index", "--find-links", w.good_wheels)
    assert proc.returncode == ExitCode.ENVIRONMENT_ERROR, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("envguard: error:")]
    assert len(errors) == 1 and "uv exit status" in errors[0] and "unobtainium" in errors[0]
    assert not new.exists() and not leftovers(new)
    assert tree_digest(w.polluted) == before


def test_ctrl_c_during_the_install_removes_the_partial_venv(world: World, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    w = world
    for key, value in w.env.items():
        monkeypatch.setenv(key, value)
    good = read_snapshot(w.good_json)
    plan = plan_restore(good, read_snapshot(w.good_json), good_name="good.json",
                        index=IndexOptions(no_index=True, find_links=(str(w.good_wheels),)))
    target = tmp_path / "interrupted"

    def interrupt_during_sync(line: str) -> None:
        if "environment at" in line:  # uv pip sync's first line: the install is under way
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_venv(plan, target, uv=w.uv, python=sys.executable, echo=interrupt_during_sync,
                   python_is_path=True)
    assert not target.exists() and not leftovers(target)


SLOW_BACKEND = '''\
import os, time
def _wait():
    with open({marker!r}, "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(120)
def get_requires_for_build_wheel(config_settings=None):
    return []
def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _wait()
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _wait()
'''


def _slow_sdist(links: Path, marker: Path) -> None:
    """An sdist whose in-tree build backend (no build requirements: offline) hangs."""
    import tarfile

    src = links.parent / "slowpkg-src" / "slowpkg-1.0"
    src.mkdir(parents=True)
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "slowbackend"\nbackend-path = ["."]\n'
        '\n[project]\nname = "slowpkg"\nversion = "1.0"\n')
    (src / "slowbackend.py").write_text(SLOW_BACKEND.format(marker=str(marker)))
    with tarfile.open(links / "slowpkg-1.0.tar.gz", "w:gz") as tar:
        tar.add(src, arcname="slowpkg-1.0")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_uv_builds_removes_the_partial_venv(world: World, tmp_path: Path,
                                                           sig: signal.Signals) -> None:
    w = world
    links, marker = tmp_path / "links", tmp_path / "backend-pid"
    shutil.copytree(w.good_wheels, links)
    _slow_sdist(links, marker)
    data = json.loads(w.good_json.read_text())
    data["packages"].append({**data["packages"][0], "name": "slowpkg", "version": "1.0",
                             "direct_url": None, "metadata_dir": "slowpkg-1.0.dist-info"})
    good = tmp_path / "good-slow.json"
    good.write_text(json.dumps(data))
    target = tmp_path / "interrupted"
    proc = subprocess.Popen(
        [sys.executable, "-m", "envguard", "restore", str(good), "--python", str(w.polluted),
         "--into", str(target), "--no-index", "--find-links", str(links)],
        env=w.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=interruptible)
    deadline = time.monotonic() + 60
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "uv never started the build"
    time.sleep(0.2)  # the backend has written its pid: uv is now waiting on it
    assert leftovers(target)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert err.splitlines()[-1] == "envguard: interrupted"
    assert not target.exists() and not leftovers(target)
    backend = int(marker.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(backend, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the build backend {backend} outlived the restore")


def test_a_hanging_uv_is_killed_at_the_timeout() -> None:
    started = time.perf_counter()
    result = run_uv([sys.executable, "-c", "import time; print('hi', flush=True); "
                     "time.sleep(60)"], timeout=0.5)
    assert result.timed_out and not result.ok and result.lines == ("hi",)
    assert time.perf_counter() - started < 10


def test_uv_missing_is_an_environment_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uv", None)  # the uv package not installed ...
    monkeypatch.setenv("PATH", "")  # ... and no uv on PATH
    with pytest.raises(RestoreError, match="uv not found") as info:
        find_uv()
    assert info.value.exit_code == ExitCode.ENVIRONMENT_ERROR


def test_in_place_syncs_the_given_env_and_refuses_envguards_own(world: World) -> None:
    w = world
    # A venv made by `python -m venv`: pip and setuptools (from ensurepip, offline), which
    # GOOD lacks and `uv pip sync` alone would keep.
    target = w.root / "venvs" / "in-place"
    venv.EnvBuilder(with_pip=True, symlinks=True).create(target)
    assert "pip==" in freeze(w, target)
    _uv_venv(w.uv, w.env, target, w.good_wheels, "alpha==1.0")
    _uv_venv(w.uv, w.env, target, w.root / "other", "beta==2.1", "junk==0.1",
             "torch==2.11.0+cu128")
    proc = restore(w, "--in-place", python=target)
    assert proc.returncode == ExitCode.OK, proc.stdout + proc.stderr
    assert "warning: --in-place" in proc.stderr
    assert freeze(w, target) == freeze(w, w.good)
    changes, rules = package_changes(w, target)
    assert changes == [] and rules == []
    # the change is a revision of that venv (docs/INSTALL.md), which undo can return from
    assert "recorded as revision 1" in proc.stderr
    listed = envguard(w, "revisions", "--python", str(target), "--format", "json")
    (revision,) = json.loads(listed.stdout)["revisions"]
    assert revision["kind"] == "restore" and revision["argv"][:2] == ["envguard", "restore"]
    assert "-junk 0.1" in revision["changes"]

    own = envguard(w, "restore", w.good_json, "--in-place", "--no-index")
    assert own.returncode == ExitCode.USAGE and "envguard itself runs in" in own.stderr


def test_another_python_minor_is_asked_of_uv(world: World) -> None:
    """GOOD ran a Python this machine lacks: uv is asked for it by version, and says no."""
    w = world
    data = json.loads(w.good_json.read_text())
    data["interpreter"]["version"] = "3.99.1"
    path = w.root / "good-py399.json"
    path.write_text(json.dumps(data))
    new = w.root / "py399"
    dry = envguard(w, "restore", path, "--python", w.polluted, "--dry-run", "--no-index")
    assert "ran Python 3.99.1" in flat(dry.stdout) and "asks uv for Python 3.99" in flat(
        dry.stdout)
    proc = envguard(w, "restore", path, "--python", w.polluted, "--into", new, "--no-index",
                    "--find-links", w.good_wheels)
    assert proc.returncode == ExitCode.ENVIRONMENT_ERROR, proc.stderr
    assert "creating a venv with Python 3.99 " in proc.stderr
    error = proc.stderr.splitlines()[-1]
    assert error.startswith("envguard: error: creating the venv: uv exit status")
    assert "3.99" in error
    assert not new.exists() and not leftovers(new)


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["{not json", None, "future"])
def test_bad_good_json_is_one_line_exit_2(world: World, content: str | None) -> None:
    w = world
    path = w.root / f"bad-{content!s:.6}.json"
    if content == "future":
        data = json.loads(w.good_json.read_text())
        path.write_text(json.dumps({**data, "schema": "envguard.snapshot/99"}))
    elif content is not None:
        path.write_text(content)
    proc = envguard(w, "restore", path, "--python", w.polluted, "--dry-run")
    assert proc.returncode == ExitCode.USAGE
    assert proc.stdout == "" and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"envguard: error: {path}: ")
    assert "Traceback" not in proc.stderr


def test_into_a_non_empty_folder_is_refused(world: World) -> None:
    w = world
    busy = w.root / "busy"
    busy.mkdir()
    (busy / "precious.txt").write_text("keep me")
    proc = restore(w, "--into", busy)
    assert proc.returncode == ExitCode.USAGE
    assert proc.stderr.count("\n") == 1 and "not empty" in proc.stderr
    assert [p.name for p in busy.iterdir()] == ["precious.txt"] and not leftovers(busy)


def test_hostile_names_and_versions_are_shown_sanitized(world: World) -> None:
    w = world
    data = json.loads(w.good_json.read_text())
    template = data["packages"][0]
    hostile = [("\x1b[31mevil\x1b[0m", "1.0"), ("[red]boom[/red]", "1.0"),
               ("fine", "1.0\x1b]0;pwned\x07"), ("also-fine", "[bold]2.0"),
               ("inject", "1.0\n--index-url http://evil.example/")]
    data["packages"] += [{**template, "name": n, "version": v, "direct_url": None}
                         for n, v in hostile]
    path = w.root / "hostile.json"
    path.write_text(json.dumps(data))
    req = w.root / "hostile-req.txt"
    for fmt in ("text", "json", "markdown"):
        proc = envguard(w, "restore", path, "--python", w.polluted, "--dry-run", "--all",
                        "--format", fmt, "--requirements-out", req)
        assert proc.returncode == ExitCode.OK, proc.stderr
        assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stdout
    md = envguard(w, "restore", path, "--python", w.polluted, "--dry-run", "--format",
                  "markdown").stdout
    assert md.startswith("## envguard restore: ") and "| action | package |" in md
    assert "\\[red\\]boom\\[/red\\]" in md  # markup characters escaped, shown
    text = envguard(w, "restore", path, "--python", w.polluted, "--dry-run").stdout
    assert "[red]boom[/red]" in text and "[bold]2.0" in text  # shown, not interpreted
    assert "\\x1b[31mevil" in text
    assert text.count(SKIP) >= len(hostile)
    lines = req.read_text().splitlines()
    assert not any("evil" in ln or "boom" in ln for ln in lines if not ln.startswith("#"))
    assert not any(ln.startswith("--index-url") for ln in lines)


# --- planning, pure ----------------------------------------------------------------------


def _dist(name: str, version: str | None, direct: DirectUrl | None = None) -> Distribution:
    return Distribution(name=name, version=version, location="/x", metadata_dir="m",
                        direct_url=direct, editable=bool(direct and direct.editable))


def test_requirements_for_each_kind_of_source(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    wheel = tmp_path / "w-1.0-py3-none-any.whl"
    wheel.write_bytes(b"zip")
    vcs = DirectUrl(url="https://github.com/o/r.git", vcs="git", commit_id="a" * 40,
                    subdirectory="pkg")
    cases = {
        "index": (_dist("n", "2.11.0+cu128"), ("n==2.11.0+cu128", "index")),
        "vcs": (_dist("n", "1.0", vcs),
                (f"n @ git+https://github.com/o/r.git@{'a' * 40}#subdirectory=pkg", "vcs")),
        "editable": (_dist("n", "1.0", DirectUrl(url=src.as_uri(), editable=True)),
                     (f"-e {src}", "editable")),
        "gone-editable": (_dist("n", "1.0", DirectUrl(url=(tmp_path / "no").as_uri(),
                                                      editable=True)), (None, "editable")),
        "wheel": (_dist("n", "1.0", DirectUrl(url=wheel.as_uri(), archive_hash="sha256=ab")),
                  (f"n @ {wheel.as_uri()}", "archive")),
        "gone-wheel": (_dist("n", "1.0", DirectUrl(url=(tmp_path / "x.whl").as_uri())),
                       ("n==1.0", "index")),
        "no-commit": (_dist("n", "1.0", DirectUrl(url="https://h/r", vcs="git")),
                      (None, "vcs")),
        "bad-version": (_dist("n", "1.0 --hash=x"), (None, "index")),
    }
    for label, (dist, expected) in cases.items():
        assert requirement_for(dist)[:2] == expected, label
    assert "is gone" in requirement_for(cases["gone-wheel"][0])[2]


def test_pylock_direct_sources_validate_with_packaging(tmp_path: Path, world: World) -> None:
    """packaging's own PEP 751 validator accepts the vcs/directory/archive entries.

    (Index entries carry no wheel hashes, which a snapshot does not record; the validator
    rejects those, as docs/RESTORE.md says.)"""
    pylock = pytest.importorskip("packaging.pylock")
    src = tmp_path / "src"
    src.mkdir()
    good = read_snapshot(world.good_json)
    dists = [_dist("v", "1.0", DirectUrl(url="https://github.com/o/r.git", vcs="git",
                                          commit_id="b" * 40)),
             _dist("e", "0.1", DirectUrl(url=src.as_uri(), editable=True)),
             _dist("a", "2.0", DirectUrl(url="https://files.example/a-2.0-py3-none-any.whl",
                                          archive_hash="sha256=" + "c" * 64))]
    good = dataclasses.replace(good, packages=dists)
    plan = plan_restore(good, good, good_name="g.json")
    doc = tomllib.loads(pylock_text(plan, good))
    lock = pylock.Pylock.from_dict(doc)
    assert {p.name for p in lock.packages} == {"v", "e", "a"}
    assert sync_requirements(plan).splitlines() == [
        "a @ https://files.example/a-2.0-py3-none-any.whl", f"-e {src}",
        f"v @ git+https://github.com/o/r.git@{'b' * 40}"]
    assert "# not reproducible" not in requirements_text(plan)


def test_uv_error_lines_old_and_new_formats() -> None:
    new = ("Using Python 3.11", "error: No solution found when resolving dependencies",
           "  cause: Because x was not found, we can conclude that it is unsatisfiable.")
    old = ("  × No solution found when resolving dependencies:",
           "  ╰─▶ Because x was not found, we can conclude that it is unsatisfiable.")
    assert error_line(new) == ("error: No solution found when resolving dependencies: "
                               "Because x was not found, we can conclude that it is "
                               "unsatisfiable.")
    assert error_line(old).startswith("No solution found") and "Because x" in error_line(old)
    assert error_line(("just this",)) == "just this" and error_line(()) == "no output"


# --- the conda restore report, pure ------------------------------------------------------


def _conda_report(**changes: Any) -> Any:
    from envguard.restore.report import CondaRestoreReport

    base = CondaRestoreReport(
        good_name="good.json", packages=4, pip_requirements=("tqdm==4.66.1", "x|y==1"),
        explicit="/w/good.conda-explicit.txt", environment_yml="/w/good.environment.yml",
        left_out=("evil\x1b[31m",), platform="linux-64", target="/w/new",
        tools=("micromamba",), commands=("micromamba create -p /w/new -f /w/x.txt",),
        then="uv pip install --python /w/new/bin/python -- \"tqdm==4.66.1\" 'x|y==1'")
    return dataclasses.replace(base, **changes)


def test_a_conda_restore_report_renders_in_every_format() -> None:
    from envguard.render import render

    planned, built = _conda_report(), _conda_report(
        built=True, tool="micromamba", differences=("cudatoolkit: build h1 ≠ h2",))
    text = render(planned, "text")
    assert "recreate it with one of:\n    micromamba create -p /w/new" in text
    assert "then: uv pip install --python /w/new/bin/python -- " in text
    assert "'x|y==1'" in text and "\x1b" not in text and "evil\\x1b[31m" in text
    assert "differs: cudatoolkit: build h1 ≠ h2" in render(built, "text")
    assert "verified: the conda packages match GOOD" in render(
        dataclasses.replace(built, differences=()), "text")
    doc = json.loads(render(built, "json"))
    assert doc["schema"] == "envguard.restore/1" and doc["conda"]["tool"] == "micromamba"
    assert doc["conda"]["built"] is True and doc["conda"]["pip"] == ["tqdm==4.66.1", "x|y==1"]
    assert "tool" not in json.loads(render(planned, "json"))["conda"]
    md = render(planned, "markdown")
    assert md.startswith("## envguard restore: good.json (conda)")
    assert "```console\nmicromamba create -p /w/new -f /w/x.txt\n```" in md
    assert "\x1b" not in md
    assert "**1 difference(s)**" in render(built, "markdown")


def test_a_restore_report_with_its_proof_is_one_markdown_document(world: World) -> None:
    from envguard.render import render
    from envguard.restore.report import RestoreReport
    from envguard.restore.verify import Unreproduced, Verification

    good = read_snapshot(world.good_json)
    plan = plan_restore(good, dataclasses.replace(good, packages=good.packages[1:]),
                        good_name="good.json")
    proof = Verification(good_name="good.json", new_name="/w/new", findings=(), ignored=(),
                         unreproduced=(Unreproduced(name="torch", problem="build", good="a",
                                                    new="b", detail="torch | build a ≠ b"),))
    md = render(RestoreReport(plan=plan, target="/w/new", verification=proof), "markdown")
    assert md.count("## envguard restore: good.json") == 1
    assert f"| install | {good.packages[0].name} |" in md.replace("\\_", "_")
    assert "### Verified good.json → /w/new" in md
    assert "**1 package difference(s) could not be reproduced**" in md
    assert "- build: torch \\| build a ≠ b" in md  # a table character escaped
