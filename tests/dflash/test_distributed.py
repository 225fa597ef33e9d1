"""dflash-train under torchrun on CPU (gloo): FSDP2 data parallel, rank 0 alone writes,
the gate on every rank. Real processes launched by torch.distributed.run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash.checkpoint.export import load_drafter
from tests.dflash.launch import REPO, STEPS, env, losses, run, single, torchrun


@pytest.mark.slow
def test_two_ranks_train_like_one_process_with_the_same_global_batch(
        colocated_run: Path, tmp_path: Path):
    one = single(tmp_path / "one", STEPS, batch_size=4)
    assert one.returncode == 0, one.stderr[-3000:]
    a, b = losses(colocated_run), losses(tmp_path / "one")
    assert len(a) == len(b) == STEPS
    # Same global batch (2 ranks x 2 = 4), other examples and anchors per step: the curves
    # agree within noise, and both learn.
    assert abs(sum(a[-4:]) - sum(b[-4:])) / sum(b[-4:]) < 0.1, (a, b)
    assert sum(a[-3:]) < sum(a[:3]) and sum(b[-3:]) < sum(b[:3]), (a, b)
    # Rank 0 alone writes; the exported drafter is the gathered full model.
    assert len((colocated_run / "metrics.jsonl").read_text().splitlines()) == STEPS
    meta = json.loads((colocated_run / "metadata.json").read_text())
    assert meta["world_size"] == 2
    drafter = load_drafter(colocated_run / "drafter")
    assert drafter.cfg.num_layers == 2


def _project_copies(good: Path, bad: Path) -> None:
    """A copy of the project with its own fresh lock, and a copy of that copy with one
    tracked file edited after locking."""
    shutil.copytree(REPO / "dflash", good / "dflash",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", good / "pyproject.toml")
    (good / "lockfiles").mkdir()
    lock = subprocess.run([sys.executable, "-m", "envguard", "lock", "dflash-train", "--entry",
                           "test", "--file", "dflash/**/*.py"], cwd=good, env=env(),
                          capture_output=True, text=True, timeout=120)
    assert lock.returncode == 0, lock.stderr
    shutil.copytree(good, bad)
    with open(bad / "dflash" / "loss.py", "a") as fh:
        fh.write("# edited on one node only\n")


@pytest.mark.slow
def test_a_drifted_rank_stops_the_whole_job(tmp_path: Path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    _project_copies(good, bad)
    wrapper = tmp_path / "launch.py"
    wrapper.write_text(
        "import os, sys\n"
        f"os.chdir({str(bad)!r} if os.environ['RANK'] == '1' else {str(good)!r})\n"
        "from dflash.cli.train import main\n"
        f"sys.exit(main(['--preset', 'tiny', '--quiet', '--out', {str(tmp_path / 'run')!r}]))\n")
    proc = torchrun(2, str(wrapper), cwd=tmp_path, timeout=180)
    assert proc.returncode != 0
    assert "rank 1: [file-changed]" in proc.stderr, proc.stderr[-3000:]
    assert "rank(s) 1 of 2 do not match the lock" in proc.stderr
    assert "rank 0: [" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_sharded_checkpoints_resume_exactly_and_at_another_world_size(
        colocated_run: Path, tmp_path: Path):
    cut = run(tmp_path / "cut", 2, STEPS, "--set=stop_after=4")
    assert cut.returncode == 0, cut.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()) == [
        "latest", "step-00000002", "step-00000004"]
    shutil.copytree(tmp_path / "cut", tmp_path / "wider")

    resumed = run(tmp_path / "cut", 2, STEPS, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 4" in resumed.stdout
    # Same world size: the DCP round trip restores weights, optimizer moments, data
    # position and each rank's anchor stream exactly.
    a, b = losses(colocated_run), losses(tmp_path / "cut")
    assert len(b) == STEPS
    for x, y in zip(a, b, strict=True):
        assert abs(x - y) <= 1e-5 * max(1.0, abs(x)), (a, b)

    wider = run(tmp_path / "wider", 3, STEPS, "--resume")  # DCP reshards 2 -> 3
    assert wider.returncode == 0, wider.stderr[-3000:]
    assert "at step 4" in wider.stdout
    assert [json.loads(line)["step"] for line in
            (tmp_path / "wider" / "metrics.jsonl").read_text().splitlines()
            ] == list(range(1, STEPS + 1))
    assert load_drafter(tmp_path / "wider" / "drafter").cfg.num_layers == 2


def _same_drafters(a: Path, b: Path) -> None:
    x, y = load_drafter(a).state_dict(), load_drafter(b).state_dict()
    assert x.keys() == y.keys()
    for name in x:
        assert torch.equal(x[name], y[name]), name


@pytest.mark.slow
def test_a_torchrun_checkpoint_resumes_in_one_process_and_back(
        colocated_run: Path, tmp_path: Path):
    # torchrun (2 ranks) trained STEPS steps; one process resumes that DCP checkpoint with
    # nothing left to do, so it only converts and re-exports: the drafters must be equal.
    shutil.copytree(colocated_run, tmp_path / "one")
    (tmp_path / "one" / "drafter").rename(tmp_path / "two-drafter")
    one = single(tmp_path / "one", STEPS, "--resume")
    assert one.returncode == 0, one.stderr[-3000:]
    assert f"at step {STEPS}" in one.stdout
    _same_drafters(tmp_path / "two-drafter", tmp_path / "one" / "drafter")
    # The optimizer moments survived the conversion too: the one-process checkpoint it
    # just wrote holds Adam state for every parameter, with the step count of the run.
    state = torch.load(tmp_path / "one" / "checkpoints" / f"step-{STEPS:08d}" / "trainer.pt",
                       weights_only=True)
    moments = state["optimizer"]["state"]
    assert len(moments) == len(list(load_drafter(tmp_path / "two-drafter").parameters()))
    assert all(float(m["step"]) == STEPS and m["exp_avg_sq"].abs().sum() > 0
               for m in moments.values())

    # And back: that one-process checkpoint resumed under torchrun with 3 ranks.
    shutil.copytree(tmp_path / "one", tmp_path / "three")
    (tmp_path / "three" / "drafter").rename(tmp_path / "one-drafter")
    three = run(tmp_path / "three", 3, STEPS, "--resume")
    assert three.returncode == 0, three.stderr[-3000:]
    assert f"at step {STEPS}" in three.stdout
    _same_drafters(tmp_path / "one-drafter", tmp_path / "three" / "drafter")
    # ... and trains on from there.
    more = run(tmp_path / "three", 3, STEPS + 2, "--resume")
    assert more.returncode == 0, more.stderr[-3000:]
    trained = losses(tmp_path / "three")  # STEPS lines from the first run, then 2 more
    assert len(trained) == STEPS + 2 and all(x == x for x in trained), trained
