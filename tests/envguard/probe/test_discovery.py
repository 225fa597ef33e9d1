"""Which environment every command looks at: one rule (``envguard/probe/discovery.py``).

Real venvs made with uv; envguard runs as a real subprocess of *this* interpreter (the
project's venv), as a tool install would run beside an activated training venv. The conda
envs are venvs with the folders conda leaves (``conda-meta/``, ``envs/``): conda itself is
not installed here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envguard.errors import InputError
from envguard.exitcodes import ExitCode
from envguard.probe.discovery import discover, is_conda_base, shorten_home
from tests.paths import DATA
from tests.wheelfactory import Venv, VenvFactory, build_wheel

DISCOVERY_VARS = ("VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "_CONDA_ROOT",
                  "CONDA_ROOT", "ENVGUARD_PYTHON", "ENVGUARD_VERIFIED")
MAIN = "import sys\n\ndef main():\n    print('tool ran under', sys.executable)\n"


def envguard(*args: str | Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    child = {k: v for k, v in os.environ.items() if k not in DISCOVERY_VARS}
    child.update(env)
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd,
                          env=child, capture_output=True, text=True, timeout=120, check=False)


def snapshot(cwd: Path, *args: str | Path, **env: str) -> tuple[dict[str, Any], str]:
    """The snapshot JSON and the ``envguard: environment:`` line."""
    proc = envguard("snapshot", "--json", "--verify", "none", "--no-cache-marker", *args,
                    cwd=cwd, **env)
    assert proc.returncode == ExitCode.OK, proc.stderr
    return json.loads(proc.stdout), chosen(proc)


def chosen(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("envguard: environment: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def same(a: str | Path, b: str | Path) -> bool:
    return os.path.samefile(a, b)


def in_place(venvs: VenvFactory, path: Path) -> Venv:
    """A venv at ``path`` (the factory joins an absolute name as that path)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return venvs.create(str(path))


@pytest.fixture
def train(venvs: VenvFactory, wheel_dir: Path) -> Venv:
    """The activated training venv: it alone holds ``marker-pkg``."""
    env = venvs.create("train")
    venvs.uv_install(env, build_wheel(wheel_dir, "marker-pkg", "1.0", {"marker_pkg.py": ""}))
    return env


def names(data: dict[str, Any]) -> set[str]:
    return {p["name"] for p in data["packages"]}


# ---------------------------------------------------------------------------- the order

def test_activated_venv_is_snapshotted_from_another_interpreter(train: Venv,
                                                                clean_cwd: Path) -> None:
    """The old code snapshotted envguard's own venv and said nothing."""
    data, line = snapshot(clean_cwd, VIRTUAL_ENV=str(train.path))
    assert same(data["interpreter"]["prefix"], train.path)
    assert "marker-pkg" in names(data)
    assert data["interpreter"]["selected_by"] == "VIRTUAL_ENV"
    assert line == f"envguard: environment: {train.path} (VIRTUAL_ENV)"


def test_outside_any_environment_it_is_python3_on_path_and_says_so(
        train: Venv, clean_cwd: Path, tmp_path: Path) -> None:
    """A tool install run outside any environment: the old code read its own tool venv."""
    data, line = snapshot(clean_cwd, PATH=f"{train.path / 'bin'}{os.pathsep}/usr/bin")
    assert same(data["interpreter"]["prefix"], train.path)
    assert "marker-pkg" in names(data)
    assert data["interpreter"]["selected_by"] == "python3 on PATH"
    assert line == f"envguard: environment: {train.path} (python3 on PATH)"
    # A folder on PATH with only `python` (no python3): that one.
    only = tmp_path / "only-python"
    only.mkdir()
    (only / "python").symlink_to(train.python)
    data, line = snapshot(clean_cwd, PATH=str(only))
    assert data["interpreter"]["selected_by"] == "python3 on PATH"
    assert line == f"envguard: environment: {tmp_path} (python3 on PATH)"


def test_a_shim_on_path_is_asked_which_interpreter_it_starts(train: Venv, clean_cwd: Path,
                                                             tmp_path: Path) -> None:
    """A pyenv-style shim (a script that execs another interpreter): the old code would
    name the shim's folder and the probe refuse it as another interpreter."""
    shims = tmp_path / "shims"
    shims.mkdir()
    shim = shims / "python3"
    shim.write_text(f'#!/bin/sh\nexec "{train.python}" "$@"\n')
    shim.chmod(0o755)
    data, line = snapshot(clean_cwd, PATH=f"{shims}{os.pathsep}/usr/bin{os.pathsep}/bin")
    assert "marker-pkg" in names(data)
    assert line == f"envguard: environment: {train.path} (python3 on PATH)"
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "python3").write_text("#!/bin/sh\nexit 3\n")
    (broken / "python3").chmod(0o755)
    selection = discover(None, env={"PATH": f"{broken}{os.pathsep}{train.path / 'bin'}"},
                         cwd=tmp_path)
    assert selection.prefix == str(train.path)  # the shim that answers nothing is passed over


def test_with_no_python_on_path_it_is_envguards_own_and_says_so(clean_cwd: Path,
                                                                 tmp_path: Path) -> None:
    empty = tmp_path / "no-python-here"
    empty.mkdir()
    data, line = snapshot(clean_cwd, PATH=str(empty))
    assert same(data["interpreter"]["prefix"], sys.prefix)
    assert data["interpreter"]["selected_by"] == "envguard's own interpreter"
    assert line.endswith("(envguard's own interpreter)")


def test_stale_virtual_env_is_one_line_exit_2(tmp_path: Path, clean_cwd: Path) -> None:
    gone = tmp_path / "deleted-venv"
    empty = tmp_path / "empty-venv"
    empty.mkdir()
    for folder in (gone, empty):
        proc = envguard("snapshot", "--json", cwd=clean_cwd, VIRTUAL_ENV=str(folder))
        assert proc.returncode == ExitCode.USAGE
        assert proc.stdout == ""
        (line,) = proc.stderr.splitlines()
        assert line.startswith(f"envguard: error: VIRTUAL_ENV={folder}: "), line


def test_conda_env_is_chosen(venvs: VenvFactory, tmp_path: Path, clean_cwd: Path) -> None:
    env = in_place(venvs, tmp_path / "miniconda" / "envs" / "torch")
    (env.path / "conda-meta").mkdir()
    data, line = snapshot(clean_cwd, CONDA_PREFIX=str(env.path), CONDA_DEFAULT_ENV="torch")
    assert same(data["interpreter"]["prefix"], env.path)
    assert data["interpreter"]["selected_by"] == "CONDA_PREFIX"
    assert line.endswith("(CONDA_PREFIX)")


def test_base_conda_env_loses_to_dot_venv(venvs: VenvFactory, tmp_path: Path,
                                          clean_cwd: Path) -> None:
    base = in_place(venvs, tmp_path / "miniconda")
    (base.path / "conda-meta").mkdir()
    (base.path / "envs").mkdir()
    conda = {"CONDA_PREFIX": str(base.path), "CONDA_DEFAULT_ENV": "base"}
    data, line = snapshot(clean_cwd, **conda)  # no .venv: the base env is used
    assert same(data["interpreter"]["prefix"], base.path)
    assert line.endswith("(CONDA_PREFIX, base env)")
    project = in_place(venvs, clean_cwd / ".venv")
    data, line = snapshot(clean_cwd, **conda)
    assert same(data["interpreter"]["prefix"], project.path)
    assert data["interpreter"]["selected_by"] == ".venv"


def test_a_dot_venv_without_an_interpreter_is_exit_2(clean_cwd: Path) -> None:
    (clean_cwd / ".venv" / "bin").mkdir(parents=True)
    proc = envguard("check", "demo", cwd=clean_cwd)
    assert proc.returncode == ExitCode.USAGE
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"envguard: error: {clean_cwd / '.venv'}: "), line


def test_dot_venv_in_a_parent_folder(venvs: VenvFactory, clean_cwd: Path) -> None:
    project = in_place(venvs, clean_cwd / ".venv")
    deeper = clean_cwd / "src" / "pkg"
    deeper.mkdir(parents=True)
    data, line = snapshot(deeper)
    assert same(data["interpreter"]["prefix"], project.path)
    assert line == f"envguard: environment: {project.path} (.venv)"


def test_envguard_python_beats_the_activated_venv(train: Venv, venvs: VenvFactory,
                                                  clean_cwd: Path) -> None:
    other = venvs.create("other")
    data, line = snapshot(clean_cwd, ENVGUARD_PYTHON=str(other.path),
                          VIRTUAL_ENV=str(train.path))
    assert same(data["interpreter"]["prefix"], other.path)
    assert line.endswith("(ENVGUARD_PYTHON)")
    assert data["interpreter"]["selected_by"] == "ENVGUARD_PYTHON"
    proc = envguard("snapshot", "--json", cwd=clean_cwd, ENVGUARD_PYTHON="no-such-python-x")
    assert proc.returncode == ExitCode.USAGE
    assert proc.stderr.startswith("envguard: error: ENVGUARD_PYTHON=no-such-python-x: ")


def test_python_option_overrides_every_other_rule(train: Venv, venvs: VenvFactory,
                                                  tmp_path: Path, clean_cwd: Path) -> None:
    chosen_env, other = venvs.create("chosen"), venvs.create("other")
    conda = in_place(venvs, tmp_path / "conda-env")
    (conda.path / "conda-meta").mkdir()
    in_place(venvs, clean_cwd / ".venv")
    data, line = snapshot(clean_cwd, "--python", chosen_env.path, ENVGUARD_PYTHON=str(other.path),
                          VIRTUAL_ENV=str(train.path), CONDA_PREFIX=str(conda.path))
    assert same(data["interpreter"]["prefix"], chosen_env.path)
    assert data["interpreter"]["selected_by"] == "--python"
    assert line.endswith("(--python)")


def test_quiet_snapshot_says_nothing(train: Venv, clean_cwd: Path) -> None:
    proc = envguard("snapshot", "-q", "--json", "--verify", "none", "--no-cache-marker",
                    cwd=clean_cwd, VIRTUAL_ENV=str(train.path))
    assert proc.returncode == ExitCode.OK and proc.stderr == "", proc.stderr
    assert json.loads(proc.stdout)["interpreter"]["selected_by"] == "VIRTUAL_ENV"


# ---------------------------------------------------------------------------- every command

def test_a_command_that_fails_prints_only_its_error(train: Venv, clean_cwd: Path) -> None:
    """The environment line is said with the command's output, not before its error."""
    (clean_cwd / "a-file").write_text("")
    proc = envguard("snapshot", "-o", clean_cwd / "a-file" / "s.json",
                    "--verify", "none", "--no-cache-marker", cwd=clean_cwd,
                    VIRTUAL_ENV=str(train.path))
    assert proc.returncode != ExitCode.OK
    (line,) = proc.stderr.splitlines()
    assert line.startswith("envguard: error: "), proc.stderr


def test_check_lock_restore_and_cache_choose_what_snapshot_chooses(train: Venv,
                                                                   clean_cwd: Path) -> None:
    """With a venv activated, every command looks at it (the old check, restore and cache
    looked at envguard's own venv: 'torch was removed', installs planned against it)."""
    active = {"VIRTUAL_ENV": str(train.path)}
    good, expected = snapshot(clean_cwd, **active)
    (clean_cwd / "good.json").write_text(json.dumps(good))
    (clean_cwd / "lockfiles").mkdir()
    proc = envguard("lock", "marker", "--distribution", "marker-pkg", cwd=clean_cwd, **active)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert chosen(proc) == expected
    check = envguard("check", "marker", cwd=clean_cwd, **active)
    assert check.returncode == ExitCode.OK, check.stdout + check.stderr
    assert chosen(check) == expected
    elsewhere = envguard("check", "marker", cwd=clean_cwd)  # envguard's own venv: no marker
    assert elsewhere.returncode == ExitCode.DRIFT
    restore = envguard("restore", "good.json", "--dry-run", cwd=clean_cwd, **active)
    assert restore.returncode == ExitCode.OK, restore.stderr
    assert chosen(restore) == expected
    # rich folds a long line anywhere, inside a path too: compare with the folds removed
    assert str(train.path) in "".join(restore.stdout.split())
    status = envguard("cache", "status", "--format", "json", cwd=clean_cwd, **active)
    assert status.returncode == ExitCode.OK, status.stderr
    assert chosen(status) == expected
    fleet = envguard("fleet", "snapshot", "-o", "fleet.json", "--verify", "none",
                     "--no-cache-marker", cwd=clean_cwd, **active)
    assert fleet.returncode == ExitCode.OK, fleet.stderr
    assert chosen(fleet) == expected
    (member,) = json.loads((clean_cwd / "fleet.json").read_text())["snapshots"]
    assert member["snapshot"]["interpreter"]["selected_by"] == "VIRTUAL_ENV"


def test_run_uses_the_interpreter_of_the_command_and_says_so(
        train: Venv, venvs: VenvFactory, wheel_dir: Path, clean_cwd: Path) -> None:
    """The tool's venv is not the activated one: run follows the tool's shebang."""
    tool = venvs.create("tool")
    venvs.uv_install(tool, build_wheel(wheel_dir, "demo-tool", "1.0", {"demo_tool.py": MAIN},
                                       scripts={"demo-tool": "demo_tool:main"}))
    (clean_cwd / "lockfiles").mkdir()
    locked = envguard("lock", "demo-tool", "--python", tool.python, cwd=clean_cwd)
    assert locked.returncode == ExitCode.OK, locked.stderr
    path = f"{tool.path / 'bin'}{os.pathsep}{os.environ['PATH']}"
    proc = envguard("run", "--", "demo-tool", cwd=clean_cwd, PATH=path,
                    VIRTUAL_ENV=str(train.path))
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert chosen(proc) == f"envguard: environment: {tool.path} (shebang of demo-tool)"
    assert "tool ran under" in proc.stdout
    # python itself: the one the child finds first on its PATH.
    (clean_cwd / "lockfiles" / "demo-tool.toml").rename(clean_cwd / "lockfiles" / "python.toml")
    proc = envguard("run", "--lock", "lockfiles/python.toml", "--", "python", "-c", "pass",
                    cwd=clean_cwd, PATH=path, VIRTUAL_ENV=str(train.path))
    assert chosen(proc) == f"envguard: environment: {tool.path} (python on PATH)"
    assert proc.returncode == ExitCode.OK, proc.stderr


# ---------------------------------------------------------------------------- the function

def test_discover_is_pure_of_the_process_environment(train: Venv, tmp_path: Path) -> None:
    selection = discover(None, env={"VIRTUAL_ENV": str(train.path)}, cwd=tmp_path)
    assert selection.selected_by == "VIRTUAL_ENV"
    assert same(selection.executable, train.python)
    assert selection.python == selection.executable
    own = discover(None, env={}, cwd=tmp_path)
    assert own.python is None and own.executable == sys.executable
    on_path = discover(None, env={"PATH": f"{tmp_path / 'none'}{os.pathsep}{train.path / 'bin'}"},
                       cwd=tmp_path)
    assert on_path.selected_by == "python3 on PATH"
    assert on_path.prefix == str(train.path) and on_path.python == on_path.executable
    with pytest.raises(InputError, match="VIRTUAL_ENV="):
        discover(None, env={"VIRTUAL_ENV": str(tmp_path / "gone")}, cwd=tmp_path)


@pytest.mark.parametrize(("folder", "env", "base"), [
    ("envs/torch", {"CONDA_DEFAULT_ENV": "torch"}, False),       # a named env
    ("miniconda", {"CONDA_DEFAULT_ENV": "base"}, True),          # base: name != folder
    ("miniconda", {}, False),                                    # nothing says base
    ("base", {"CONDA_DEFAULT_ENV": "base"}, False),              # an env called base
    ("miniconda", {"_CONDA_ROOT": "{prefix}"}, True),            # conda's own root
    ("p-env", {"CONDA_DEFAULT_ENV": "{prefix}"}, False),         # conda create -p
])
def test_conda_base_follows_uv(tmp_path: Path, folder: str, env: dict[str, str],
                               base: bool) -> None:
    prefix = tmp_path / folder
    prefix.mkdir(parents=True)
    values = {k: v.replace("{prefix}", str(prefix)) for k, v in env.items()}
    assert is_conda_base(prefix, values) is base


def test_the_root_install_is_base_and_pixi_never(tmp_path: Path) -> None:
    (tmp_path / "conda-meta").mkdir()
    (tmp_path / "envs").mkdir()
    assert is_conda_base(tmp_path, {})
    (tmp_path / "conda-meta" / "pixi").write_text("")
    assert not is_conda_base(tmp_path, {"CONDA_DEFAULT_ENV": "base"})


def test_home_is_written_as_tilde() -> None:
    assert shorten_home("/home/u/train/.venv", "/home/u") == "~/train/.venv"
    assert shorten_home("/home/u", "/home/u/") == "~"
    assert shorten_home("/home/user2/x", "/home/u") == "/home/user2/x"


def test_selected_by_is_optional_and_never_compared() -> None:
    """A snapshot written before the field loads (``null``); diff ignores the field."""
    import dataclasses

    from envguard.changes import diff
    from envguard.model import Snapshot

    text = (DATA / "h200-snapshot.json").read_text()
    assert "selected_by" not in text
    old = Snapshot.from_json(text)
    assert old.interpreter.selected_by is None
    new = dataclasses.replace(old, interpreter=dataclasses.replace(
        old.interpreter, selected_by="VIRTUAL_ENV"))
    assert Snapshot.from_json(new.to_json()).interpreter.selected_by == "VIRTUAL_ENV"
    assert diff(old, new).changes == ()
