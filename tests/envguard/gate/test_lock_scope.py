"""What a lock pins (issue 34, item 1): the whole environment with no project metadata,
the closure of ``-r`` files and ``--distribution`` otherwise; a refused lock leaves nothing.

Real uv-built venvs from tiny wheels (``alpha`` requires ``beta``; ``gamma`` and ``delta``
stand alone), a project folder with a ``train.py`` and no ``pyproject.toml``, and envguard
run as a real subprocess with the venv activated as ``source .venv/bin/activate`` does it
(``VIRTUAL_ENV`` and ``PATH``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from envguard.errors import InputError
from envguard.exitcodes import ExitCode
from envguard.gate import read_lock
from envguard.gate.bless import exclusive
from envguard.gate.requirements import read_requirements
from tests.wheelfactory import Venv, VenvFactory, build_wheel

TRAIN = "import sys\nprint('train argv=' + ' '.join(sys.argv[1:]))\n"


def _wheels(folder: Path) -> dict[str, Path]:
    return {
        "alpha": build_wheel(folder, "alpha", "1.0", {"alpha/__init__.py": "A = 1\n"},
                             requires=("beta>=1",)),
        "beta": build_wheel(folder, "beta", "1.0", {"beta/__init__.py": "B = 1\n"}),
        "gamma": build_wheel(folder, "gamma", "1.0", {"gamma/__init__.py": "C = 1\n"}),
        "delta": build_wheel(folder, "delta", "1.0", {"delta/__init__.py": "D = 1\n"}),
        "sglang": build_wheel(folder, "sglang", "0.5.6", {"sglang/__init__.py": ""}),
    }


def _rebuilt(folder: Path, name: str) -> Path:
    """Another build of ``name`` 1.0 (kept out of the --find-links folder)."""
    return build_wheel(folder / "rebuilt", name, "1.0",
                       {f"{name}/__init__.py": "# rebuilt\n"},
                       requires=("beta>=1",) if name == "alpha" else ())


@pytest.fixture
def env(venvs: VenvFactory, wheel_dir: Path) -> Venv:
    """alpha, beta, gamma and delta, installed by uv: one test's own, to change."""
    wheels = _wheels(wheel_dir)
    made = venvs.create()
    venvs.uv_install(made, *(wheels[n] for n in ("alpha", "beta", "gamma", "delta")))
    return made


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder with a train.py and nothing else: no pyproject.toml, no lockfiles/."""
    folder = (tmp_path / "train").resolve()
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    return folder


def activated(env: Venv) -> dict[str, str]:
    """The variables ``source .venv/bin/activate`` sets."""
    out = {k: v for k, v in os.environ.items()
           if k not in ("ENVGUARD_VERIFIED", "ENVGUARD_PYTHON", "CONDA_PREFIX")}
    out["VIRTUAL_ENV"] = str(env.path)
    out["PATH"] = f"{env.path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    return out


def envguard(*args: str | Path, cwd: Path, env: Venv) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd,
                          env=activated(env), capture_output=True, text=True, timeout=120,
                          check=False)


def pinned(project: Path, name: str = "train") -> list[str]:
    (entry,) = read_lock(project / "lockfiles" / f"{name}.toml").entries
    return [p.name for p in entry.packages]


def left_behind(project: Path) -> list[str]:
    """Everything in the project but what the test made."""
    return sorted(str(p.relative_to(project)) for p in project.rglob("*")
                  if p.name not in ("train.py", "requirements.txt", "base.txt", "pyproject.toml"))


# ------------------------------------------------------------- the whole environment

def test_day_one_lock_pins_every_distribution(project: Path, env: Venv,
                                              venvs: VenvFactory, wheel_dir: Path) -> None:
    """README's day-one example as printed: `envguard lock train`, then `envguard run --lock
    train -- python train.py --config big.yaml`; a package added afterwards is refused."""
    done = envguard("lock", "train", cwd=project, env=env)
    assert done.returncode == ExitCode.OK, done.stderr
    assert "lockfiles/train.toml: added entry" in done.stdout
    lock = read_lock(project / "lockfiles" / "train.toml")
    assert (lock.scope, lock.distribution, lock.requires) == ("environment", "", ())
    assert pinned(project) == ["alpha", "beta", "delta", "gamma"]

    run = envguard("run", "--lock", "train", "--", "python", "train.py", "--config", "big.yaml",
                   cwd=project, env=env)
    assert run.returncode == ExitCode.OK, run.stderr
    assert "train argv=--config big.yaml" in run.stdout

    venvs.uv_install(env, build_wheel(wheel_dir, "epsilon", "1.0", {"epsilon/__init__.py": ""}))
    check = envguard("check", "train", cwd=project, env=env)
    assert check.returncode == ExitCode.DRIFT, check.stdout + check.stderr
    assert "epsilon" in check.stdout and "[package-added]" in check.stdout


def test_a_rebuilt_package_is_refused_by_a_whole_environment_lock(
        project: Path, env: Venv, venvs: VenvFactory, wheel_dir: Path) -> None:
    assert envguard("lock", "train", cwd=project, env=env).returncode == ExitCode.OK
    assert envguard("check", "train", cwd=project, env=env).returncode == ExitCode.OK
    venvs.uv_install(env, _rebuilt(wheel_dir, "gamma"), reinstall=True)
    check = envguard("check", "train", cwd=project, env=env)
    assert check.returncode == ExitCode.DRIFT, check.stdout
    assert "[package-build-changed]" in check.stdout and "gamma" in check.stdout


def test_a_project_name_still_locks_its_closure(project: Path, env: Venv) -> None:
    """The miss: a pyproject.toml that names a project keeps the project's closure."""
    (project / "pyproject.toml").write_text(
        '[project]\nname = "trainer"\nversion = "0"\ndependencies = ["alpha"]\n')
    done = envguard("lock", "train", cwd=project, env=env)
    assert done.returncode == ExitCode.OK, done.stderr
    lock = read_lock(project / "lockfiles" / "train.toml")
    assert (lock.scope, lock.distribution) == ("closure", "trainer")
    assert pinned(project) == ["alpha", "beta"]


def test_tool_envguard_files_are_pinned_and_the_lock_is_not(project: Path, env: Venv) -> None:
    """With no --file, a new lock pins ``[tool.envguard] files``; a pattern that matches the
    lock itself (lockfiles/*) leaves the lock and its snapshots out."""
    (project / "pyproject.toml").write_text(
        '[tool.envguard]\nfiles = ["*.py", "lockfiles/**/*"]\n')
    done = envguard("lock", "train", cwd=project, env=env)
    assert done.returncode == ExitCode.OK, done.stderr
    lock = read_lock(project / "lockfiles" / "train.toml")
    assert lock.scope == "environment"  # a pyproject.toml with no [project]
    assert [f.path for f in lock.files] == ["train.py"]
    assert envguard("check", "train", cwd=project, env=env).returncode == ExitCode.OK
    (project / "train.py").write_text(TRAIN + "# edited\n")
    check = envguard("check", "train", cwd=project, env=env)
    assert check.returncode == ExitCode.DRIFT and "[file-changed]" in check.stdout


# ------------------------------------------------------------- -r and --distribution

def test_requirements_narrow_the_lock_to_their_closure(project: Path, env: Venv,
                                                       venvs: VenvFactory,
                                                       wheel_dir: Path) -> None:
    """Names only: versions, hashes, option lines, comments and markers that do not apply
    are left out; `-r base.txt` inside is read too. gamma (outside) may change; beta
    (alpha requires it) may not."""
    (project / "base.txt").write_text("alpha >= 0.5 \\\n    --hash=sha256:00ff  # pinned\n")
    (project / "requirements.txt").write_text(
        "# the training job\n--index-url https://example.invalid/simple\n-r base.txt\n\n"
        "delta ; python_version < '3'\n-e ./somewhere\n")
    done = envguard("lock", "train", "-r", "requirements.txt", cwd=project, env=env)
    assert done.returncode == ExitCode.OK, done.stderr
    lock = read_lock(project / "lockfiles" / "train.toml")
    assert (lock.scope, lock.distribution, lock.requires) == ("closure", "", ("alpha",))
    assert pinned(project) == ["alpha", "beta"]

    venvs.uv_install(env, _rebuilt(wheel_dir, "gamma"), reinstall=True)
    assert envguard("check", "train", cwd=project, env=env).returncode == ExitCode.OK
    venvs.uv_install(env, _rebuilt(wheel_dir, "beta"), reinstall=True)
    check = envguard("check", "train", cwd=project, env=env)
    assert check.returncode == ExitCode.DRIFT and "beta" in check.stdout


def test_repeated_requirements_and_distributions_add_up(project: Path, env: Venv) -> None:
    (project / "requirements.txt").write_text("alpha\n")
    (project / "base.txt").write_text("gamma\n")
    done = envguard("lock", "train", "-r", "requirements.txt", "-r", "base.txt", cwd=project,
                    env=env)
    assert done.returncode == ExitCode.OK, done.stderr
    assert pinned(project) == ["alpha", "beta", "gamma"]
    again = envguard("lock", "dist", "--distribution", "gamma", "--distribution", "delta",
                     cwd=project, env=env)
    assert again.returncode == ExitCode.OK, again.stderr
    lock = read_lock(project / "lockfiles" / "dist.toml")
    assert (lock.distribution, lock.requires) == ("gamma", ("delta",))
    assert pinned(project, "dist") == ["delta", "gamma"]


def test_a_requirement_not_installed_is_one_line(project: Path, env: Venv) -> None:
    (project / "requirements.txt").write_text("alpha\nzeta==2\n")
    done = envguard("lock", "train", "-r", "requirements.txt", cwd=project, env=env)
    assert done.returncode == ExitCode.USAGE, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("envguard: error: zeta is not installed in "), line
    assert left_behind(project) == []


@pytest.mark.parametrize("bad", ["alpha >=< 1", "./dist/alpha-1.0-py3-none-any.whl",
                                 "alpha[", "https://example.invalid/alpha.whl"])
def test_a_malformed_requirement_line_is_one_line_naming_file_and_line(
        project: Path, env: Venv, bad: str) -> None:
    (project / "requirements.txt").write_text(f"# ok\nalpha\n{bad}\n")
    done = envguard("lock", "train", "-r", "requirements.txt", cwd=project, env=env)
    assert done.returncode == ExitCode.USAGE, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("envguard: error: requirements.txt:3: not a requirement"), line
    assert done.stdout == "" and left_behind(project) == []


def test_requirement_files_parse(tmp_path: Path) -> None:
    """The parser alone: the hit (names, extras, markers, where) and the misses (a cycle,
    a missing file)."""
    (tmp_path / "a.txt").write_text("Alpha[x,y]==1 ; sys_platform == 'linux'\n-rb.txt\n")
    (tmp_path / "b.txt").write_text("\n# nothing\nbeta  # trailing\n--requirement=c.txt\n")
    (tmp_path / "c.txt").write_text("gamma @ https://example.invalid/g.whl#egg=gamma\n")
    found = read_requirements(tmp_path / "a.txt")
    assert [(w.root, w.marker) for w in found] == [
        ("Alpha[x,y]", 'sys_platform == "linux"'), ("beta", None), ("gamma", None)]
    assert [w.where.rsplit("/", 1)[-1] for w in found] == ["a.txt:1", "b.txt:3", "c.txt:1"]
    (tmp_path / "c.txt").write_text("-r a.txt\n")
    with pytest.raises(InputError, match="a cycle"):
        read_requirements(tmp_path / "a.txt")
    with pytest.raises(InputError):
        read_requirements(tmp_path / "missing.txt")


# ------------------------------------------------------------- nothing left behind

def test_a_refused_lock_leaves_nothing_behind(project: Path, venvs: VenvFactory,
                                              wheel_dir: Path) -> None:
    """Forbidden packages installed: exit 2, and no lockfiles/ folder, no .train.toml.lock,
    no snapshot; with lockfiles/ already there, it stays empty."""
    wheels = _wheels(wheel_dir)
    polluted = venvs.create()
    venvs.uv_install(polluted, wheels["alpha"], wheels["beta"], wheels["sglang"])
    done = envguard("lock", "train", cwd=project, env=polluted)
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert "forbidden packages installed: sglang" in done.stderr
    assert left_behind(project) == []
    (project / "lockfiles").mkdir()
    assert envguard("lock", "train", cwd=project, env=polluted).returncode == ExitCode.USAGE
    assert left_behind(project) == ["lockfiles"]
    # The hit beside the miss: a lock that succeeds leaves its files (the .lock stays).
    fine = envguard("lock", "train", "--forbid", "nothing-matches", cwd=project, env=polluted)
    assert fine.returncode == ExitCode.OK, fine.stderr
    (entry,) = read_lock(project / "lockfiles" / "train.toml").entries
    assert left_behind(project) == ["lockfiles", "lockfiles/.train.toml.lock",
                                    "lockfiles/train.snapshots",
                                    f"lockfiles/train.snapshots/{entry.id}.json",
                                    "lockfiles/train.toml"]


def test_exclusive_removes_what_it_made_when_the_write_fails(tmp_path: Path) -> None:
    path = tmp_path / "new" / "lockfiles" / "x.toml"
    with pytest.raises(RuntimeError), exclusive(path):
        assert (path.parent / ".x.toml.lock").is_file()
        raise RuntimeError("the write failed")
    assert not (tmp_path / "new").exists()
    # Made by someone else before: it stays.
    path.parent.mkdir(parents=True)
    (path.parent / ".x.toml.lock").write_text("")
    with pytest.raises(RuntimeError), exclusive(path):
        raise RuntimeError("the write failed")
    assert (path.parent / ".x.toml.lock").is_file()


def test_a_waiter_locks_again_when_the_maker_removes_the_file(tmp_path: Path) -> None:
    """The maker fails and removes the file while another waits on it: the waiter must not
    go on holding a lock on a file no longer there (a third would lock a new one)."""
    path = tmp_path / "lockfiles" / "x.toml"
    lock_file = path.parent / ".x.toml.lock"
    entered = threading.Event()
    release = threading.Event()
    seen: list[bool] = []

    def maker() -> None:
        try:
            with exclusive(path):
                entered.set()
                release.wait(10)
                raise RuntimeError("the write failed")
        except RuntimeError:
            pass

    def waiter() -> None:
        with exclusive(path):
            seen.append(lock_file.is_file())

    first = threading.Thread(target=maker)
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=waiter)
    second.start()
    time.sleep(0.3)  # the waiter is polling the maker's file
    assert not seen
    release.set()
    first.join(10)
    second.join(10)
    assert seen == [True]


def _small_files() -> None:
    """In the child: files may grow to 4 KiB, and a larger write fails (EFBIG) instead of
    killing the process: a full disk, for real, for the lock's snapshot."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_a_lock_whose_write_fails_leaves_nothing_behind(project: Path, env: Venv) -> None:
    """The write under the lock fails (the snapshot is larger than the file size limit, set
    in the child: the one way here to make a real write fail for root): exit 5, and the
    .lock file and the folders the command made are gone again. The child writes no
    bytecode: Python would keep a .pyc cut short at the limit, and every later import of
    that module would fail."""
    variables = activated(env) | {"PYTHONDONTWRITEBYTECODE": "1",
                                  "ENVGUARD_NO_BYTECODE_CACHE": "1"}
    done = subprocess.run([sys.executable, "-m", "envguard", "lock", "train"], cwd=project,
                          env=variables, capture_output=True, text=True, timeout=120,
                          check=False, preexec_fn=_small_files)
    assert done.returncode == ExitCode.OUTPUT_ERROR, done.stderr
    assert left_behind(project) == []
