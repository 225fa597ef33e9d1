"""``envguard bisect``: real venvs built by uv from tiny wheels made here, real commands.

Each scenario is a pair of real venvs (GOOD and BAD) and their real snapshots; the bisection
then builds the sets in between with uv, offline, from the test's wheel folders. The pure
ddmin search is also checked on its own against set oracles.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from envguard.bisection.builds import locate, wheel_fingerprint
from envguard.bisection.changeset import (
    DOWNGRADE,
    ENV,
    INSTALL,
    REBUILD,
    REMOVE,
    UPGRADE,
    ChangeSet,
)
from envguard.bisection.search import FAIL, PASS, SKIP, Config, ddmin, split
from envguard.exitcodes import ExitCode
from envguard.model import CondaPackage
from envguard.restore.plan import file_url_path
from envguard.snapshot_file import read_snapshot
from tests.wheelfactory import build_wheel, fake_torch_files, interruptible
from tests.wheelfactory import find_uv as find_uv_for_tests

GOOD_GIT = "e2b8a1c7f0d94c3b8a5f6e7d8c9b0a1f2e3d4c5b"
BAD_GIT = "70d99e998b4955e0049d13a98d77ae1b14db1f45"
BROKEN = "raise ImportError('this build is broken')\n"


# --- ddmin on its own ------------------------------------------------------------------

def oracle(fails: Callable[[Config], str]) -> tuple[list[Config], Callable[..., list[str]]]:
    seen: list[Config] = []

    def test(configs: list[Config]) -> list[str]:
        seen.extend(configs)
        return [fails(c) for c in configs]

    return seen, test



@pytest.mark.parametrize("jobs", [1, 3])
def test_ddmin_one_culprit_of_eight(jobs: int) -> None:
    seen, test = oracle(lambda c: FAIL if 5 in c else PASS)
    result = ddmin(8, test, jobs=jobs)
    assert result.culprits == {5}
    assert result.unproven == ()
    assert len(set(seen)) < 8  # fewer trials than trying each change alone


@pytest.mark.parametrize("jobs", [1, 4])
def test_ddmin_two_changes_that_fail_only_together(jobs: int) -> None:
    _seen, test = oracle(lambda c: FAIL if {2, 6} <= c else PASS)
    assert ddmin(8, test, jobs=jobs).culprits == {2, 6}


def test_ddmin_skips_are_unknown_not_failures() -> None:
    # {0, 1} cannot be built (1 needs 2); 3 breaks it
    def fails(c: Config) -> str:
        if 1 in c and 2 not in c:
            return SKIP
        return FAIL if 3 in c else PASS

    assert ddmin(4, oracle(fails)[1]).culprits == {3}


def test_ddmin_says_when_a_removal_could_not_be_tested() -> None:
    # 0 and 1 fail together, and 0 without 1 cannot be built: minimality is unproven
    def fails(c: Config) -> str:
        if 0 in c and 1 not in c:
            return SKIP
        return FAIL if {0, 1} <= c else PASS

    result = ddmin(3, oracle(fails)[1])
    assert result.culprits == {0, 1}
    assert result.unproven == (1,)


def test_split_keeps_every_item_once() -> None:
    assert split([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
    assert split([1, 2], 4) == [[1], [2]]


# --- real venvs -----------------------------------------------------------------------

@dataclass
class World:
    root: Path
    uv: str
    wheels: Path
    good_torch: Path
    bad_torch: Path
    env: dict[str, str]
    n: int = 0

    def venv(self, reqs: list[str], *, links: tuple[Path, ...] = ()) -> Path:
        self.n += 1
        path = self.root / "venvs" / f"v{self.n}"
        run([self.uv, "venv", "--quiet", "--python", os.path.realpath(sys.executable),
             str(path)], self.env)
        if reqs:
            args = [self.uv, "pip", "install", "--quiet", "--python", str(path / "bin" / "python"),
                    "--no-index", "--find-links", str(self.wheels)]
            for link in links:
                args += ["--find-links", str(link)]
            run([*args, *reqs], self.env)
        return path

    def snapshot(self, venv: Path, name: str, **extra_env: str) -> Path:
        """The venv's snapshot, taken in this process (the CLI's own path is what the
        bisect commands exercise), with the variables of ``extra_env`` recorded."""
        import envguard

        out = self.root / f"{name}.json"
        envguard.snapshot(venv / "bin" / "python", verify="none", cwd=self.root,
                          env={**self.env, **extra_env}).write(out)
        return out

    def pair(self, name: str, good: list[str], bad: list[str], *,
             bad_links: tuple[Path, ...] = (), good_links: tuple[Path, ...] = (),
             bad_env: dict[str, str] | None = None) -> tuple[Path, Path]:
        g = self.snapshot(self.venv(good, links=good_links), f"{name}-good")
        b = self.snapshot(self.venv(bad, links=bad_links), f"{name}-bad", **(bad_env or {}))
        return g, b

    def bisect(self, good: Path, bad: Path, *cmd: str, args: tuple[str, ...] = (),
               links: tuple[Path, ...] = ()) -> tuple[subprocess.CompletedProcess[str],
                                                      dict[str, object]]:
        found = ["--find-links", str(self.wheels)]
        for link in links:
            found += ["--find-links", str(link)]
        proc = subprocess.run(
            [sys.executable, "-m", "envguard", "bisect", str(good), str(bad), "--no-index",
             "--offline", *found, "--format", "json", "--workdir", str(self.root / "work"),
             *args, "--", *cmd], env=self.env, capture_output=True, text=True, timeout=300,
            check=False, cwd=self.root)
        doc = json.loads(proc.stdout) if proc.stdout.strip() else {}
        return proc, doc


def run(args: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(args, env=env, capture_output=True, text=True, check=False,
                          timeout=120)
    assert proc.returncode == 0, f"{args}: {proc.stderr}"


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("UV_", "PIP_", "TORCH")) and k not in ("VIRTUAL_ENV",
                                                                       "PYTHONPATH")}
    env.update({"UV_NO_CONFIG": "1", "UV_OFFLINE": "1", "UV_PYTHON_DOWNLOADS": "never",
                "UV_CACHE_DIR": str(home / "uv-cache"), "ENVGUARD_CACHE_DIR": str(home / "eg"),
                "XDG_CONFIG_HOME": str(home / "cfg"), "NO_COLOR": "1"})
    return env


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    uv = find_uv_for_tests()
    if uv is None:
        pytest.skip("uv is not installed")
    root = tmp_path_factory.mktemp("bisect")
    wheels = root / "wheels"
    for name in ("alpha", "beta", "gamma", "delta", "eps", "zeta"):
        build_wheel(wheels, name, "1.0", {f"{name}/__init__.py": "V = 1\n"})
        build_wheel(wheels, name, "2.0", {f"{name}/__init__.py": "V = 2\n"})
    build_wheel(wheels, "broken", "0.5", {"broken/__init__.py": BROKEN})
    build_wheel(wheels, "gamma", "3.0", {"gamma/__init__.py": BROKEN})
    build_wheel(wheels, "harmless", "1.0", {"harmless/__init__.py": ""})
    # the pair: pairing 2.0 breaks only with pairdep 2.0
    build_wheel(wheels, "pairing", "1.0", {"pairing/__init__.py": ""})
    build_wheel(wheels, "pairing", "2.0", {"pairing/__init__.py": (
        "import pairdep\nif pairdep.V == 2:\n"
        "    raise RuntimeError('pairing 2 with pairdep 2')\n")})
    build_wheel(wheels, "pairdep", "1.0", {"pairdep/__init__.py": "V = 1\n"})
    build_wheel(wheels, "pairdep", "2.0", {"pairdep/__init__.py": "V = 2\n"})
    # needy 2.0 needs zhelper>=2: with zhelper 1.0 the set is inconsistent
    build_wheel(wheels, "needy", "1.0", {"needy/__init__.py": ""})
    build_wheel(wheels, "needy", "2.0", {"needy/__init__.py": ""}, requires=("zhelper>=2",))
    build_wheel(wheels, "zhelper", "1.0", {"zhelper/__init__.py": ""})
    build_wheel(wheels, "zhelper", "2.0", {"zhelper/__init__.py": ""})
    # two builds of one torch version, in two folders (the same file name)
    good_torch, bad_torch = root / "torch-good", root / "torch-bad"
    build_wheel(good_torch, "torch", "2.11.0+cu130", fake_torch_files(
        version="2.11.0+cu130", git_version=GOOD_GIT, cuda="13.0"))
    build_wheel(bad_torch, "torch", "2.11.0+cu130", fake_torch_files(
        version="2.11.0+cu130", git_version=BAD_GIT, cuda="13.0"))
    return World(root=root, uv=uv, wheels=wheels, good_torch=good_torch, bad_torch=bad_torch,
                 env=_env(root / "home"))


IMPORT_ALL = ("python", "-c", "import alpha, beta, gamma, delta, torch")


def test_eight_changes_one_breaks(world: World) -> None:
    good, bad = world.pair(
        "eight",
        ["alpha==1.0", "beta==2.0", "gamma==1.0", "delta==1.0", "eps==1.0", "zeta==1.0",
         "torch==2.11.0+cu130"],
        ["alpha==2.0", "beta==1.0", "gamma==3.0", "delta==2.0", "zeta==2.0", "harmless==1.0",
         "torch==2.11.0+cu130"],
        good_links=(world.good_torch,), bad_links=(world.bad_torch,),
        bad_env={"TORCHINDUCTOR_MAX_AUTOTUNE": "1"})
    proc, doc = world.bisect(good, bad, *IMPORT_ALL, links=(world.good_torch, world.bad_torch))
    assert proc.returncode == ExitCode.OK, proc.stderr
    kinds = {c["id"]: c["kind"] for c in doc["changes"]}  # type: ignore[index, union-attr]
    assert kinds == {"alpha": UPGRADE, "beta": DOWNGRADE, "gamma": UPGRADE, "delta": UPGRADE,
                     "eps": REMOVE, "zeta": UPGRADE, "harmless": INSTALL, "torch": REBUILD,
                     "env:TORCHINDUCTOR_MAX_AUTOTUNE": ENV}
    (culprit,) = doc["culprits"]  # type: ignore[misc]
    assert culprit["id"] == "gamma" and culprit["label"] == "gamma 1.0 → 3.0"
    assert "package-version-changed" in {r["rule"] for r in culprit["rules"]}
    assert doc["verdict"] == "found"
    assert "alone, it makes the command fail" in doc["summary"]  # type: ignore[operator]
    trials = doc["trials"]
    assert 3 <= len(trials) < 9  # type: ignore[arg-type]
    failing = [t for t in trials if t["outcome"] == FAIL]  # type: ignore[union-attr]
    assert any("this build is broken" in line for t in failing for line in t["tail"])
    assert not list((world.root / "work").glob("run-*"))  # trial venvs removed


def test_two_changes_that_break_only_together(world: World) -> None:
    good, bad = world.pair("pair", ["pairing==1.0", "pairdep==1.0", "alpha==1.0"],
                           ["pairing==2.0", "pairdep==2.0", "alpha==2.0", "harmless==1.0"])
    proc, doc = world.bisect(good, bad, "python", "-c", "import pairing")
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert sorted(c["id"] for c in doc["culprits"]) == ["pairdep", "pairing"]  # type: ignore[union-attr]
    assert "together" in doc["summary"]  # type: ignore[operator]


def test_same_version_rebuild_found_with_both_fingerprints(world: World) -> None:
    good, bad = world.pair("rebuild", ["torch==2.11.0+cu130", "alpha==1.0"],
                           ["torch==2.11.0+cu130", "alpha==2.0"],
                           good_links=(world.good_torch,), bad_links=(world.bad_torch,))
    check = ("python", "-c", f"import torch.version as v; assert v.git_version == {GOOD_GIT!r}")
    proc, doc = world.bisect(good, bad, *check, links=(world.good_torch, world.bad_torch))
    assert proc.returncode == ExitCode.OK, proc.stderr
    (culprit,) = doc["culprits"]  # type: ignore[misc]
    g, b = read_snapshot(good).package("torch"), read_snapshot(bad).package("torch")
    assert g and b and g.fingerprint != b.fingerprint
    assert culprit["kind"] == REBUILD
    assert (culprit["good_fingerprint"], culprit["bad_fingerprint"]) == (g.fingerprint,
                                                                          b.fingerprint)
    assert g.fingerprint.removeprefix("sha256:")[:12] in culprit["label"]  # type: ignore[operator]
    assert b.fingerprint.removeprefix("sha256:")[:12] in culprit["label"]  # type: ignore[operator]
    assert "torch-build-changed" in {r["rule"] for r in culprit["rules"]}
    assert {b["source"] for b in doc["builds"]} == {"--find-links"}  # type: ignore[union-attr]
    # the text report names the culprit and the rule
    text = subprocess.run([sys.executable, "-m", "envguard", "bisect", str(good), str(bad),
                           "--no-index", "--offline", "--find-links", str(world.wheels),
                           "--find-links", str(world.good_torch), "--find-links",
                           str(world.bad_torch), "--", *check], env=world.env,
                          capture_output=True, text=True, check=False, timeout=300)
    assert text.returncode == ExitCode.OK, text.stderr
    assert "torch 2.11.0+cu130 rebuilt" in text.stdout
    assert "[torch-build-changed]" in text.stdout


def test_a_missing_build_is_named_not_replaced(world: World) -> None:
    good, bad = world.pair("missing", ["torch==2.11.0+cu130"], ["torch==2.11.0+cu130"],
                           good_links=(world.good_torch,), bad_links=(world.bad_torch,))
    # only BAD's wheel is reachable, GOOD's env is gone, and uv's cache is a fresh folder
    env = {**world.env, "UV_CACHE_DIR": str(world.root / "empty-cache")}
    g = read_snapshot(good).package("torch")
    assert g is not None
    shutil.rmtree(g.location)
    proc = subprocess.run(
        [sys.executable, "-m", "envguard", "bisect", str(good), str(bad), "--no-index",
         "--offline", "--find-links", str(world.bad_torch), "--", "python", "-c", "pass"],
        env=env, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    (error,) = [ln for ln in proc.stderr.splitlines() if not ln.startswith("envguard: look")]
    assert error.startswith("envguard: error: cannot find the exact build of torch "
                            "2.11.0+cu130 (GOOD's build"), error


def test_a_step_is_tried_with_what_it_needs(world: World) -> None:
    good, bad = world.pair("needs", ["needy==1.0", "zhelper==1.0", "alpha==1.0"],
                           ["needy==2.0", "zhelper==2.0", "alpha==1.0", "broken==0.5"])
    # changes: broken (+), needy 1→2, zhelper 1→2; ddmin first tries {broken, needy}: needy
    # 2.0 needs zhelper>=2, so the trial takes zhelper's step with it (before, the set did
    # not fit together and the trial was skipped)
    cmd = "import needy\ntry:\n    import broken\nexcept ModuleNotFoundError:\n    pass\n"
    proc, doc = world.bisect(good, bad, "python", "-c", cmd)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert [c["id"] for c in doc["culprits"]] == ["broken"]  # type: ignore[union-attr]
    trials = doc["trials"]
    assert not [t for t in trials if t["outcome"] == SKIP]  # type: ignore[union-attr]
    assert ["broken", "needy", "zhelper"] in [t["applied"] for t in trials]  # type: ignore[union-attr]


def test_the_culprit_alone_not_the_packages_it_pulled_in(world: World) -> None:
    """The break upgraded needy, whose new version needs zhelper 2 (the same install
    upgraded it): needy alone is the culprit, exactly, not needy with zhelper."""
    good, bad = world.pair("pulled", ["needy==1.0", "zhelper==1.0", "alpha==1.0"],
                           ["needy==2.0", "zhelper==2.0", "alpha==2.0"])
    cmd = ("import importlib.metadata as m\n"
           "assert m.version('needy') == '1.0', 'needy 2 breaks this'\n")
    proc, doc = world.bisect(good, bad, "python", "-c", cmd)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert doc["verdict"] == "found"
    assert [c["id"] for c in doc["culprits"]] == ["needy"]  # type: ignore[union-attr]


def test_good_failing_or_bad_passing_is_refused(world: World) -> None:
    good, bad = world.pair("refuse", ["alpha==1.0"], ["alpha==2.0"])
    proc, doc = world.bisect(good, bad, "python", "-c", "import alpha; assert alpha.V == 5")
    assert proc.returncode == ExitCode.REFUSED
    assert doc["verdict"] == "refused"
    assert "does not pass in" in doc["reason"]  # type: ignore[operator]
    assert "AssertionError" in "\n".join(doc["trials"][0]["tail"])  # type: ignore[index]
    assert proc.stderr.strip().endswith("bisect needs a GOOD that passes")
    proc, doc = world.bisect(good, bad, "python", "-c", "import alpha")
    assert proc.returncode == ExitCode.REFUSED
    assert "does not fail in" in doc["reason"]  # type: ignore[operator]


FLAKY = (
    "import os, sys, pathlib\n"
    "import alpha\n"
    "if alpha.V == 2:\n"
    "    counter = pathlib.Path(os.environ['FLAKY_COUNTER'])\n"
    "    n = int(counter.read_text()) if counter.exists() else 0\n"
    "    counter.write_text(str(n + 1))\n"
    "    sys.exit(1 if n % 2 else 0)\n"
)


@pytest.mark.parametrize(("runs", "code", "verdict"), [(2, ExitCode.DRIFT, "inconclusive"),
                                                        (6, ExitCode.OK, "found")])
def test_flaky_command_with_runs(world: World, runs: int, code: int, verdict: str) -> None:
    """The command fails every other run once alpha 2.0 is in: with --runs 2 BAD fails in
    1 of 2 runs, too few to trust a pass (inconclusive); with 6, the culprit stands."""
    good, bad = world.pair(f"flaky{runs}", ["alpha==1.0", "beta==1.0", "gamma==1.0"],
                           ["alpha==2.0", "beta==2.0", "gamma==2.0"])
    world.env["FLAKY_COUNTER"] = str(world.root / f"counter{runs}")
    try:
        proc, doc = world.bisect(good, bad, "python", "-c", FLAKY, args=("--runs", str(runs)))
    finally:
        del world.env["FLAKY_COUNTER"]
    assert proc.returncode == code, proc.stderr
    assert doc["verdict"] == verdict
    assert [c["id"] for c in doc["culprits"]] == ["alpha"]  # type: ignore[union-attr]
    mixed = [t for t in doc["trials"] if t["mixed"]]  # type: ignore[union-attr]
    assert mixed and all(len(t["runs"]) == runs for t in doc["trials"])  # type: ignore[union-attr]
    if verdict == "inconclusive":
        assert "failed in 1 of 2 runs" in doc["reason"]  # type: ignore[operator]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_sigint_in_the_middle_leaves_nothing_behind(world: World, jobs: str) -> None:
    """Ctrl-C while trials run (one at a time, or GOOD's and BAD's together in threads)
    kills them at once, not after they end, and removes every trial venv."""
    good, bad = world.pair(f"sigint{jobs}", ["alpha==1.0", "beta==1.0"],
                           ["alpha==2.0", "beta==2.0"])
    marker = world.root / f"sigint-pid{jobs}"
    sleeper = ("import os, time, pathlib; import alpha\n"
               "if alpha.V == 1:\n"
               f"    pathlib.Path({str(marker)!r}).write_text(str(os.getpid())); time.sleep(60)\n")
    work = world.root / f"sigint-work{jobs}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "envguard", "bisect", str(good), str(bad), "--jobs", jobs,
         "--no-index",
         "--offline", "--find-links", str(world.wheels), "--workdir", str(work), "--",
         "python", "-c", sleeper], env=world.env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the command never started"
    time.sleep(0.2)
    assert list(work.glob("run-*/trial-*")), "no trial venv while the command runs"
    proc.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    _out, err = proc.communicate(timeout=90)
    assert time.monotonic() - interrupted < 30, "the interruption waited for the trials"
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert list(work.iterdir()) == []
    child = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_no_command_and_no_differences_are_usage_errors(world: World) -> None:
    good, _bad = world.pair("same", ["alpha==1.0"], ["alpha==1.0"])
    for args in ([str(good), str(good)], [str(good), str(good), "--", "true"]):
        proc = subprocess.run([sys.executable, "-m", "envguard", "bisect", *args],
                              env=world.env, capture_output=True, text=True, check=False)
        assert proc.returncode == ExitCode.USAGE
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# --- exact builds ---------------------------------------------------------------------

def test_wheel_fingerprint_is_the_installed_fingerprint(world: World) -> None:
    venv = world.venv(["torch==2.11.0+cu130"], links=(world.bad_torch,))
    snap = read_snapshot(world.snapshot(venv, "fp"))
    dist = snap.package("torch")
    assert dist is not None
    (wheel,) = world.bad_torch.glob("*.whl")
    assert wheel_fingerprint(wheel) == dist.fingerprint
    (other,) = world.good_torch.glob("*.whl")
    assert wheel_fingerprint(other) != dist.fingerprint


def test_exact_build_from_uv_cache_and_from_the_installed_env(world: World,
                                                              tmp_path: Path) -> None:
    venv = world.venv(["torch==2.11.0+cu130", "alpha==1.0"], links=(world.good_torch,))
    dist = read_snapshot(world.snapshot(venv, "cache-src")).package("torch")
    assert dist is not None
    cache = Path(world.env["UV_CACHE_DIR"])
    found = locate(dist, find_links=(str(world.bad_torch),), uv_cache=cache,
                   out_dir=tmp_path / "a")
    assert found is not None and found.source == "uv cache"
    packed = file_url_path(found.requirement.split(" @ ", 1)[1])
    assert packed is not None and wheel_fingerprint(Path(packed)) == dist.fingerprint
    found = locate(dist, find_links=(), uv_cache=None, out_dir=tmp_path / "b")
    assert found is not None and found.source == "installed"
    # an edited file is not that build any more
    (Path(dist.location) / "torch" / "version.py").write_text("git_version = 'edited'\n")
    assert locate(dist, find_links=(), uv_cache=None, out_dir=tmp_path / "c") is None


def test_changeset_applies_steps_to_good(world: World) -> None:
    good, bad = world.pair("cs", ["alpha==1.0", "eps==1.0"], ["alpha==2.0", "zeta==1.0"],
                           bad_env={"TORCH_LOGS": "+dynamo"})
    changes = ChangeSet.between(read_snapshot(good), read_snapshot(bad))
    ids = [s.id for s in changes.steps]
    assert ids == ["alpha", "eps", "zeta", "env:TORCH_LOGS"]
    lines, missing = changes.requirements({0, 2})
    assert lines == ["alpha==2.0", "eps==1.0", "zeta==1.0"] and missing == []
    assert changes.environment({3}, {"TORCH_LOGS": "x"})["TORCH_LOGS"] == "+dynamo"
    assert "TORCH_LOGS" not in changes.environment(set(), {"TORCH_LOGS": "x"})
    assert changes.notes == ()
    conda = dataclasses.replace(read_snapshot(bad), conda=[
        CondaPackage(name="cudatoolkit", version="12.1.0", build="h0_0")])
    (note,) = ChangeSet.between(read_snapshot(good), conda).notes
    assert note.startswith("1 conda package(s) differ (cudatoolkit): trials are uv venvs")


def test_markdown_report_and_a_secret_in_the_command(world: World) -> None:
    good, bad = world.pair("md", ["alpha==1.0", "beta==1.0"], ["alpha==2.0", "beta==2.0"])
    secret = "hf_" + "q" * 34
    cmd = ("python", "-c", "import sys, alpha; sys.exit(alpha.V - 1)", f"--hf-token={secret}")
    proc = subprocess.run(
        [sys.executable, "-m", "envguard", "bisect", str(good), str(bad), "--no-index",
         "--offline", "--find-links", str(world.wheels), "--format", "markdown", "--", *cmd],
        env=world.env, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert proc.stdout.startswith("## envguard bisect: culprit found\n")
    assert "**alpha 1.0 → 2.0: alone, it makes the command fail**" in proc.stdout
    assert "| 1 | GOOD (none) | pass |" in proc.stdout
    assert secret not in proc.stdout + proc.stderr
    _proc, doc = world.bisect(good, bad, *cmd)
    assert secret not in json.dumps(doc)


def test_an_unusable_workdir_is_one_line(world: World, tmp_path: Path) -> None:
    good, bad = world.pair("wd", ["alpha==1.0"], ["alpha==2.0"])
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "envguard", "bisect", str(good), str(bad), "--workdir",
         str(blocker / "sub"), "--", "python", "-c", "pass"],
        env=world.env, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == ExitCode.USAGE
    assert proc.stderr.startswith("envguard: error: cannot make a work folder in ")
    assert len(proc.stderr.splitlines()) == 1


def test_an_environment_variable_is_a_change_and_can_be_the_culprit(world: World) -> None:
    good, bad = world.pair("envvar", ["alpha==1.0", "beta==1.0"], ["alpha==2.0", "beta==1.0"],
                           bad_env={"TORCHINDUCTOR_BREAK": "1"})
    cmd = "import os, sys; sys.exit(1 if os.environ.get('TORCHINDUCTOR_BREAK') else 0)"
    proc, doc = world.bisect(good, bad, "python", "-c", cmd, args=("-j", "2"))
    assert proc.returncode == ExitCode.OK, proc.stderr
    (culprit,) = doc["culprits"]  # type: ignore[misc]
    assert culprit["id"] == "env:TORCHINDUCTOR_BREAK" and culprit["kind"] == ENV
    assert culprit["label"] == "env TORCHINDUCTOR_BREAK: (unset) → '1'"
    assert "env-var-changed" in {r["rule"] for r in culprit["rules"]}
    assert doc["jobs"] == 2


def test_a_hang_fails_by_timeout_and_125_skips(world: World) -> None:
    good, bad = world.pair("hang", ["alpha==1.0", "beta==1.0", "gamma==1.0"],
                           ["alpha==2.0", "beta==2.0", "gamma==2.0"])
    # beta 2.0 hangs; alpha 2.0 without beta 2.0 "cannot be tested" (exit 125)
    cmd = ("import sys, time, alpha, beta\n"
           "if beta.V == 2:\n    time.sleep(60)\n"
           "if alpha.V == 2:\n    sys.exit(125)\n")
    started = time.monotonic()
    proc, doc = world.bisect(good, bad, "python", "-c", cmd, args=("--timeout", "2"))
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert [c["id"] for c in doc["culprits"]] == ["beta"]  # type: ignore[union-attr]
    trials = doc["trials"]
    assert any(t["runs"] and t["runs"][0]["timed_out"] for t in trials)  # type: ignore[union-attr]
    assert any(t["outcome"] == SKIP and "125" in t["reason"] for t in trials)  # type: ignore[union-attr]
    assert time.monotonic() - started < 50


def test_the_python_api(world: World) -> None:
    import envguard

    good, bad = world.pair("api", ["alpha==1.0", "beta==1.0"], ["alpha==1.0", "beta==2.0"])
    report = envguard.bisect(
        envguard.read_snapshot(good), envguard.read_snapshot(bad),
        ["python", "-c", "import beta; assert beta.V == 1"], find_links=[world.wheels],
        no_index=True, offline=True, workdir=world.root / "api-work", env=world.env)
    assert isinstance(report, envguard.BisectReport)
    assert report.verdict == "found"
    assert [c.step.id for c in report.culprits] == ["beta"]
    assert "beta 1.0 → 2.0: alone" in envguard.format_report(report)
    assert json.loads(envguard.format_report(report, "json"))["schema"] == "envguard.bisect/1"


def test_bad_is_this_environment_and_its_rebuild_is_packed_from_it(world: World) -> None:
    """The usual case: a GOOD.json from before, the broken venv is the one you are in (@now),
    and BAD's torch build exists nowhere but installed in it."""
    good_venv = world.venv(["torch==2.11.0+cu130", "alpha==1.0"], links=(world.good_torch,))
    good = world.snapshot(good_venv, "now-good")
    bad_venv = world.venv(["torch==2.11.0+cu130", "alpha==2.0"], links=(world.bad_torch,))
    env = {**world.env, "VIRTUAL_ENV": str(bad_venv),
           "UV_CACHE_DIR": str(world.root / "now-empty-cache")}
    check = f"import torch.version as v; assert v.git_version == {GOOD_GIT!r}"
    proc = subprocess.run(
        [sys.executable, "-m", "envguard", "bisect", str(good), "@now", "--no-index",
         "--offline", "--find-links", str(world.wheels), "--find-links", str(world.good_torch),
         "--format", "json", "--workdir", str(world.root / "now-work"), "--",
         "python", "-c", check], env=env, capture_output=True, text=True, timeout=300,
        check=False, cwd=world.root)
    assert proc.returncode == ExitCode.OK, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["bad"] == f"@now ({bad_venv})"
    assert [c["id"] for c in doc["culprits"]] == ["torch"]
    sources = {b["source"] for b in doc["builds"]}
    assert sources == {"--find-links", "installed"}


def test_dry_run_lists_the_changes_and_builds_nothing(world: World) -> None:
    good, bad = world.pair("dry", ["alpha==1.0", "torch==2.11.0+cu130"],
                           ["alpha==2.0", "torch==2.11.0+cu130"],
                           good_links=(world.good_torch,), bad_links=(world.bad_torch,))
    for args in ((), ("--", "python", "-c", "pass")):
        proc = subprocess.run(
            [sys.executable, "-m", "envguard", "bisect", str(good), str(bad), "--dry-run",
             "--find-links", str(world.good_torch), "--find-links", str(world.bad_torch),
             "--workdir", str(world.root / "dry-work"), *args],
            env=world.env, capture_output=True, text=True, check=False, timeout=120)
        assert proc.returncode == ExitCode.OK, proc.stderr
        out = " ".join(proc.stdout.split())  # rich wraps the long paths at 80 columns
        assert "planned (--dry-run: nothing built)" in out
        assert "2 change(s) to search; both builds of 1 same-version rebuild(s) found" in out
        assert "alpha 1.0 → 2.0" in out and "torch 2.11.0+cu130 rebuilt" in out
        assert "trial" not in proc.stderr  # nothing built, nothing run
        assert list((world.root / "dry-work").iterdir()) == []


def test_uv_check_conflicts_are_the_same_in_every_trial_folder(tmp_path: Path) -> None:
    """uv prints ``Using Python X environment at: <venv>`` with ``uv pip check``'s
    conflicts; that line names the trial's own folder, new in every trial, and must not
    count as a conflict (it made every trial of a set with a known conflict look newly
    inconsistent, so bisect skipped them all). Real uv, two real venvs, one conflict."""
    from envguard.bisection.trial import check_conflicts
    from envguard.restore.build import run_uv

    uv = find_uv_for_tests()
    wheels = tmp_path / "wheels"
    build_wheel(wheels, "demo-needs", "1.0", {"demo_needs/__init__.py": ""},
                requires=("demo-base>=2",))
    build_wheel(wheels, "demo-base", "1.0", {"demo_base/__init__.py": ""})
    found = []
    for name in ("trial-001", "trial-002"):
        venv = tmp_path / name / "venv"
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
        subprocess.run([uv, "pip", "install", "-q", "--offline", "--no-deps", "--python",
                        str(venv / "bin" / "python"), "--find-links", str(wheels),
                        "demo-needs", "demo-base==1.0"], check=True)
        checked = run_uv([uv, "pip", "check", "--color", "never", "--python",
                          str(venv / "bin" / "python")], timeout=60)
        assert not checked.ok
        conflicts = check_conflicts(checked.lines, venv)
        assert conflicts, checked.lines
        assert not any(name in line for line in conflicts), conflicts
        assert any("demo-base" in line for line in conflicts), conflicts
        found.append(conflicts)
    assert found[0] == found[1]


def test_a_shadow_in_the_working_folder_is_named_when_good_fails_too(world: World) -> None:
    """A ``random.py`` in the folder the command runs in breaks every trial alike, GOOD's
    too: no package change explains it, and the refusal says where the cause lies."""
    good, bad = world.pair("shadow", ["alpha==1.0"], ["alpha==2.0"])
    planted = world.root / "random.py"
    planted.write_text("import random\nrandom.randint(1, 2)\n")
    try:
        proc, doc = world.bisect(good, bad, "python", "-c", "import random; import alpha")
    finally:
        planted.unlink()
    assert proc.returncode == ExitCode.REFUSED
    reason = str(doc["reason"])
    assert "does not pass in" in reason
    assert f"{world.root} (working folder) holds 'random'" in reason, reason
    assert "the standard library's random" in reason
