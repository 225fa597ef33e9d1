"""The gate end to end: ``envguard lock``, ``check`` and ``run`` on real uv-built venvs.

A temporary project (its own ``pyproject.toml``, ``src/x.py`` and ``lockfiles/``) guards
``demo-train``, a console script from a tiny wheel that requires a fake torch. envguard
runs as a real subprocess with the project as its working directory; each venv is a real
venv, and each way of breaking it (a serving stack installed, torch or another package
rebuilt under the same version, an edited source file) is done for real. The last tests
guard ``dflash-train`` with a lock of this checkout's own ``.venv``, whatever it holds, and
check the bundled ``lockfiles/dflash-train.toml`` only in the environment CI builds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from envguard.exitcodes import ExitCode
from envguard.gate import interpreter_of, read_lock
from envguard.gate.lockfile import dump_lock
from tests.paths import REPO
from tests.wheelfactory import Venv, VenvFactory, build_wheel, fake_torch_files

REPO_PYTHON = REPO / ".venv" / "bin" / "python"
REPO_DFLASH = REPO / ".venv" / "bin" / "dflash-train"

DEMO_MAIN = '''\
import json
import os
import signal
import sys
import time
from pathlib import Path


def main():
    args = sys.argv[1:]
    print("demo-train argv=" + json.dumps(args), flush=True)
    print("demo-train verified=" + os.environ.get("ENVGUARD_VERIFIED", "-"), flush=True)
    mode = args[0] if args else "0"
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "wait-term":
        folder = Path(args[1])

        def on_term(signum, frame):
            (folder / "got-sigterm").write_text(str(signum))
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_term)
        (folder / "ready").write_text(str(os.getpid()))
        time.sleep(30)
        return 99
    return int(mode)
'''


@dataclasses.dataclass(frozen=True)
class Envs:
    good: Venv
    """fake torch 2.11.0+cu128 and demo-train: the environment every project locks."""
    spaced: Venv
    """The same wheels in a folder whose name has a space (a /bin/sh shebang trampoline)."""
    polluted: Venv
    """The same, plus sglang."""
    torch_rebuilt: Venv
    """The same, then torch reinstalled from another build of the same version."""
    demo_rebuilt: Venv
    """The same, then demo-train reinstalled from another build of the same version."""
    cpu: Venv
    """Another environment: a CPU build of torch (default entry id ...-cpu)."""


@pytest.fixture(scope="module")
def envs(module_venvs: VenvFactory) -> Envs:
    venvs = module_venvs
    root, wheels = venvs.root.parent, venvs.wheels
    torch = build_wheel(wheels, "torch", "2.11.0+cu128", fake_torch_files())
    demo = build_wheel(wheels, "demo-train", "1.0", {"demo_train/__init__.py": DEMO_MAIN},
                       requires=("torch",), scripts={"demo-train": "demo_train:main"})
    sglang = build_wheel(wheels, "sglang", "0.5.6", {"sglang/__init__.py": ""})
    # Same names and versions, other builds: kept out of the --find-links folder.
    torch2 = build_wheel(root / "rebuilt-torch", "torch", "2.11.0+cu128",
                         fake_torch_files(git_version="e2b8a1c7" * 5))
    demo2 = build_wheel(root / "rebuilt-demo", "demo-train", "1.0",
                        {"demo_train/__init__.py": DEMO_MAIN + "# rebuilt\n"},
                        requires=("torch",), scripts={"demo-train": "demo_train:main"})
    cpu_torch = build_wheel(root / "cpu-torch", "torch", "2.11.0+cpu",
                            fake_torch_files(version="2.11.0+cpu", cuda=None,
                                             git_version="c" * 40))

    def make(name: str, *extra: Path) -> Venv:
        env = venvs.create(name)
        venvs.uv_install(env, torch, demo, *extra)
        return env

    torch_rebuilt = make("torch-rebuilt")
    venvs.uv_install(torch_rebuilt, torch2, reinstall=True)
    demo_rebuilt = make("demo-rebuilt")
    venvs.uv_install(demo_rebuilt, demo2, reinstall=True)
    cpu = venvs.create("cpu")
    venvs.uv_install(cpu, cpu_torch, demo)
    return Envs(good=make("good"), spaced=make("with space"), polluted=make("polluted", sglang),
                torch_rebuilt=torch_rebuilt, demo_rebuilt=demo_rebuilt, cpu=cpu)


def envguard(*args: str | Path, cwd: Path,
             timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "envguard", *map(str, args)], cwd=cwd,
                          env=child_env(), capture_output=True, text=True, timeout=timeout,
                          check=False)


def child_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "ENVGUARD_VERIFIED"}


def flat(text: str) -> str:
    """Text output with rich's line wrapping undone."""
    return " ".join(text.split())


def script(env: Venv) -> Path:
    return env.path / "bin" / "demo-train"


def make_project(where: Path) -> Path:
    project = where.resolve()
    (project / "src").mkdir(parents=True)
    (project / "lockfiles").mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "demo-project"\nversion = "0"\n')
    (project / "src" / "x.py").write_text("LEARNING_RATE = 3e-4\n")
    return project


def lock(project: Path, python: Venv, *extra: str) -> subprocess.CompletedProcess[str]:
    proc = envguard("lock", "demo-train", "--python", python.python, "--file", "src/*.py",
                    *extra, cwd=project)
    assert proc.returncode == ExitCode.OK, proc.stderr
    return proc


@pytest.fixture
def project(tmp_path: Path, envs: Envs) -> Path:
    """A project whose lockfiles/demo-train.toml has one entry, locked from ``envs.good``."""
    project = make_project(tmp_path / "project")
    lock(project, envs.good)
    return project


def runs(project: Path) -> list[dict[str, Any]]:
    """The run records, oldest first."""
    folder = project / ".envguard" / "runs"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.run.json"))]


# ---------------------------------------------------------------------------- lock, check

def test_lock_then_check(tmp_path: Path, envs: Envs) -> None:
    project = make_project(tmp_path / "project")
    proc = lock(project, envs.good)
    path = project / "lockfiles" / "demo-train.toml"
    assert "lockfiles/demo-train.toml: added entry" in proc.stdout
    locked = read_lock(path)
    assert (locked.name, locked.command, locked.distribution) == (
        "demo-train", "demo-train", "demo-train")
    assert [f.path for f in locked.files] == ["src/x.py"]
    assert locked.files[0].md5 == hashlib.md5((project / "src/x.py").read_bytes()).hexdigest()
    (entry,) = locked.entries
    assert entry.id.endswith("-cu128")
    assert (entry.torch_version, entry.torch_git_version, entry.torch_cuda) == (
        "2.11.0+cu128", "70d99e998b4955e0049d13a98d77ae1b14db1f45", "12.8")
    assert [p.name for p in entry.packages] == ["demo-train", "torch"]
    assert all(p.fingerprint and p.fingerprint.startswith("sha256:") for p in entry.packages)
    assert entry.snapshot_file is not None
    assert (path.parent / entry.snapshot_file).is_file()

    check = envguard("check", "demo-train", "--python", envs.good.python, cwd=project)
    assert check.returncode == ExitCode.OK, check.stdout + check.stderr
    assert f"matches entry {entry.id}" in flat(check.stdout)

    as_json = envguard("check", "demo-train", "--python", envs.good.python, "--format", "json",
                       cwd=project)
    assert as_json.returncode == ExitCode.OK, as_json.stderr
    assert json.loads(as_json.stdout)["equivalent"] is True


def test_check_json_on_a_mismatch(project: Path, envs: Envs) -> None:
    proc = envguard("check", "demo-train", "--python", envs.torch_rebuilt.python,
                    "--format", "json", cwd=project)
    assert proc.returncode == ExitCode.DRIFT, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "envguard.diff/1"
    assert doc["equivalent"] is False
    assert doc["new"] == "this environment"
    assert str(project / "lockfiles" / "demo-train.toml") in doc["old"]
    rules = [f["rule"] for f in doc["findings"]]
    # The cold compile cache is only a warning under warn-if-cold: never the headline.
    assert rules[0] == "torch-build-changed" and rules[-1] == "compile-cache-cold", rules
    assert doc["verdict"].startswith("most likely cause: torch was reinstalled"), doc["verdict"]
    assert {(c["section"], c["key"]) for c in doc["changes"] if c["material"]} >= {
        ("torch", "git_version")}


# ---------------------------------------------------------------------------- run

@pytest.mark.parametrize(("arg", "code"), [("0", 0), ("1", 1), ("42", 42), ("kill", 137)])
def test_run_passes_the_childs_status_on(project: Path, envs: Envs, arg: str, code: int) -> None:
    proc = envguard("run", "--", script(envs.good), arg, cwd=project)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert f"demo-train argv={json.dumps([arg])}" in proc.stdout
    assert "demo-train verified=demo-train:" in proc.stdout
    (record,) = runs(project)
    assert record["passed"] is True and record["forced"] is False
    assert record["exit_code"] == code
    assert record["argv"] == [str(script(envs.good)), arg]
    # Only a run that exited 0 becomes last-good (tests/envguard/runs/test_runs.py has the rest).
    assert (project / ".envguard" / "runs" / "last-good.json").is_file() == (code == 0)


def test_run_leaves_argv_alone(project: Path, envs: Envs) -> None:
    odd = ["7", "--force", "--lock", "a b", "$HOME", "*", "", "--", "ü"]
    proc = envguard("run", "--", script(envs.good), *odd, cwd=project)
    assert proc.returncode == 7, proc.stderr
    assert f"demo-train argv={json.dumps(odd)}" in proc.stdout


@pytest.mark.parametrize(("command", "message"), [
    ("qatool", "command not found: qatool"),
    ("./no/such/tool", "command not found: ./no/such/tool"),
    ("./src", "command not found: ./src"),
    ("./src/x.py", "command not executable: ./src/x.py"),
])
def test_run_of_a_missing_command_is_exit_2_before_the_gate(project: Path, command: str,
                                                           message: str) -> None:
    """The old code checked envguard's own venv against the lock and refused (exit 3)."""
    proc = envguard("run", "--lock", "lockfiles/demo-train.toml", "--", command, cwd=project)
    assert proc.returncode == ExitCode.USAGE, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [f"envguard: error: {message}"]
    assert runs(project) == []


def test_run_finds_the_interpreter_behind_a_shell_trampoline(project: Path,
                                                             envs: Envs) -> None:
    assert script(envs.spaced).read_text().startswith("#!/bin/sh\n")
    assert interpreter_of(str(script(envs.spaced))) == str(envs.spaced.python)
    assert interpreter_of(str(script(envs.good))) == str(envs.good.python)
    proc = envguard("run", "--", script(envs.spaced), "5", cwd=project)
    assert proc.returncode == 5, proc.stderr


def test_sigterm_reaches_the_child(project: Path, envs: Envs, tmp_path: Path) -> None:
    folder = tmp_path / "signals"
    folder.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "envguard", "run", "--", str(script(envs.good)),
                             "wait-term", str(folder)], cwd=project, env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (folder / "ready").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the child never became ready"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        ready = folder / "ready"
        if ready.exists() and not (folder / "got-sigterm").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(ready.read_text()), signal.SIGKILL)
    assert (folder / "got-sigterm").read_text() == str(int(signal.SIGTERM))
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    assert runs(project)[-1]["exit_code"] == 128 + signal.SIGTERM


# ---------------------------------------------------------------------------- refusals

def test_foreign_stack_is_refused_unless_forced(project: Path, envs: Envs) -> None:
    refused = envguard("run", "--", script(envs.polluted), "5", cwd=project)
    assert refused.returncode == ExitCode.REFUSED, refused.stdout + refused.stderr
    assert "foreign-stack-installed" in refused.stderr
    assert "envguard: refused to run demo-train" in flat(refused.stderr)
    assert "demo-train argv=" not in refused.stdout  # the child never started
    (record,) = runs(project)
    assert record["passed"] is False and record["forced"] is False
    assert record["exit_code"] is None
    assert "foreign-stack-installed" in record["findings"]

    forced = envguard("run", "--force", "--", script(envs.polluted), "5", cwd=project)
    assert forced.returncode == 5, forced.stderr
    assert "envguard: --force: running demo-train" in flat(forced.stderr)
    assert "demo-train verified=-" in forced.stdout  # not verified: no ENVGUARD_VERIFIED
    record = runs(project)[-1]
    assert record["forced"] is True and record["passed"] is False
    assert record["exit_code"] == 5
    assert not (project / ".envguard" / "runs" / "last-good.json").exists()

    check = envguard("check", "demo-train", "--python", envs.polluted.python, cwd=project)
    assert check.returncode == ExitCode.DRIFT
    assert "most likely cause: inference packages went into the training environment " \
        "(sglang)" in flat(check.stdout)


def test_require_warm_cache_policy(tmp_path: Path, envs: Envs) -> None:
    project = make_project(tmp_path / "project")
    lock(project, envs.good, "--cache-policy", "require-warm")
    assert read_lock(project / "lockfiles" / "demo-train.toml").cache_policy == "require-warm"
    cold = envguard("check", "demo-train", "--python", envs.good.python, cwd=project)
    assert cold.returncode == ExitCode.DRIFT
    assert "[compile-cache-cold]" in flat(cold.stdout)
    assert "and this lock requires a warm cache" in flat(cold.stdout)
    refused = envguard("run", "--", script(envs.good), "0", cwd=project)
    assert refused.returncode == ExitCode.REFUSED and "compile-cache-cold" in refused.stderr
    cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "fxgraph"
    cache.mkdir(parents=True)
    (cache / "entry.bin").write_bytes(b"k" * 4096)
    warm = envguard("run", "--", script(envs.good), "0", cwd=project)
    assert warm.returncode == 0, warm.stderr
    assert "compile-cache-cold" not in warm.stderr


@pytest.mark.parametrize(("venv", "rule", "absent"), [
    ("torch_rebuilt", "torch-build-changed", "torch-version-changed"),
    ("demo_rebuilt", "package-build-changed", "torch-build-changed"),
])
def test_same_version_rebuilds_are_refused(project: Path, envs: Envs, venv: str, rule: str,
                                           absent: str) -> None:
    env: Venv = getattr(envs, venv)
    check = envguard("check", "demo-train", "--python", env.python, cwd=project)
    assert check.returncode == ExitCode.DRIFT, check.stdout + check.stderr
    assert f"[{rule}]" in flat(check.stdout)
    assert absent not in check.stdout
    proc = envguard("run", "--", script(env), "0", cwd=project)
    assert proc.returncode == ExitCode.REFUSED, proc.stdout + proc.stderr
    assert rule in proc.stderr
    assert "demo-train argv=" not in proc.stdout


def test_edited_file_is_refused_with_both_md5s(project: Path, envs: Envs) -> None:
    source = project / "src" / "x.py"
    old = hashlib.md5(source.read_bytes()).hexdigest()
    source.write_text("LEARNING_RATE = 3e-3\n")
    new = hashlib.md5(source.read_bytes()).hexdigest()
    check = envguard("check", "demo-train", "--python", envs.good.python, "--verbose",
                     cwd=project)
    assert check.returncode == ExitCode.DRIFT
    assert "file-changed" in check.stdout
    assert f"md5 {old} → {new}" in flat(check.stdout)
    proc = envguard("run", "--", script(envs.good), "0", cwd=project)
    assert proc.returncode == ExitCode.REFUSED
    assert "[file-changed]" in proc.stderr and "  files (1): src/x.py\n" in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("  envguard lock demo-train"), proc.stderr
    source.unlink()
    gone = envguard("check", "demo-train", "--python", envs.good.python, "--verbose",
                    cwd=project)
    assert gone.returncode == ExitCode.DRIFT
    assert f"missing now (md5 was {old})" in flat(gone.stdout)


# ---------------------------------------------------------------------------- entries

def test_entries_from_two_environments(tmp_path: Path, envs: Envs) -> None:
    project = make_project(tmp_path / "project")
    path = project / "lockfiles" / "demo-train.toml"
    lock(project, envs.good)
    (first,) = read_lock(path).entries
    proc = lock(project, envs.cpu)
    assert "2 entries in all" in proc.stdout
    both = read_lock(path).entries
    cpu = next(e for e in both if e.id != first.id)
    assert first in both  # the other environment's entry is kept as it was
    assert cpu.id.endswith("-cpu") and cpu.torch_version == "2.11.0+cpu"
    for env, entry in ((envs.good, first), (envs.cpu, cpu)):
        check = envguard("check", "demo-train", "--python", env.python, cwd=project)
        assert check.returncode == ExitCode.OK, check.stdout
        assert f"matches entry {entry.id} " in flat(check.stdout)

    # Same id again: replaced, not added.
    again = lock(project, envs.cpu)
    assert f"replaced entry {cpu.id}" in again.stdout
    entries = read_lock(path).entries
    assert [e.id for e in entries] == sorted([first.id, cpu.id])
    assert first in entries and cpu not in entries  # a new snapshot, a new digest

    # An explicit --entry, taken over by another environment.
    lock(project, envs.good, "--entry", "shared")
    assert next(e for e in read_lock(path).entries if e.id == "shared").torch_cuda == "12.8"
    taken = lock(project, envs.cpu, "--entry", "shared")
    assert "replaced entry shared" in taken.stdout and "3 entries in all" in taken.stdout
    shared = next(e for e in read_lock(path).entries if e.id == "shared")
    assert (shared.torch_version, shared.torch_cuda) == ("2.11.0+cpu", None)
    for env in (envs.good, envs.cpu):
        check = envguard("check", "demo-train", "--python", env.python, cwd=project)
        assert check.returncode == ExitCode.OK, check.stdout
    assert envguard("check", "demo-train", "--python", envs.torch_rebuilt.python,
                    cwd=project).returncode == ExitCode.DRIFT


def test_a_new_machine_is_refused_with_how_to_bless_it(tmp_path: Path, envs: Envs) -> None:
    project = make_project(tmp_path / "project")
    lock(project, envs.good, "--entry", "gpu-box")
    reference = project / "lockfiles" / "demo-train.snapshots" / "gpu-box.json"
    doc = json.loads(reference.read_text())
    doc["system"]["hostname"] = "gpu-box-7"  # the entry was recorded on another host
    reference.write_text(json.dumps(doc))

    check = envguard("check", "demo-train", "--python", envs.cpu.python, "--verbose",
                     cwd=project)
    assert check.returncode == ExitCode.DRIFT, check.stdout + check.stderr
    out = flat(check.stdout)
    assert "[new-machine]" in out
    assert "the closest entry, gpu-box, was recorded on gpu-box-7 (" in out
    assert "torch CUDA 12.8)" in out and "torch cpu)" in out
    assert "bless it: envguard lock demo-train" in out
    assert "torch-version-changed" not in out and "change(s)" not in out

    refused = envguard("run", "--", script(envs.cpu), "0", cwd=project)
    assert refused.returncode == ExitCode.REFUSED, refused.stdout + refused.stderr
    assert "envguard: refused to run demo-train: this machine is new to" in flat(refused.stderr)
    assert "demo-train argv=" not in refused.stdout
    assert runs(project)[-1]["findings"][0] == "new-machine"

    lock(project, envs.cpu)  # blessed: its own entry now
    again = envguard("check", "demo-train", "--python", envs.cpu.python, cwd=project)
    assert again.returncode == ExitCode.OK, again.stdout


# ---------------------------------------------------------------------------- dflash-train

def _repo_venv() -> None:
    if not (REPO_PYTHON.exists() and REPO_DFLASH.exists()):
        pytest.skip("the checkout's .venv (built by .ci/run) is missing")


def dflash(*args: str | Path, cwd: Path,
           verified: str | None = None) -> subprocess.CompletedProcess[str]:
    env = child_env()
    if verified is not None:
        env["ENVGUARD_VERIFIED"] = verified
    return subprocess.run([str(REPO_DFLASH), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def dflash_project(tmp_path: Path) -> Path:
    """A copy of the project's guarded files and bundled lock, outside the checkout."""
    project = (tmp_path / "dflash-project").resolve()
    (project / "lockfiles").mkdir(parents=True)
    shutil.copytree(REPO / "dflash", project / "dflash",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "lockfiles" / "dflash-train.toml", project / "lockfiles")
    (project / "pyproject.toml").write_text('[project]\nname = "scratch"\nversion = "0"\n')
    return project


def _this_environment_only(project: Path) -> Path:
    """The project's lock with its entries dropped and this checkout's .venv locked instead
    (as entry ``here``): what a user does on a new machine."""
    path = project / "lockfiles" / "dflash-train.toml"
    path.write_text(dump_lock(dataclasses.replace(read_lock(path), entries=())))
    proc = envguard("lock", "dflash-train", "--python", REPO_PYTHON, "--entry", "here",
                    cwd=project, timeout=180)
    assert proc.returncode == ExitCode.OK, proc.stdout + proc.stderr
    assert [e.id for e in read_lock(path).entries] == ["here"]
    return path


def _break_torch_pin(path: Path) -> None:
    original = read_lock(path)
    entries = tuple(dataclasses.replace(e, torch_git_version="0" * 40) for e in original.entries)
    path.write_text(dump_lock(dataclasses.replace(original, entries=entries)))


def test_dflash_train_passes_a_lock_of_this_environment(dflash_project: Path) -> None:
    """No test depends on the exact package set of the bundled lock: this one locks the
    environment it runs in, whatever PyPI served today."""
    _repo_venv()
    path = _this_environment_only(dflash_project)
    check = envguard("check", "dflash-train", "--python", REPO_PYTHON, cwd=dflash_project,
                     timeout=120)
    assert check.returncode == ExitCode.OK, check.stdout + check.stderr
    assert "matches entry here " in flat(check.stdout)

    out = dflash_project / "out"
    direct = dflash("--check", "--out", out, cwd=dflash_project)
    assert direct.returncode == 0, direct.stdout + direct.stderr
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["unguarded"] is False and meta["guard"] == f"checked {path}"
    _assert_env_json(out, meta)
    shutil.rmtree(out)
    via_run = envguard("run", "--", REPO_DFLASH, "--check", "--out", out, cwd=dflash_project,
                       timeout=120)
    assert via_run.returncode == 0, via_run.stderr
    meta = json.loads((out / "metadata.json").read_text())
    guard = meta["guard"]
    assert guard.startswith("verified by envguard run (dflash-train:here:"), guard
    # the very snapshot envguard run's gate took, handed over in a private file
    assert guard.endswith(f":{_assert_env_json(out, meta)})")
    assert not any(Path(tempfile.gettempdir()).glob("envguard-run-*/snapshot.json"))


def _assert_env_json(out: Path, meta: dict[str, Any]) -> str:
    """The run folder's env.json is a snapshot of this .venv, and metadata.json names its
    sha256; returns it."""
    from envguard.snapshot_file import read_snapshot

    digest = "sha256:" + hashlib.sha256((out / "env.json").read_bytes()).hexdigest()
    assert meta["environment"] == {"file": "env.json", "sha256": digest}
    snap = read_snapshot(out / "env.json")
    assert Path(snap.interpreter.prefix).resolve() == REPO_PYTHON.parent.parent.resolve()
    return digest


def test_dflash_train_refuses_an_edited_lock(dflash_project: Path) -> None:
    _repo_venv()
    path = _this_environment_only(dflash_project)
    out = dflash_project / "out"
    _break_torch_pin(path)
    for verified in (None, "another-lock:x:y"):
        refused = dflash("--check", "--out", out, cwd=dflash_project, verified=verified)
        assert refused.returncode == 3, refused.stdout + refused.stderr
        assert "dflash-train: [torch-build-changed]" in refused.stderr
        assert "refusing to start" in refused.stderr
        assert not out.exists()
    run = envguard("run", "--", REPO_DFLASH, "--check", "--out", out, cwd=dflash_project,
                   timeout=120)
    assert run.returncode == ExitCode.REFUSED and "torch-build-changed" in run.stderr
    assert not out.exists()

    unguarded = dflash("--check", "--unguarded", "--out", out, cwd=dflash_project)
    assert unguarded.returncode == 0, unguarded.stderr
    assert "UNGUARDED" in unguarded.stdout
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["unguarded"] is True
    assert meta["guard"] == f"checked {path}"
    _assert_env_json(out, meta)  # the drifted environment is recorded too


def _ci_difference() -> str | None:
    """Why this checkout's .venv is not the environment ``.ci/run`` builds, or None if it is:
    every distribution but the editable project pinned by .ci/constraints.txt, exactly."""
    from envguard.names import normalize_name
    from envguard.probe import collect
    from envguard.probe.options import locations_only

    pins = {}
    for line in (REPO / ".ci" / "constraints.txt").read_text().splitlines():
        name, _, version = line.split("#", 1)[0].strip().partition("==")
        if name:
            pins[normalize_name(name)] = version.strip()
    installed = {p.name: p.version for p in collect(locations_only(str(REPO_PYTHON))).packages
                 if not p.editable}
    if installed.get("torch") != pins.get("torch"):
        return f"torch is {installed.get('torch')}, CI's is {pins.get('torch')}"
    differ = sorted(n for n in {*pins, *installed} if pins.get(n) != installed.get(n))
    if differ:
        return f"{len(differ)} distribution(s) differ from .ci/constraints.txt: " \
               + ", ".join(f"{n} {installed.get(n)} (CI {pins.get(n)})" for n in differ[:5])
    return None


def test_bundled_ci_entry_matches_the_ci_environment() -> None:
    """The bundled lock's ``ci-cpu`` entry pins what .ci/run builds; checked only there.
    Its pinned files are left out: ``envguard lock`` re-hashes them whenever dflash changes,
    and the two tests above check file pins on a lock of their own."""
    _repo_venv()
    reason = _ci_difference()
    if reason is not None:
        pytest.skip(f"not the environment .ci/run builds from .ci/constraints.txt: {reason}")
    from envguard.gate import check, gate_snapshot_options
    from envguard.probe import collect

    path = REPO / "lockfiles" / "dflash-train.toml"
    lock = dataclasses.replace(read_lock(path), file_patterns=(), files=())
    snapshot = collect(gate_snapshot_options(lock, REPO, python=str(REPO_PYTHON)))
    result = check(snapshot, lock, str(path), REPO)
    assert result.matched is not None and result.matched.entry.id == "ci-cpu", [
        f"[{f.rule}] {f.title}" for f in result.findings]
