"""``envguard fleet diff`` and ``fleet snapshot``: real snapshots, real processes, real torchrun.

The fleet snapshots are copies of ONE real snapshot of this interpreter, edited as JSON the
way real nodes differ (host names and clocks always; a torch build, a file, a variable on
the outliers). The gathering tests start real processes: plain subprocesses with
RANK/WORLD_SIZE for ``--dir``, and torchrun (CPU) for envguard's own TCP transport
(tests/envguard/fleet/test_hostile_fleet.py attacks that transport).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envguard.fleet.analyse import analyse, member_from_snapshot, normalise
from envguard.model import Snapshot
from tests.paths import REPO as ROOT

TIMEOUT = 180


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                        "NCCL_DEBUG", "ENVGUARD_MASK_KEY")}
    env.update(ENVGUARD_CACHE_DIR=str(home / "cache"), XDG_CONFIG_HOME=str(home / "config"),
               TORCHINDUCTOR_CACHE_DIR=str(home / "inductor"),
               TRITON_CACHE_DIR=str(home / "triton"), CUDA_CACHE_PATH=str(home / "nv"),
               GIT_CEILING_DIRECTORIES=str(home), PYTHONPATH=str(ROOT), COLUMNS="200")
    env.update(extra)
    return env


def _envguard(*args: str, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "envguard", *args], capture_output=True,
                          text=True, timeout=TIMEOUT, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def real_snapshot(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One real snapshot of this interpreter, tracking one file, as JSON data."""
    home = tmp_path_factory.mktemp("fleet-home")
    work = home / "work"
    work.mkdir()
    (work / "config.yaml").write_text("lr: 0.1\n")
    out = home / "snap.json"
    result = _envguard("snapshot", "-q", "-o", str(out), "--file", "config.yaml",
                       "--no-project-config", env=_env(home), cwd=work)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(out.read_text())
    assert data["torch"]["present"] and data["torch"]["git_version"], "needs torch installed"
    assert data["files"]["files"][0]["exists"]
    return data


def _node(base: dict[str, Any], rank: int) -> dict[str, Any]:
    """A copy as another node would record it: own host name, clock and launcher file."""
    data = copy.deepcopy(base)
    data["system"]["hostname"] = f"gpu-node-{rank}"
    data["created_at"] = f"2025-01-01T00:00:{rank:02d}.000000Z"
    data["duration_s"] = 1.0 + rank
    data["environment"]["variables"]["TORCHELASTIC_ERROR_FILE"] = {
        "value": f"/tmp/torchelastic_x/attempt_0/{rank}/error.json", "masked": False,
        "digest": None}
    return data


def _write_fleet(folder: Path, base: dict[str, Any], n: int = 8) -> list[Path]:
    paths = []
    for rank in range(n):
        data = _node(base, rank)
        if rank == 5:  # another torch build, same version string
            data["torch"]["git_version"] = "0" * 40
        if rank == 6:  # an edited config and a debug variable
            data["files"]["files"][0]["md5"] = "f" * 32
            data["files"]["files"][0]["sha256"] = "e" * 64
            data["environment"]["variables"]["NCCL_DEBUG"] = {
                "value": "INFO", "masked": False, "digest": None}
        path = folder / f"rank-{rank}.json"
        path.write_text(json.dumps(data))
        paths.append(path)
    return paths


def test_two_outliers_are_named_with_their_rules(tmp_path: Path,
                                                 real_snapshot: dict[str, Any]) -> None:
    paths = _write_fleet(tmp_path, real_snapshot)
    result = _envguard("fleet", "diff", *map(str, paths), env=_env(tmp_path))
    assert result.returncode == 1, result.stderr
    out = result.stdout
    assert "2 of 8 snapshot(s) differ" in out
    assert "6 identical" in out
    lines = out.splitlines()
    five = next(line for line in lines if "rank 5 (host gpu-node-5" in line)
    assert "torch-build-changed" in five and "file-changed" not in five
    six = next(line for line in lines if "rank 6 (host gpu-node-6" in line)
    assert "file-changed" in six and "env-var-changed" in six
    assert "torch-build-changed" not in six
    assert "NCCL_DEBUG set to INFO" in out  # evidence lines
    assert "TORCHELASTIC_ERROR_FILE" not in out  # per-rank by design


def test_json_and_markdown_say_the_same(tmp_path: Path, real_snapshot: dict[str, Any]) -> None:
    paths = list(map(str, _write_fleet(tmp_path, real_snapshot)))
    result = _envguard("fleet", "diff", "--format", "json", *paths, env=_env(tmp_path))
    assert result.returncode == 1, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "envguard.fleet-diff/1"
    assert doc["equivalent"] is False and doc["total"] == 8
    assert [m["rank"] for m in doc["baseline"]["members"]] == [0, 1, 2, 3, 4, 7]
    assert doc["baseline"]["reason"] == "majority"
    by_rank = {g["members"][0]["rank"]: g for g in doc["outliers"]}
    assert set(by_rank) == {5, 6}
    assert by_rank[5]["rules"] == ["torch-build-changed"]
    assert set(by_rank[6]["rules"]) == {"file-changed", "env-var-changed"}
    assert by_rank[5]["members"][0]["host"] == "gpu-node-5"
    assert any(c["path"] == "torch.git_version" for c in by_rank[5]["changes"])

    md = _envguard("fleet", "diff", "--format", "markdown", *paths, env=_env(tmp_path))
    assert md.returncode == 1
    assert md.stdout.startswith("## envguard fleet diff")
    assert "6 identical" in md.stdout
    for rule in ("torch-build-changed", "file-changed", "env-var-changed"):
        assert f"`{rule}`" in md.stdout
    assert "rank 5 (host gpu-node-5" in md.stdout


def test_nodes_that_differ_only_by_design_are_equivalent(
        tmp_path: Path, real_snapshot: dict[str, Any]) -> None:
    paths = []
    for rank in range(4):
        data = _node(real_snapshot, rank)
        data["files"]["files"][0]["path"] = f"/nodes/{rank}/checkout/config.yaml"
        data["files"]["files"][0]["pattern"] = f"/nodes/{rank}/checkout/config.yaml"
        paths.append(tmp_path / f"n{rank}.json")
        paths[-1].write_text(json.dumps(data))
    result = _envguard("fleet", "diff", *map(str, paths), env=_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all 4 snapshot(s) equivalent" in result.stdout


def test_bad_input_is_one_line_naming_the_file(tmp_path: Path,
                                               real_snapshot: dict[str, Any]) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(real_snapshot))
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "envguard.snapshot/1", "packages": 3}')
    for args in ([str(good), str(bad)], [str(good), str(tmp_path / "missing.json")],
                 [str(good)]):
        result = _envguard("fleet", "diff", *args, env=_env(tmp_path))
        assert result.returncode == 2, (args, result.stderr)
        assert result.stdout == ""
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "Traceback" not in result.stderr
    result = _envguard("fleet", "diff", str(good), str(bad), env=_env(tmp_path))
    assert "bad.json" in result.stderr


def test_hostile_strings_are_shown_literally(tmp_path: Path,
                                             real_snapshot: dict[str, Any]) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(real_snapshot))
    evil = copy.deepcopy(real_snapshot)
    evil["system"]["hostname"] = "\x1b[2Jnode[/bold][red]x"
    evil["environment"]["variables"]["NCCL_DEBUG"] = {
        "value": "\x1b]0;pwned\x07[blink]INFO", "masked": False, "digest": None}
    b.write_text(json.dumps(evil))
    for fmt in ("text", "markdown", "json"):
        result = _envguard("fleet", "diff", "--format", fmt, str(a), str(b),
                           env=_env(tmp_path))
        assert result.returncode == 1, result.stderr
        assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    text = _envguard("fleet", "diff", str(a), str(b), env=_env(tmp_path)).stdout
    assert "\\x1b[2Jnode[/bold][red]x" in text  # markup shown, not interpreted
    assert "[blink]INFO" in text


def test_fleet_document_input_and_baseline_override(tmp_path: Path,
                                                    real_snapshot: dict[str, Any]) -> None:
    members = [_node(real_snapshot, r) for r in range(3)]
    members[2]["torch"]["git_version"] = "1" * 40
    doc = {"schema": "envguard.fleet/1", "world_size": 3,
           "snapshots": [{"rank": r, "world_size": 3, "host": f"h{r}", "snapshot": s}
                         for r, s in enumerate(members)]}
    fleet = tmp_path / "FLEET.json"
    fleet.write_text(json.dumps(doc))
    result = _envguard("fleet", "diff", "--format", "json", str(fleet), env=_env(tmp_path))
    assert result.returncode == 1, result.stderr
    out = json.loads(result.stdout)
    assert [m["rank"] for m in out["outliers"][0]["members"]] == [2]
    assert out["outliers"][0]["members"][0]["host"] == "h2"

    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps(members[2]))
    result = _envguard("fleet", "diff", "--format", "json", "--baseline", str(odd), str(fleet),
                       env=_env(tmp_path))
    out = json.loads(result.stdout)
    assert out["baseline"]["reason"] == "named by --baseline"
    assert [m["rank"] for m in out["baseline"]["members"]] == [2]
    assert [m["rank"] for m in out["outliers"][0]["members"]] == [0, 1]

    broken = copy.deepcopy(doc)
    broken["snapshots"][1]["snapshot"]["torch"] = "nope"
    fleet.write_text(json.dumps(broken))
    result = _envguard("fleet", "diff", str(fleet), env=_env(tmp_path))
    assert result.returncode == 2
    assert "FLEET.json" in result.stderr and "snapshots[1].snapshot.torch" in result.stderr


def test_tie_goes_to_the_group_of_the_first_input(real_snapshot: dict[str, Any]) -> None:
    a = Snapshot.from_dict(_node(real_snapshot, 0))
    other = _node(real_snapshot, 1)
    other["torch"]["git_version"] = "2" * 40
    b = Snapshot.from_dict(other)
    report = analyse([member_from_snapshot("b.json", b), member_from_snapshot("a.json", a)])
    assert report.baseline_reason.startswith("tie")
    assert [m.name for m in report.baseline.members] == ["b.json"]
    assert [f.rule for f in report.outliers[0].findings] == ["torch-build-changed"]


def test_relative_file_patterns_compare_across_checkouts(real_snapshot: dict[str, Any]) -> None:
    snap = Snapshot.from_dict(real_snapshot)
    key = normalise(snap).files.files[0].path
    assert key == "config.yaml"
    assert snap.files.files[0].path != key  # the recorded path is absolute


# -- gathering ------------------------------------------------------------------------

def _rank_dir(tmp_path: Path, name: str, content: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.yaml").write_text(content)
    return folder


NO_TORCH = ("import sys; from envguard.cli import main; rc = main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'imported torch'; sys.exit(rc)")


def test_dir_gather_with_plain_processes(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    out = tmp_path / "FLEET.json"
    procs = []
    for rank in range(3):
        cwd = _rank_dir(tmp_path, f"node{rank}", "lr: 0.2\n" if rank == 2 else "lr: 0.1\n")
        extra = {"RANK": str(rank), "WORLD_SIZE": "3", "LOCAL_RANK": str(rank)}
        if rank == 2:
            extra["NCCL_DEBUG"] = "INFO"
        args = ["fleet", "snapshot", "--dir", str(shared), "--file", "config.yaml",
                "--no-project-config", "--timeout", "120"] + (["-o", str(out)] if rank == 0
                                                              else [])
        procs.append(subprocess.Popen([sys.executable, "-c", NO_TORCH, *args], cwd=cwd,
                                      env=_env(tmp_path, **extra), text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    results = [(p.wait(timeout=TIMEOUT), *p.communicate(timeout=TIMEOUT)) for p in procs]
    for rank, (code, stdout, stderr) in enumerate(results[1:], 1):
        assert code == 0 and stdout == "", (rank, stdout, stderr)
    code, stdout, stderr = results[0]
    assert code == 1, stdout + stderr
    line = next(x for x in stdout.splitlines() if "rank 2 (host" in x)
    assert "env-var-changed" in line and "file-changed" in line
    assert "2 identical" in stdout
    assert sorted(p.name for p in shared.iterdir()) == ["rank-0.json", "rank-1.json",
                                                        "rank-2.json"]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "envguard.fleet/1" and doc["world_size"] == 3
    assert [e["rank"] for e in doc["snapshots"]] == [0, 1, 2]
    again = _envguard("fleet", "diff", "--format", "json", str(out), env=_env(tmp_path))
    assert again.returncode == 1
    assert json.loads(again.stdout)["outliers"][0]["members"][0]["rank"] == 2


def test_dir_gather_times_out_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "envguard", "fleet", "snapshot", "--dir", str(tmp_path / "s"),
         "--timeout", "1", "--no-project-config"], capture_output=True, text=True,
        timeout=TIMEOUT, cwd=tmp_path, env=_env(tmp_path, RANK="0", WORLD_SIZE="2"))
    assert result.returncode == 4, result.stderr
    assert "timed out" in result.stderr and "rank(s) 1" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_without_a_launcher_it_is_a_fleet_of_one(tmp_path: Path) -> None:
    out = tmp_path / "one.json"
    result = _envguard("fleet", "snapshot", "-o", str(out), "--no-project-config",
                       env=_env(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "fleet of one" in result.stdout
    assert [e["rank"] for e in json.loads(out.read_text())["snapshots"]] == [0]


WRAPPER = """\
import os, sys
from pathlib import Path
rank = os.environ["RANK"]
base = Path(sys.argv[1])
os.chdir(base / ("odd" if rank == "1" else "same"))
if rank == "1":
    os.environ["NCCL_DEBUG"] = "INFO"
if sys.argv[2] == "preinit":  # the job's own process group, already up: envguard leaves it be
    import torch.distributed as dist
    dist.init_process_group("gloo")
from envguard.cli import main
code = main(["fleet", "snapshot", "-o", str(base / "FLEET.json"), "--file", "config.yaml",
             "--no-project-config", "--timeout", "90"])
if sys.argv[2] == "preinit":
    assert dist.is_initialized(), "envguard destroyed the job's process group"
    dist.barrier()
    dist.destroy_process_group()
else:
    assert "torch" not in sys.modules, "envguard imported torch"
(base / f"rc-{rank}").write_text(str(code))
sys.exit(code)
"""


@pytest.mark.parametrize("mode", ["own-group", "preinit"])
def test_torchrun_gathers_over_envguards_transport(tmp_path: Path, mode: str) -> None:
    """Real torchrun, 2 CPU processes: MASTER_ADDR/MASTER_PORT come from torchrun, the key
    from the (shared) mask key file; with the job's gloo group up, or without one."""
    pytest.importorskip("torch.distributed")
    _rank_dir(tmp_path, "same", "lr: 0.1\n")
    _rank_dir(tmp_path, "odd", "lr: 0.3\n")
    key = tmp_path / "config" / "envguard" / "mask.key"
    key.parent.mkdir(parents=True)
    key.write_text("k" * 64 + "\n")  # made first: ranks creating it at once could race
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
         str(wrapper), str(tmp_path), mode], capture_output=True, text=True, timeout=TIMEOUT,
        cwd=tmp_path, env=_env(tmp_path, OMP_NUM_THREADS="1"))
    codes = {r: (tmp_path / f"rc-{r}").read_text() for r in range(2)
             if (tmp_path / f"rc-{r}").exists()}
    assert codes == {0: "1", 1: "0"}, result.stdout + result.stderr
    line = next(x for x in result.stdout.splitlines() if "rank 1 (host" in x)
    assert "env-var-changed" in line and "file-changed" in line
    assert "1 identical" in result.stdout
    doc = json.loads((tmp_path / "FLEET.json").read_text())
    assert [e["rank"] for e in doc["snapshots"]] == [0, 1]
    assert all(e["world_size"] == 2 for e in doc["snapshots"])
