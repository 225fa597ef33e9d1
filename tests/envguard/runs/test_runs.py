"""Guarded runs with outcomes, a failed run that explains itself, and the diff shortcuts.

Real venvs built with uv from tiny wheels (``tests/wheelfactory.py``), envguard as a real
subprocess in a temporary project: a fake torch, ``demo-train`` (a console script that
needs it) and ``helperlib`` (installed beside it, outside the command's closure), in
versions 1.0 and 2.0. Each test gets its own venv, because the tests change it for real
(uv installs another version, a file in site-packages is edited).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envguard.exitcodes import ExitCode
from tests.conftest import venv_factory
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files, find_uv

DEMO_MAIN = '''\
import os
import signal
import sys


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "0"
    print("demo-train ran " + mode, flush=True)
    if mode == "term":
        os.kill(os.getpid(), signal.SIGTERM)
    if mode == "sleep":
        import time
        time.sleep(1.2)
        return 0
    if mode == "import":
        sys.stderr.write("Traceback (most recent call last):\\n  File \\"train.py\\", line 1\\n"
                         "ImportError: cannot import name 'merge' from 'helperlib'\\n")
        return 1
    return int(mode)
'''
TRAIN_PY = "import sys\nprint('train.py ran', flush=True)\nsys.exit(int(sys.argv[1]))\n"


@dataclasses.dataclass(frozen=True)
class World:
    project: Path
    env: Venv
    venvs: VenvFactory
    helper2: Path
    vllm: Path

    def envguard(self, *args: str | Path, cwd: Path | None = None, stdin: str | None = None,
                 extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "ENVGUARD_VERIFIED"}
        env.update(extra_env or {})
        return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)],
                              cwd=cwd or self.project, env=env, capture_output=True,
                              text=True, timeout=120, input=stdin, check=False)

    def run(self, *args: str, extra_env: dict[str, str] | None = None,
            guard: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        return self.envguard("run", *guard, "--", self.env.path / "bin" / "demo-train", *args,
                             extra_env=extra_env)

    @property
    def runs_dir(self) -> Path:
        return self.project / ".envguard" / "runs"

    def records(self) -> list[dict[str, Any]]:
        """Run records, oldest first."""
        return [json.loads(p.read_text()) for p in sorted(self.runs_dir.glob("*.run.json"))]

    def last_good(self) -> dict[str, Any]:
        pointer: dict[str, Any] = json.loads((self.runs_dir / "last-good.json").read_text())
        return pointer

    def stored(self) -> list[Path]:
        return sorted((self.project / ".envguard" / "snapshots" / "by-digest").glob("*.json"))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if find_uv() is None:
        pytest.skip("uv is not installed")
    folder = tmp_path_factory.mktemp("runs-wheels")
    out = folder / "wheels"
    return {
        "torch": build_wheel(out, "torch", "2.11.0+cu128", fake_torch_files()),
        "demo": build_wheel(out, "demo-train", "1.0", {"demo_train/__init__.py": DEMO_MAIN},
                            requires=("torch",), scripts={"demo-train": "demo_train:main"}),
        "helper": build_wheel(out, "helperlib", "1.0", {"helperlib/__init__.py": "V = 1\n"}),
        "helper2": build_wheel(folder / "later", "helperlib", "2.0",
                               {"helperlib/__init__.py": "V = 2\n"}),
        "vllm": build_wheel(folder / "later", "vllm", "0.9.0", {"vllm/__init__.py": ""}),
    }


@pytest.fixture
def world(tmp_path: Path, wheels: dict[str, Path]) -> World:
    venvs = venv_factory(tmp_path, wheels["torch"].parent)
    env = venvs.create("good")
    venvs.uv_install(env, wheels["torch"], wheels["demo"], wheels["helper"])
    project = (tmp_path / "project").resolve()
    (project / "lockfiles").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[project]\nname = "demo-project"\nversion = "0"\ndependencies = ["torch"]\n')
    (project / "train.py").write_text(TRAIN_PY)
    w = World(project=project, env=env, venvs=venvs, helper2=wheels["helper2"],
              vllm=wheels["vllm"])
    locked = w.envguard("lock", "demo-train", "--python", env.python)
    assert locked.returncode == 0, locked.stderr
    return w


def patch_file(path: Path) -> None:
    """Edit an installed file. A new file, not a write into the old one: uv hard-links
    installed files to its cache, and an edit in place would reach every later venv."""
    text = path.read_text()
    path.unlink()
    path.write_text(text + "# patched\n")


def envguard_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("envguard: ")
            and not line.startswith("envguard: environment: ")]


def after_child(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """envguard's lines after the failed child's output (stderr, from the failure line)."""
    lines = envguard_lines(proc.stderr)
    starts = [i for i, line in enumerate(lines) if "since the last successful run" in line
              or "successful guarded run" in line or "identical to the last" in line]
    assert starts, proc.stderr
    return lines[starts[0]:]


# ---------------------------------------------------------------------- outcomes, last-good

def test_a_failed_run_is_its_own_symptom(world: World) -> None:
    """The run's last stderr lines name helperlib: the lines after the failure put its
    upgrade first, ahead of a critical edit of torch and a new variable; the record keeps
    the lines (redacted), and the full report ranks by them too."""
    assert world.run("0").returncode == 0
    world.venvs.uv_install(world.env, world.helper2, reinstall=True)
    patch_file(world.env.site_packages() / "torch" / "fx" / "_symbolic_trace.py")
    failed = world.run("import", guard=("--force",),
                       extra_env={"NCCL_ALGO": "Tree", "HF_TOKEN": "hf_" + "Ab1" * 11})
    assert failed.returncode == 1, failed.stderr
    assert "cannot import name 'merge' from 'helperlib'" in failed.stderr  # passed through
    lines = after_child(failed)
    assert "helperlib" in lines[1] and "torch" not in lines[1], lines
    tail = world.records()[-1]["stderr_tail"]
    assert tail[-1] == "ImportError: cannot import name 'merge' from 'helperlib'"
    full = world.envguard("diff", "@last-good", "@run:1", "--format", "json")
    report = json.loads(full.stdout)
    assert report["symptom"].endswith("from 'helperlib'")
    assert report["findings"][0]["changes"] == ["packages.helperlib.version"]


def test_a_failed_run_names_what_changed_and_last_good_stays(world: World) -> None:
    ok = world.run("0")
    assert ok.returncode == 0, ok.stderr
    (good,) = world.records()
    assert good["schema"] == "envguard.run/2"
    assert (good["exit_code"], good["signal"], good["passed"], good["forced"]) == (
        0, None, True, False)
    assert good["started_at"] <= good["ended_at"] and good["ended_at"].endswith("Z")
    assert world.last_good()["snapshot"] == good["snapshot"]
    assert "since the last successful run" not in ok.stderr  # nothing to explain

    # Three real changes: a package upgraded by uv, a file of torch edited, a variable set.
    world.venvs.uv_install(world.env, world.helper2, reinstall=True)
    patch_file(world.env.site_packages() / "torch" / "fx" / "_symbolic_trace.py")
    failed = world.run("1", guard=("--force",), extra_env={"NCCL_ALGO": "Tree"})
    assert failed.returncode == 1, failed.stderr
    assert "demo-train ran 1" in failed.stdout
    lines = after_child(failed)
    assert lines[0].startswith("envguard: demo-train exited 1; changed since the last "
                               "successful run at " + good["ended_at"])
    body = "\n".join(lines[1:-1])
    assert 1 <= len(lines) - 2 <= 5, lines
    assert "helperlib" in body and "torch" in body and "NCCL_ALGO" in body, lines
    assert lines[-1].startswith("envguard: full report") and lines[-1].endswith(
        "envguard diff @last-good:demo-train @run:1")

    records = world.records()
    assert records[-1]["exit_code"] == 1 and records[-1]["forced"] is True
    assert world.last_good()["run"] == records[0]["id"] == good["id"]
    # The full report names the same changes.
    full = world.envguard("diff", "@last-good", "@run:1", "--format", "json")
    assert full.returncode == ExitCode.DRIFT, full.stderr
    keys = {c["key"] for c in json.loads(full.stdout)["changes"] if c["material"]}
    assert {"helperlib", "NCCL_ALGO"} <= keys, keys


def test_a_failed_run_with_nothing_changed_says_so(world: World) -> None:
    assert world.run("0").returncode == 0
    failed = world.run("3")
    assert failed.returncode == 3
    good = world.last_good()
    (line,) = after_child(failed)
    assert line == ("envguard: demo-train exited 3; environment identical to the last "
                    f"successful run at {good['ended_at']}: look at your code or data")


def test_a_first_run_that_fails_says_there_is_no_last_good(world: World) -> None:
    failed = world.run("2")
    assert failed.returncode == 2
    assert after_child(failed) == [
        "envguard: demo-train exited 2; no successful guarded run of lock demo-train recorded "
        "here yet to compare with"]
    assert not (world.runs_dir / "last-good.json").exists()
    assert world.envguard("diff").returncode == ExitCode.USAGE


def test_a_child_killed_by_sigterm_is_recorded_and_explained(world: World) -> None:
    assert world.run("0").returncode == 0
    killed = world.run("term")
    assert killed.returncode == 128 + signal.SIGTERM, killed.stderr
    record = world.records()[-1]
    assert (record["exit_code"], record["signal"]) == (128 + signal.SIGTERM, "SIGTERM")
    (line,) = after_child(killed)
    assert line.startswith("envguard: demo-train was killed by SIGTERM; environment "
                           "identical to the last successful run")
    assert world.last_good()["run"] == world.records()[0]["id"] != record["id"]


@pytest.mark.parametrize("breakage", ["serving stack", "patched file"])
def test_refused_and_forced_runs_never_become_last_good(world: World, breakage: str) -> None:
    if breakage == "serving stack":
        world.venvs.uv_install(world.env, world.vllm)
    else:
        patch_file(world.env.site_packages() / "torch" / "fx" / "_symbolic_trace.py")
    assert world.run("0").returncode == ExitCode.REFUSED
    assert world.run("0", guard=("--force",)).returncode == 0
    assert [r["exit_code"] for r in world.records()] == [None, 0]
    assert not (world.runs_dir / "last-good.json").exists()


def test_a_run_id_is_named_after_its_start(world: World) -> None:
    """The old id took the time the record was written (the end), while `envguard runs`
    showed the start: a long run's id and its row disagreed."""
    assert world.run("sleep").returncode == 0
    (record,) = world.records()
    started = record["started_at"]  # 2026-12-06T11:34:07.561Z
    stamp = started[:19].replace("-", "").replace(":", "") + started[20:23]
    assert record["id"].startswith(stamp), (record["id"], started)
    assert record["ended_at"] > started


def test_runs_lists_one_line_a_run_in_80_columns(world: World) -> None:
    """The old table gave the command 7 columns of 80 (`train.p` / `y` / `--confi` ...)."""
    assert world.run("0").returncode == 0
    assert world.run("3").returncode == 3
    listed = world.envguard("runs", extra_env={"COLUMNS": "80"})
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["#", "started", "(UTC)", "exit", "gate", "snapshot", "command"]
    assert lines[1].startswith("@run:1 ") and lines[1].rstrip().endswith("demo-train 3")
    assert lines[2].startswith("@run:2* ") and lines[2].rstrip().endswith("demo-train 0")
    assert lines[3].startswith("* last-good: @run:2, run ")
    assert all(len(line) <= 80 for line in lines[:3])


def test_identical_runs_store_one_snapshot(world: World) -> None:
    for _ in range(3):
        assert world.run("0").returncode == 0
    records = world.records()
    assert len(records) == 3 and len({r["snapshot"] for r in records}) == 1
    (stored,) = world.stored()
    assert stored.name == records[0]["snapshot"] + ".json"
    assert json.loads(stored.read_text())["schema"].startswith("envguard.snapshot/")
    world.venvs.uv_install(world.env, world.helper2, reinstall=True)
    assert world.run("0").returncode == 0
    assert len(world.stored()) == 2
    for path in [*world.stored(), *world.runs_dir.iterdir()]:
        assert path.stat().st_mode & 0o777 == 0o600, path


def test_last_good_is_kept_per_lock(world: World) -> None:
    """Two locks in one folder: a failed run of one is compared with ITS last good run, not
    with the other lock's newer one (the old code had one last-good per folder)."""
    locked = world.envguard("lock", "train", "--python", world.env.python)
    assert locked.returncode == 0, locked.stderr

    def train(code: str) -> subprocess.CompletedProcess[str]:
        return world.envguard("run", "--lock", "train", "--", world.env.python, "train.py", code)

    assert world.run("0").returncode == 0
    world.venvs.uv_install(world.env, world.helper2, reinstall=True)
    assert world.envguard("lock", "train", "--python", world.env.python).returncode == 0
    assert train("0").returncode == 0  # newer, and in the environment with helperlib 2
    demo, trained = world.records()
    assert world.last_good()["run"] == trained["id"]  # the folder-wide one: the newest
    failed = world.run("1", guard=("--force",))
    lines = after_child(failed)
    assert "helperlib" in "\n".join(lines), lines  # against demo-train's own good run
    assert lines[-1].endswith("envguard diff @last-good:demo-train @run:1")
    mine = world.envguard("diff", "@last-good:demo-train", "@run:1", "--format", "json")
    assert json.loads(mine.stdout)["old"].startswith(f"@last-good:demo-train (run {demo['id']}")
    other = world.envguard("diff", "@last-good:train", "@run:1", "--format", "json")
    assert json.loads(other.stdout)["old"].startswith(f"@last-good:train (run {trained['id']}")
    missing = world.envguard("diff", "@last-good:nope", "@run:1")
    assert missing.returncode == ExitCode.USAGE
    assert missing.stderr.startswith("envguard: error: @last-good:nope: no successful guarded "
                                     "run of lock 'nope'")
    assert "locks with one: demo-train, train" in missing.stderr
    # Pruning to one record keeps each lock's last good run.
    pruned = world.envguard("runs", "prune", "--keep", "1")
    assert pruned.returncode == 0, pruned.stderr
    kept = {r["id"] for r in world.records()}
    assert {demo["id"], trained["id"]} <= kept


def test_every_command_that_reads_a_snapshot_takes_the_aliases(world: World,
                                                                tmp_path: Path) -> None:
    inductor = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])  # this test's own (conftest)
    (inductor / "fxgraph").mkdir(parents=True)
    (inductor / "fxgraph" / "entry").write_text("compiled")
    assert world.run("0").returncode == 0
    restore = world.envguard("restore", "@last-good:demo-train", "--dry-run",
                             "--python", world.env.python, "--format", "json")
    assert restore.returncode == ExitCode.OK, restore.stderr
    assert "@last-good:demo-train (run " in restore.stdout
    fleet = world.envguard("fleet", "diff", "@run:1", "@last-good", "--format", "json")
    assert fleet.returncode == ExitCode.OK, fleet.stderr
    save = world.envguard("cache", "save", "--from-snapshot", "@latest", "--store",
                          tmp_path / "store")
    assert save.returncode == ExitCode.OK, save.stderr
    plan = world.envguard("bisect", "@last-good", "@now", "--dry-run", "--python",
                          world.env.python, "--offline")
    assert plan.returncode == ExitCode.USAGE  # both aliases read: nothing differs
    assert f"and @now ({world.env.path}) hold the same packages" in plan.stderr, plan.stderr
    # @now says which environment it read, in the report and on stderr.
    now = world.envguard("diff", "@run:1", "@now", "--format", "json")
    assert json.loads(now.stdout)["new"] == f"@now ({world.env.path})"
    assert f"envguard: environment: {world.env.python} (the interpreter of run " in now.stderr


def test_project_config_env_applies_to_the_gates_snapshot(world: World) -> None:
    """[tool.envguard] env names a variable the defaults do not record: a guarded run's
    snapshot records it too (the old gate ignored [tool.envguard]), so a diff sees it."""
    pyproject = world.project / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + '[tool.envguard]\nenv = ["MY_SHARD_*"]\n')
    assert world.run("0", extra_env={"MY_SHARD_COUNT": "8"}).returncode == 0
    assert world.run("0", extra_env={"MY_SHARD_COUNT": "4"}).returncode == 0
    doc = json.loads(world.envguard("diff", "@run:2", "@run:1", "--format", "json").stdout)
    assert "MY_SHARD_COUNT" in {c["key"] for c in doc["changes"]}, doc["changes"]


# ---------------------------------------------------------------------- diff shortcuts

def test_diff_without_arguments_compares_last_good_with_now(world: World) -> None:
    assert world.run("0").returncode == 0
    same = world.envguard("diff")
    assert same.returncode == ExitCode.OK, same.stdout + same.stderr
    world.venvs.uv_install(world.env, world.helper2, reinstall=True)
    changed = world.envguard("diff", "--format", "json")
    assert changed.returncode == ExitCode.DRIFT, changed.stderr
    doc = json.loads(changed.stdout)
    assert doc["old"].startswith("@last-good (run ") and doc["new"].startswith("@now")
    assert {c["key"] for c in doc["changes"] if c["material"]} == {"helperlib"}
    one = world.envguard("diff", "@run:1", "--format", "json")  # GOOD alone: against now
    assert one.returncode == ExitCode.DRIFT
    assert json.loads(one.stdout)["changes"] == doc["changes"]


def test_aliases_and_stdin(world: World) -> None:
    assert world.run("0").returncode == 0
    assert world.run("5").returncode == 5
    records = world.records()
    for alias in ("@latest", "@run:1", "@run:2", "@last-good"):
        proc = world.envguard("diff", alias, "@run:1", "--format", "json")
        assert proc.returncode == ExitCode.OK, (alias, proc.stderr)
    doc = json.loads(world.envguard("diff", "@run:2", "@latest", "--format", "json").stdout)
    assert records[0]["started_at"] in doc["old"]
    snapshot = (world.stored()[0]).read_text()
    piped = world.envguard("diff", "-", "@last-good", stdin=snapshot)
    assert piped.returncode == ExitCode.OK, piped.stderr
    for bad, message in [("@nope", "unknown alias '@nope'"), ("@run:3", "@run:3: no such run"),
                         ("@run:0", "unknown alias '@run:0'")]:
        proc = world.envguard("diff", bad, "@run:1")
        assert proc.returncode == ExitCode.USAGE
        (line,) = proc.stderr.splitlines()
        assert line.startswith(f"envguard: error: {message}"), line
    both = world.envguard("diff", "-", "-", stdin=snapshot)
    assert both.returncode == ExitCode.USAGE and len(both.stderr.splitlines()) == 1
    junk = world.envguard("diff", "-", "@run:1", stdin="{not json")
    assert junk.returncode == ExitCode.USAGE
    assert junk.stderr.startswith("envguard: error: -: not valid JSON")


# ---------------------------------------------------------------------- runs, prune

def test_runs_list_and_prune(world: World) -> None:
    assert world.run("0", "--token", "hunter2-secret-value").returncode == 0
    assert world.run("4").returncode == 4
    world.venvs.uv_install(world.env, world.helper2, reinstall=True)
    assert world.run("6").returncode == 6
    text = world.envguard("runs")
    assert text.returncode == 0, text.stderr
    assert "@run:1" in text.stdout and "@run:3" in text.stdout and "last-good" in text.stdout
    assert "hunter2" not in text.stdout
    doc = json.loads(world.envguard("runs", "--format", "json").stdout)
    assert doc["schema"] == "envguard.runs/1"
    assert [r["exit_code"] for r in doc["runs"]] == [6, 4, 0]  # newest first
    assert doc["runs"][2]["argv"][-1] == "***" and doc["last_good"] == doc["runs"][2]["id"]
    assert len(world.stored()) == 2
    md = world.envguard("runs", "--format", "markdown")
    assert md.returncode == 0, md.stderr
    rows = [line for line in md.stdout.splitlines() if line.startswith("| `@run:")]
    assert len(rows) == 3 and "| 6 |" in rows[0] and "(last-good)" in rows[2]
    assert "hunter2" not in md.stdout and f"last-good: {doc['last_good']}" in md.stdout

    pruned = world.envguard("runs", "prune", "--keep", "1")
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout == "removed 1 run record(s) and 0 snapshot(s); 2 run(s) kept\n"
    left = json.loads(world.envguard("runs", "--format", "json").stdout)["runs"]
    assert [r["exit_code"] for r in left] == [6, 0]  # the newest, and last-good
    assert world.envguard("runs", "prune", "--keep", "0").returncode == 0
    assert [r["exit_code"] for r in world.records()] == [0]
    (stored,) = world.stored()  # the newer environment's snapshot has no run left
    assert stored.name == world.last_good()["snapshot"] + ".json"
    bad = world.envguard("runs", "prune", "--keep", "-1")
    assert bad.returncode == ExitCode.USAGE


# ---------------------------------------------------------------------- plain python

def test_a_plain_python_script_under_a_lock_of_its_own_name(world: World) -> None:
    locked = world.envguard("lock", "train", "--python", world.env.python)
    assert locked.returncode == 0, locked.stderr
    sub = world.project / "src" / "deeper"
    sub.mkdir(parents=True)
    # From a subfolder: the lock is found in a parent's lockfiles/.
    proc = world.envguard("run", "--lock", "train", "--", world.env.python,
                          world.project / "train.py", "0", cwd=sub)
    assert proc.returncode == 0, proc.stderr
    assert "train.py ran" in proc.stdout
    record = json.loads(next((sub / ".envguard" / "runs").glob("*.run.json")).read_text())
    assert record["lock"] == "train" and record["passed"] is True
    assert record["lockfile"] == str(world.project / "lockfiles" / "train.toml")
    world.venvs.uv_install(world.env, world.vllm)
    refused = world.envguard("run", "--lock", "train", "--", world.env.python,
                             world.project / "train.py", "0", cwd=sub)
    assert refused.returncode == ExitCode.REFUSED, refused.stderr


def test_a_run_that_cannot_be_recorded_keeps_the_childs_status(world: World) -> None:
    (world.project / ".envguard").write_text("not a folder\n")
    proc = world.run("7")
    assert proc.returncode == 7, proc.stderr
    assert "demo-train ran 7" in proc.stdout
    line = envguard_lines(proc.stderr)[-1]  # after the gate's own lines
    assert line.startswith("envguard: could not record this run: cannot write "), line
