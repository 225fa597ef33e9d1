"""A uv command's prediction is applied by moving the copy's new files into the venv
(envguard/install/transplant.py): uv runs once. Real uv venvs from tiny wheels, envguard as
a real subprocess or its API, offline.

The proof that moving is the installer's own work: the same venv is built twice at the same
path, once changed through ``envguard install`` and once by uv alone, and the two trees
(every file's bytes and mode, every link, every folder's mode) must be equal.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from envguard.install.command import parse_command
from envguard.install.predict import InstallPlan, predict
from envguard.install.scratch import wait_for_removals
from envguard.install.transplant import discard, transplant
from envguard.install.uninstalls import TransplantFailed
from tests.envguard.install.test_install import drifty_project, envguard, no_copy_left
from tests.wheelfactory import VenvFactory, build_wheel, run_checked

pytestmark = pytest.mark.usefixtures("no_state_leak")


@pytest.fixture
def no_state_leak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """envguard's state (revisions, kept builds) under this test's folder."""
    monkeypatch.setenv("ENVGUARD_CACHE_DIR", str(tmp_path / "state"))


def tree(root: Path) -> dict[str, str]:
    """Every entry below ``root``: a file's mode and digest, a link's target, a folder's
    mode. uv's own lock file is left out (both venvs have one), and a ``.pyc`` file is
    there or not (marshal's bytes vary between two compilations of one source)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "link:" + os.readlink(path)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = f"dir:{st.st_mode & 0o7777:o}"
            elif rel.endswith(".pyc"):
                out[rel] = f"{st.st_mode & 0o7777:o}:bytecode"
            elif rel != ".lock":
                with open(path, "rb") as f:
                    out[rel] = f"{st.st_mode & 0o7777:o}:" + hashlib.sha256(f.read()).hexdigest()
    return out


def wheels(where: Path) -> None:
    build_wheel(where, "tool", "1.0", {"tool/__init__.py": "V = 1\n",
                                       "tool/old.py": "OLD = True\n",
                                       "tool/deep/inner/x.py": "X = 1\n"})
    build_wheel(where, "tool", "2.0", {"tool/__init__.py": "V = 2\n",
                                       "tool/cli.py": "def main():\n    return 0\n",
                                       "tool/sub/__init__.py": ""},
                requires=("helper",), scripts={"tool-cli": "tool.cli:main"})
    build_wheel(where, "helper", "1.0", {"helper.py": "H = 1\n"},
                scripts={"helper-cli": "helper:H"})
    build_wheel(where, "extra", "1.0", {"extra/__init__.py": ""})
    for part in "abc":  # three distributions sharing the namespace folder ns/
        build_wheel(where, f"ns{part}", "1.0", {f"ns/{part}/__init__.py": f"P = {part!r}\n",
                                                f"ns/{part}/deep/mod.py": ""})


def base(venvs: VenvFactory) -> Path:
    """A venv at ``venvs.root/env`` holding tool 1.0, extra, nsa and nsb, bytecode
    written."""
    venv = venvs.create("env")
    run_checked([venvs.uv, "pip", "install", "--quiet", "--python", str(venv.python),
                 "--no-index", "--find-links", str(venvs.wheels), "tool==1.0", "extra", "nsa",
                 "nsb"],
                env=venvs._env())
    environ = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    run_checked([str(venv.python), "-c",
                 "import tool, tool.old, tool.deep.inner.x, ns.a.deep.mod, ns.b"], env=environ)
    site = next(venv.path.glob("lib/python3*/site-packages"))
    assert list((site / "tool" / "deep" / "inner" / "__pycache__").glob("x.*.pyc"))
    return venv.path


COMMANDS = {
    "upgrade, a new dependency, console scripts": ["install", "tool==2.0"],
    "uninstall, bytecode and emptied folders": ["uninstall", "tool"],
    "same-version reinstall": ["install", "--reinstall", "tool==1.0"],
    "sync to a smaller set": ["sync", "{reqs}"],
    "uninstall from a shared folder": ["uninstall", "nsa"],
    "install into a shared folder": ["install", "nsc"],
}


@pytest.mark.parametrize("words", COMMANDS.values(), ids=list(COMMANDS))
def test_a_moved_change_is_byte_for_byte_the_installer_s_own(
        venvs: VenvFactory, tmp_path: Path, words: list[str]) -> None:
    wheels(venvs.wheels)
    reqs = tmp_path / "reqs.txt"
    reqs.write_text("extra==1.0\n", encoding="utf-8")
    words = [str(reqs) if w == "{reqs}" else w for w in words]
    index = ["--no-index", "--find-links", str(venvs.wheels)] if words[0] != "uninstall" else []
    cwd = tmp_path / "work"
    cwd.mkdir()
    env = base(venvs)
    proc = envguard("install", "--yes", "--format", "json", "--python", str(env), "--", "uv",
                    "pip", words[0], *index, *words[1:], cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    applied = json.loads(proc.stdout)["applied"]
    assert applied["moved"] is True, applied
    assert applied["as_predicted"] is True
    guarded = tree(env)
    shutil.rmtree(env)
    assert base(venvs) == env
    run_checked([venvs.uv, "pip", words[0], "--quiet", "--python", str(env / "bin" / "python"),
                 *index, *words[1:]], env=venvs._env())
    plain = tree(env)
    assert guarded == plain
    assert no_copy_left(env)


def _plan(env: Path, *words: str, wheels_at: Path, cwd: Path):  # type: ignore[no-untyped-def]
    command = parse_command(["uv", "pip", *words, "--no-index", "--find-links",
                             str(wheels_at)], uv=shutil.which("uv") or _uv())
    return predict(command, python=str(env / "bin" / "python"), cwd=cwd, stage=True,
                   env={**os.environ, "UV_OFFLINE": "1", "UV_NO_CONFIG": "1"}), command


def _uv() -> str:
    from uv import find_uv_bin

    return str(find_uv_bin())


def refused_and_put_back(plan: InstallPlan, env: Path, match: str) -> None:
    """The move of ``plan`` fails with ``match``, and the venv is as it was before it."""
    assert plan.staged is not None
    before = tree(env)
    with pytest.raises(TransplantFailed, match=match):
        transplant(plan.staged)
    discard(plan.staged)
    wait_for_removals()
    assert tree(env) == before


def test_a_failed_move_puts_everything_back(venvs: VenvFactory, tmp_path: Path) -> None:
    """A folder where the installer wrote a file stops the move half-way (tool 1.0's files
    are aside by then): every step is played back."""
    wheels(venvs.wheels)
    env = base(venvs)
    plan, _ = _plan(env, "install", "tool==2.0", wheels_at=venvs.wheels, cwd=tmp_path)
    assert plan.staged is not None
    site = next(env.glob("lib/python3*/site-packages"))
    (site / "tool" / "sub" / "__init__.py").mkdir(parents=True)  # where a file goes
    refused_and_put_back(plan, env, "is a folder where the installer wrote a file")
    assert no_copy_left(env)


def test_a_planted_link_is_never_written_through(venvs: VenvFactory, tmp_path: Path) -> None:
    wheels(venvs.wheels)
    env = base(venvs)
    plan, _ = _plan(env, "install", "tool==2.0", wheels_at=venvs.wheels, cwd=tmp_path)
    assert plan.staged is not None
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    site = next(env.glob("lib/python3*/site-packages"))
    os.rename(site / "tool", tmp_path / "tool-moved")
    (site / "tool").symlink_to(elsewhere)
    refused_and_put_back(plan, env, "is a link")
    assert list(elsewhere.iterdir()) == []


def test_a_stale_prediction_runs_the_installer_instead(venvs: VenvFactory,
                                                       tmp_path: Path) -> None:
    """Another install between the prediction and the change: the copy no longer says what
    the venv would become, so uv runs in the venv itself, and says why."""
    from envguard.install.apply import apply_install

    wheels(venvs.wheels)
    env = base(venvs)
    build_wheel(venvs.wheels, "late", "1.0", {"late.py": ""})
    plan, command = _plan(env, "install", "tool==2.0", wheels_at=venvs.wheels, cwd=tmp_path)
    run_checked([venvs.uv, "pip", "install", "--quiet", "--python", str(env / "bin" / "python"),
                 "--no-index", "--find-links", str(venvs.wheels), "late"], env=venvs._env())
    applied = apply_install(plan, command, cwd=tmp_path,
                            env={**os.environ, "UV_OFFLINE": "1", "UV_NO_CONFIG": "1"})
    assert (applied.moved, applied.exit_code) == (False, 0)
    assert "appeared since the prediction" in applied.why_run
    assert applied.differences == ("late 1.0 is installed, not predicted",)
    site = next(env.glob("lib/python3*/site-packages"))
    assert (site / "late.py").exists() and (site / "tool" / "cli.py").exists()
    wait_for_removals()
    assert no_copy_left(env)


def test_compiled_bytecode_is_left_to_the_installer(venvs: VenvFactory, tmp_path: Path) -> None:
    """``--compile-bytecode`` writes .pyc files that name the copy's folder: uv runs again
    in the venv, and the bytecode there names the venv's own files."""
    wheels(venvs.wheels)
    env = base(venvs)
    cwd = tmp_path / "work"
    cwd.mkdir()
    proc = envguard("install", "--format", "json", "--python", str(env), "--", "uv", "pip",
                    "install", "--compile-bytecode", "--no-index", "--find-links",
                    str(venvs.wheels), "tool==2.0", cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    applied = json.loads(proc.stdout)["applied"]
    assert applied["moved"] is False and "compiled bytecode" in applied["why_run"]
    pyc = next(next(env.glob("lib/python3*/site-packages")).glob("tool/__pycache__/cli.*.pyc"))
    assert str(env).encode() in pyc.read_bytes()
    assert b"envguard-scratch" not in pyc.read_bytes()


def test_what_is_installed_is_the_build_that_was_judged(venvs: VenvFactory,
                                                         tmp_path: Path) -> None:
    """A local project whose backend makes another build every time: uv builds it once, on
    the copy, and that very build is installed (pip builds it twice and differs)."""
    venv = venvs.create("env")
    project = drifty_project(tmp_path)
    proc = envguard("install", "--format", "json", "--python", str(venv.path), "--", "uv",
                    "pip", "install", str(project), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["applied"]["moved"] is True
    assert report["applied"]["as_predicted"] is True
    assert report["verdict"] == "installed as predicted"


def test_the_recorded_state_after_a_move_is_what_a_snapshot_reads(
        venvs: VenvFactory, tmp_path: Path) -> None:
    """After a move, the revision's state after is the prediction, proven by reading back
    every changed distribution's RECORD; it must equal a fresh snapshot of the venv, and a
    RECORD that differs is caught."""
    from envguard.install.apply import apply_install, read_back
    from envguard.install.predict import snapshot_options
    from envguard.probe import collect
    from envguard.revisions.store import list_revisions, load_snapshot

    wheels(venvs.wheels)
    env = base(venvs)
    plan, command = _plan(env, "install", "tool==2.0", wheels_at=venvs.wheels, cwd=tmp_path)
    applied = apply_install(plan, command, cwd=tmp_path,
                            env={**os.environ, "UV_OFFLINE": "1", "UV_NO_CONFIG": "1"})
    assert applied.moved and applied.revision is not None and not applied.differences
    (revision,) = list_revisions(str(env)).revisions
    stored = load_snapshot(str(env), revision.after)
    fresh = collect(snapshot_options(str(env / "bin" / "python"), memo=False))

    def packages(s):  # type: ignore[no-untyped-def]
        return sorted((p.name, p.version, p.fingerprint, p.metadata_dir, p.location)
                      for p in s.packages)

    assert packages(stored) == packages(fresh)
    assert read_back(plan)
    record = next(env.glob("lib/python3*/site-packages/tool-2.0.dist-info")) / "RECORD"
    with open(record, "a", encoding="utf-8") as f:
        f.write("tool/planted.py,sha256=AAAA,1\n")
    assert not read_back(plan)


def test_a_record_row_through_a_link_out_of_the_venv_is_left_alone(
        venvs: VenvFactory, tmp_path: Path) -> None:
    """A RECORD row whose folder is a link leading out of the venv names a file elsewhere:
    the move never sets it aside (an installer would delete it through the link)."""
    wheels(venvs.wheels)
    env = base(venvs)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("keep me", encoding="utf-8")
    site = next(env.glob("lib/python3*/site-packages"))
    (site / "tool" / "out").symlink_to(outside)
    with open(site / "tool-1.0.dist-info" / "RECORD", "a", encoding="utf-8") as f:
        f.write("tool/out/victim,,\n")
    cwd = tmp_path / "work"
    cwd.mkdir()
    proc = envguard("install", "--format", "json", "--python", str(env), "--", "uv", "pip",
                    "uninstall", "tool", cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["applied"]["moved"] is True
    assert (outside / "victim").read_text(encoding="utf-8") == "keep me"
    assert not (site / "tool-1.0.dist-info").exists()


def test_a_venv_whose_pth_imports_a_module_is_still_moved_with_bytecode_on(
        venvs: VenvFactory, tmp_path: Path) -> None:
    """A user's Python writes bytecode, and most venvs hold a ``.pth`` that imports a module
    at every start (setuptools' ``distutils-precedence.pth`` imports ``_distutils_hack``).
    envguard's probe of the copy ran that import and wrote ``__pycache__`` into the copy,
    so the move was refused and uv ran twice; the probe of the venv wrote one into the venv.
    The probe writes no bytecode: the move is made, and the venv is uv's own work."""
    wheels(venvs.wheels)
    build_wheel(venvs.wheels, "hack", "1.0", {"hack_mod.py": "HACKED = True\n",
                                              "hack-precedence.pth": "import hack_mod\n"})
    cwd = tmp_path / "work"
    cwd.mkdir()

    def made() -> Path:
        env = base(venvs)
        run_checked([venvs.uv, "pip", "install", "--quiet", "--python",
                     str(env / "bin" / "python"), "--no-index", "--find-links",
                     str(venvs.wheels), "hack"], env=venvs._env())
        return env

    env = made()
    proc = envguard("install", "--yes", "--format", "json", "--python", str(env), "--", "uv",
                    "pip", "install", "--no-index", "--find-links", str(venvs.wheels),
                    "tool==2.0", cwd=cwd, env={"PYTHONDONTWRITEBYTECODE": ""})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    applied = json.loads(proc.stdout)["applied"]
    assert applied["moved"] is True, applied
    guarded = tree(env)
    shutil.rmtree(env)
    made()
    run_checked([venvs.uv, "pip", "install", "--quiet", "--python", str(env / "bin" / "python"),
                 "--no-index", "--find-links", str(venvs.wheels), "tool==2.0"],
                env=venvs._env())
    assert guarded == tree(env)


def test_an_interruption_while_the_installer_runs_on_the_copy_stops_it(
        venvs: VenvFactory, tmp_path: Path) -> None:
    """The installer runs on the copy in the background while the venv's snapshot is taken
    and the caller's ``meanwhile`` runs: a Ctrl-C there kills the installer and removes the
    copy before it propagates, and the venv is untouched."""
    import time

    from tests.envguard.install.test_install import hashes

    wheels(venvs.wheels)
    env = base(venvs)
    before = hashes(env)
    slow = tmp_path / "slow" / "uv"  # an installer that takes a minute before it writes
    slow.parent.mkdir()
    slow.write_text(f'#!/bin/sh\nsleep 60\nexec "{shutil.which("uv") or _uv()}" "$@"\n',
                    encoding="utf-8")
    slow.chmod(0o755)
    command = parse_command([str(slow), "pip", "install", "--no-index", "--find-links",
                             str(venvs.wheels), "tool==2.0"])
    seen = []

    def meanwhile() -> None:
        seen.append([p.name for p in env.parent.iterdir() if "envguard-scratch" in p.name])
        raise KeyboardInterrupt

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        predict(command, python=str(env / "bin" / "python"), cwd=tmp_path, stage=True,
                env={**os.environ, "UV_OFFLINE": "1", "UV_NO_CONFIG": "1"},
                meanwhile=meanwhile)
    assert time.monotonic() - started < 30  # the installer was killed, not waited for
    assert seen == [[".env.envguard-scratch"]]  # it ran while the copy was in use
    wait_for_removals()
    time.sleep(0.3)  # an installer still running would write into a copy again
    assert no_copy_left(env)
    assert hashes(env) == before
