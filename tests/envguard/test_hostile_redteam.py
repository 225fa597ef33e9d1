"""The second, adversarial pass: what the first hardening pass left open, found as an
outside hostile scenario would (a local attacker, a repository a user clones), each as a
real ``python -m envguard`` subprocess with a timeout.

* a cloned repository that carries a bare repository as plain files (``HEAD``,
  ``objects/``, a ``config`` whose ``core.fsmonitor`` is a command): ``git status`` of the
  probe ran that command;
* ``fleet snapshot --dir``, a shared folder: a planted ``rank-N.json`` or ``fleet.json``
  link was written through, a FIFO hung rank 0;
* ``lock``: credential-shaped ``--entry``/``--extra``/``--forbid``/``--file`` values and
  pinned file names were written into the committed lock and shown by ``check``; a
  hand-written lock's strings reached every report; the ``--lock`` path was printed;
* ``cache status --store PATH`` printed the store path as given;
* credential shapes the redactor did not know: Google OAuth access and refresh tokens
  (``ya29.``, ``1//0``), a single-dash long flag (``-token X``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import envguard

SRC = Path(envguard.__file__).resolve().parents[1]
"""The folder holding the envguard under test (the subprocesses import the same one)."""
GHP = "ghp_" + "Rt9RedTeamT0ken" + "x" * 21
"""A GitHub token shape, unique to this file."""
VICTIM = "precious, not envguard's\n"


def envguard_cli(*args: str | Path, cwd: Path, extra: dict[str, str] | None = None,
                 timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ENVGUARD_VERIFIED"}
    env.update({"PYTHONPATH": str(SRC), "COLUMNS": "200", "HOME": str(cwd),
                "XDG_CONFIG_HOME": str(cwd / ".cfg"), "ENVGUARD_CACHE_DIR": str(cwd / ".cache"),
                **(extra or {})})
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def files_holding(root: Path, needle: str) -> list[Path]:
    """Every regular file under ``root`` whose name or content holds ``needle``."""
    hits = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            if needle in str(path.relative_to(root)) or (
                    path.is_file() and not path.is_symlink()
                    and needle in path.read_bytes().decode("utf-8", "replace")):
                hits.append(path)
    return hits


# -- git: a bare repository carried by a cloned one ---------------------------------------

@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_never_uses_a_bare_repository_found_inside_a_clone(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    marker = tmp_path / "PWNED"
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=30)
    evil = repo / "evil"  # as a clone checks it out: ordinary files, no .git
    subprocess.run(["git", "init", "-q", "--bare", str(evil)], check=True, timeout=30)
    (evil / "config").write_text(
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = ..\n"
        f"\tfsmonitor = \"touch {marker}; false\"\n")
    for cwd in (evil, evil / "objects"):
        proc = envguard_cli("snapshot", "-q", "-o", tmp_path / "s.json", cwd=cwd)
        assert proc.returncode == 0, proc.stderr
        assert not marker.exists(), "git ran the repository's core.fsmonitor command"
    # the ordinary repository above is still recorded
    proc = envguard_cli("snapshot", "-q", "--json", cwd=repo)
    assert json.loads(proc.stdout)["files"]["git"]["root"] == str(repo)
    assert not marker.exists()


# -- fleet snapshot --dir: a shared folder -----------------------------------------------

def _fleet(cwd: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    return envguard_cli("fleet", "snapshot", "-q", "--dir", folder, "--timeout", "5", cwd=cwd,
                        extra={"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}, timeout=45)


@pytest.mark.parametrize("name", ["rank-0.json", "fleet.json"])
@pytest.mark.parametrize("dangling", [False, True])
def test_fleet_dir_never_writes_through_a_planted_link(tmp_path: Path, name: str,
                                                       dangling: bool) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    victim = tmp_path / "victim.txt"
    if not dangling:
        victim.write_text(VICTIM)
    (shared / name).symlink_to(victim)
    proc = _fleet(tmp_path, shared)
    assert proc.returncode == 5, proc.stderr
    assert "link" in proc.stderr and "Traceback" not in proc.stderr
    assert (shared / name).is_symlink()
    if dangling:
        assert not victim.exists()
    else:
        assert victim.read_text() == VICTIM


def test_fleet_dir_refuses_a_fifo_at_once(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.mkfifo(shared / "rank-0.json")
    proc = _fleet(tmp_path, shared)  # before: blocked until the 45 s timeout
    assert proc.returncode == 5, proc.stderr
    assert "Traceback" not in proc.stderr


# -- lock and check: a committed file holds no credential ----------------------------------

def _project(tmp_path: Path) -> Path:
    project = tmp_path / "proj"
    (project / "conf").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "demo"\nversion = "0.1"\n')
    (project / "conf" / "a.cfg").write_text("lr = 3e-4\n")
    return project


@pytest.mark.parametrize("args", [
    ["--entry", GHP], ["--extra", GHP], ["--forbid", GHP], ["--file", f"conf/{GHP}*"],
    ["--file", "conf/*", "PINNED"]])
def test_lock_never_records_a_credential_shaped_name(tmp_path: Path, args: list[str]) -> None:
    project = _project(tmp_path)
    if args[-1] == "PINNED":
        args = args[:-1]
        (project / "conf" / f"{GHP}.cfg").write_text("x\n")
    proc = envguard_cli("lock", "demo", *args, cwd=project)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "credential" in proc.stderr
    assert GHP not in proc.stdout + proc.stderr
    assert files_holding(project / "lockfiles", GHP) == [] if (project / "lockfiles").exists() \
        else True


def test_lock_path_is_printed_redacted(tmp_path: Path) -> None:
    project = _project(tmp_path)
    proc = envguard_cli("lock", "demo", "--lock", f"lockfiles/{GHP}.toml", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert GHP not in proc.stdout + proc.stderr
    assert "lockfiles/***.toml: added entry" in proc.stdout


def test_a_hand_written_lock_shows_no_credential(tmp_path: Path) -> None:
    """A lock committed to a repository (by hand, or by an older envguard): every string of
    it is masked when read, so no check report shows one."""
    project = _project(tmp_path)
    proc = envguard_cli("lock", "demo", "--file", "conf/*", cwd=project)
    assert proc.returncode == 0, proc.stderr
    toml = project / "lockfiles" / "demo.toml"
    text = toml.read_text().replace('path = "conf/a.cfg"', f'path = "conf/{GHP}.cfg"')
    text = text.replace('"conf/*"', f'"conf/*", "https://u:{GHP}@h.example/x"')
    text = text.replace("extras = []", f'extras = ["{GHP}"]')
    toml.write_text(text)
    (project / "conf" / f"{GHP}.cfg").write_text("changed\n")
    for args in (["check", "demo"], ["check", "--lock", toml]):
        for fmt in ("text", "json", "markdown"):
            proc = envguard_cli(*args, "--format", fmt, cwd=project)
            assert proc.returncode in (0, 1), proc.stderr
            assert GHP not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-2000:]


# -- cache: the store path as given ------------------------------------------------------

def test_cache_status_shows_the_store_path_redacted(tmp_path: Path) -> None:
    store = tmp_path / "stores" / GHP
    for fmt in ([], ["--format", "json"]):
        proc = envguard_cli("cache", "status", "--store", store, *fmt, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert GHP not in proc.stdout + proc.stderr


# -- shapes and forms the redactor did not know -------------------------------------------

NEW_FORMS = {
    "TORCH_GCP_NOTE": "ya29.a0AfH6SMRedTeamCore0001xyzXYZ_-abc",
    "HF_GCP_REFRESH": "1//0gRedTeamCore0002AbCdEfGhIjKlMnOp",
    "CUDA_LAUNCHER_ARGS": "run -token RedTeamCore0003 -v",
    "NCCL_TOOL_ARGS": "-password RedTeamCore0004",
}


@pytest.mark.parametrize("fmt", ["--json", "-o"])
def test_new_credential_shapes_never_reach_a_snapshot(tmp_path: Path, fmt: str) -> None:
    out = tmp_path / "s.json"
    args = ["snapshot", "-q", *([fmt, out] if fmt == "-o" else [fmt])]
    proc = envguard_cli(*args, cwd=tmp_path, extra=NEW_FORMS)
    assert proc.returncode == 0, proc.stderr
    written = proc.stdout + proc.stderr + (out.read_text() if out.exists() else "")
    for n in range(1, 5):
        assert f"RedTeamCore000{n}" not in written
    assert "-v" in json.loads(out.read_text() if out.exists() else proc.stdout)[
        "environment"]["variables"]["CUDA_LAUNCHER_ARGS"]["value"]
