"""The real CLI in a subprocess: outputs, exit codes, hostile input, NO_COLOR."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from envguard.exitcodes import ExitCode
from tests.wheelfactory import VenvFactory, build_wheel, fake_torch_files

ANSI_COLOR = re.compile(r"\x1b\[[0-9;]*3[0-9]m|\x1b\[[0-9;]*38;")


def envguard(*args: str, cwd: Path | None = None,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "envguard", *args], capture_output=True,
                          text=True, cwd=cwd, env=full_env, timeout=120, check=False)


def test_json_goes_to_stdout(clean_cwd: Path) -> None:
    proc = envguard("snapshot", "--json", "-q")
    assert proc.returncode == ExitCode.OK, proc.stderr
    data = json.loads(proc.stdout)
    assert data["schema"] == "envguard.snapshot/1"
    assert data["interpreter"]["executable"]
    assert not (clean_cwd / ".envguard").exists()


def test_default_destination_is_a_timestamped_file(clean_cwd: Path) -> None:
    proc = envguard("snapshot")
    assert proc.returncode == ExitCode.OK, proc.stderr
    printed = proc.stdout.strip()
    assert re.fullmatch(r"\.envguard/snapshots/\d{8}T\d{6}Z(-\d+)?\.json", printed), printed
    assert json.loads((clean_cwd / printed).read_text())["schema"] == "envguard.snapshot/1"
    assert "snapshot taken in" in proc.stderr
    second = envguard("snapshot", "-q")
    assert second.stdout.strip() != printed


def test_output_file_and_summary(clean_cwd: Path) -> None:
    out = clean_cwd / "good.json"
    proc = envguard("snapshot", "-o", str(out), "--file", "*.txt")
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert proc.stdout == ""
    for label in ("python", "torch", "packages", "integrity", "caches", "gpu"):
        assert label in proc.stderr
    assert json.loads(out.read_text())["options"]["file_patterns"] == ["*.txt"]


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["snapshot", "--python", "/no/such/python"], ExitCode.ENVIRONMENT_ERROR,
         "interpreter not found"),
        (["snapshot", "--python", "/bin/false"], ExitCode.ENVIRONMENT_ERROR, "cannot probe"),
        (["snapshot", "--verify", "bogus"], ExitCode.USAGE, "invalid choice"),
        (["snapshot", "--no-such-flag"], ExitCode.USAGE, "unrecognized arguments"),
        (["snapshot", "--json", "-o", "x.json"], ExitCode.USAGE, "not allowed with"),
        ([], ExitCode.USAGE, "required"),
    ],
)
def test_errors_are_one_line_with_a_documented_code(clean_cwd: Path, args: list[str],
                                                    code: ExitCode, needle: str) -> None:
    proc = envguard(*args)
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_unwritable_output_is_an_output_error_and_writes_nothing(clean_cwd: Path) -> None:
    (clean_cwd / "blocker").write_text("")
    proc = envguard("snapshot", "-q", "-o", str(clean_cwd / "blocker" / "snap.json"))
    assert proc.returncode == ExitCode.OUTPUT_ERROR
    assert proc.stderr.startswith("envguard: error: cannot write")
    assert (clean_cwd / "blocker").read_text() == ""


def test_version_and_module_entry_point() -> None:
    proc = envguard("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("envguard ")


def test_no_color_is_respected(clean_cwd: Path) -> None:
    colored = envguard("snapshot", "--json", env={"FORCE_COLOR": "1", "TERM": "xterm-256color"})
    assert ANSI_COLOR.search(colored.stderr), "expected colour without NO_COLOR"
    plain = envguard("snapshot", "--json", env={"FORCE_COLOR": "1", "NO_COLOR": "1",
                                                "TERM": "xterm-256color"})
    assert plain.returncode == 0
    assert not ANSI_COLOR.search(plain.stderr)


def test_hostile_names_are_shown_inert(clean_cwd: Path, venvs: VenvFactory,
                                       wheel_dir: Path) -> None:
    """A dist-info folder named with a terminal escape and rich markup, and corrupt METADATA."""
    env = venvs.create()
    venvs.uv_install(env, build_wheel(wheel_dir, "torch", "2.11.0", fake_torch_files()))
    hostile = env.site_packages() / "evil\x1b[2J[bold red]x-1.0.dist-info"
    hostile.mkdir()
    (hostile / "METADATA").write_text("garbage without headers\n")
    proc = envguard("snapshot", "-o", "s.json", "--python", str(env.path),
                    env={"FORCE_COLOR": "1", "NO_COLOR": "1", "COLUMNS": "400"})
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert "\x1b[2J" not in proc.stderr
    assert "\\x1b[2J[bold red]x" in proc.stderr  # shown literally, markup not applied
    data = json.loads((clean_cwd / "s.json").read_text())
    assert any("corrupt METADATA" in e["message"] for e in data["errors"])


# -- bytecode under PYTHONDONTWRITEBYTECODE (cli.keep_bytecode) ---------------------------------

def test_keep_bytecode_only_when_bytecode_is_off_and_nothing_shipped_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from envguard.bytecode import OPT_OUT_ENV, keep_bytecode

    monkeypatch.setattr(sys, "path_hooks", list(sys.path_hooks))  # keep_bytecode adds one
    monkeypatch.setattr(sys, "path_importer_cache", {})
    source = tmp_path / "mod.py"  # a module whose install wrote no .pyc
    source.write_text("x = 1\n")
    shipped = tmp_path / "shipped.py"
    shipped.write_text("x = 1\n")
    import py_compile

    py_compile.compile(str(shipped), cfile=importlib.util.cache_from_source(str(shipped)))
    folder = tmp_path / "bytecode"
    for bytecode_off, env, module, changes in (
            (True, {}, source, True),
            (False, {}, source, False),            # the user allows bytecode
            (True, {OPT_OUT_ENV: "1"}, source, False),
            (True, {}, shipped, False),            # the install compiled it
            (True, {}, None, False)):              # no such module (torch not installed)
        monkeypatch.setattr(sys, "pycache_prefix", None)
        monkeypatch.setattr(sys, "dont_write_bytecode", bytecode_off)
        assert keep_bytecode(folder, str(module) if module else None, env) is changes
        assert (sys.pycache_prefix == str(folder)) is changes
        assert sys.dont_write_bytecode is (bytecode_off and not changes)
    monkeypatch.setattr(sys, "pycache_prefix", "/elsewhere")  # PYTHONPYCACHEPREFIX wins
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert keep_bytecode(folder, str(source), {}) is False


def test_the_command_line_writes_no_bytecode_beside_the_sources(tmp_path: Path) -> None:
    """Under PYTHONDONTWRITEBYTECODE the real command keeps its bytecode in its cache
    folder (or uses what an install shipped) and never writes a __pycache__ of its own."""
    import importlib.util

    import envguard.cli as cli

    shipped = os.path.exists(importlib.util.cache_from_source(cli.__file__))
    before = set(Path(cli.__file__).parent.parent.rglob("__pycache__"))
    proc = envguard("snapshot", "-q", "--json", "--verify", "none", cwd=tmp_path,
                    env={"PYTHONDONTWRITEBYTECODE": "1",
                         "ENVGUARD_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == ExitCode.OK, proc.stderr
    folder = tmp_path / "cache" / "bytecode"
    for module in ("probe/collector", "cli/program", "errors"):  # the last two load first
        cached = list(folder.rglob(f"envguard/{module}.*.pyc"))
        assert bool(cached) is not shipped, module
    assert set(Path(cli.__file__).parent.parent.rglob("__pycache__")) == before


def test_a_cut_short_pyc_in_the_cache_is_recompiled_not_fatal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A .pyc in envguard's bytecode folder cut short (a full disk, a killed machine) after
    its header: the standard loader fails the import with EOFError, every later command
    too; the loader keep_bytecode installs compiles the source and replaces the file."""
    import py_compile

    from envguard.bytecode import keep_bytecode

    monkeypatch.setattr(sys, "path_hooks", list(sys.path_hooks))
    monkeypatch.setattr(sys, "path_importer_cache", {})
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    code = tmp_path / "code"
    code.mkdir()
    monkeypatch.syspath_prepend(str(code))

    def plant(name: str) -> Path:
        source = code / f"{name}.py"
        source.write_text("VALUE = 41 + 1\n" + "# padding\n" * 200)
        cached = Path(importlib.util.cache_from_source(str(source)))
        py_compile.compile(str(source), cfile=str(cached))
        cached.write_bytes(cached.read_bytes()[:24])  # the header and a little more
        return cached

    plant("cut_short_plain")  # no keep_bytecode yet: the usual loader, __pycache__/
    with pytest.raises(EOFError):
        importlib.import_module("cut_short_plain")

    folder = tmp_path / "bytecode"
    assert keep_bytecode(folder, str(code / "cut_short_tolerant.py"), {})
    cached = plant("cut_short_tolerant")
    assert str(cached).startswith(str(folder))
    module = importlib.import_module("cut_short_tolerant")
    assert module.VALUE == 42
    assert not cached.exists() or cached.stat().st_size > 24
    sys.modules.pop("cut_short_tolerant", None)
