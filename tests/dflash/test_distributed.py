"""dflash-train under torchrun on CPU (gloo): FSDP2 data parallel, rank 0 alone writes,
the gate on every rank. Real processes launched by torch.distributed.run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from dflash.checkpoint.export import load_drafter

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--set=log_every=1", "--set=save_every=0", "--set=eval_every=0",
         "--set=synthetic_prompts=64", "--set=synthetic_response_tokens=40", "--set=held_out=4",
         "--set=buckets=64", "--set=anchors=8", "--set=lr=3e-3"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ENVGUARD_VERIFIED"}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _torchrun(n: int, *args: str, cwd: Path = REPO, timeout: float = 240
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           str(n), "--standalone", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_two_ranks_train_like_one_process_with_the_same_global_batch(tmp_path: Path):
    steps = "--steps=12"
    two = _torchrun(2, "-m", "dflash.cli.train", "--preset", "tiny", "--unguarded", "--quiet",
                    "--out", str(tmp_path / "two"), steps, "--set=batch_size=2", *SMALL)
    assert two.returncode == 0, two.stderr[-3000:]
    one = subprocess.run([sys.executable, "-m", "dflash.cli.train", "--preset", "tiny",
                          "--unguarded", "--quiet", "--out", str(tmp_path / "one"), steps,
                          "--set=batch_size=4", *SMALL], cwd=REPO, env=_env(),
                         capture_output=True, text=True, timeout=240)
    assert one.returncode == 0, one.stderr[-3000:]
    a, b = _losses(tmp_path / "two"), _losses(tmp_path / "one")
    assert len(a) == len(b) == 12
    # Same global batch (2 ranks x 2 = 4), other examples and anchors per step: the curves
    # agree within noise, and both learn.
    assert abs(sum(a[-4:]) - sum(b[-4:])) / sum(b[-4:]) < 0.1, (a, b)
    assert sum(a[-3:]) < sum(a[:3]) and sum(b[-3:]) < sum(b[:3]), (a, b)
    # Rank 0 alone writes; the exported drafter is the gathered full model.
    assert len((tmp_path / "two" / "metrics.jsonl").read_text().splitlines()) == 12
    meta = json.loads((tmp_path / "two" / "metadata.json").read_text())
    assert meta["world_size"] == 2
    drafter = load_drafter(tmp_path / "two" / "drafter")
    assert drafter.cfg.num_layers == 2


def _project_copy(dest: Path, *, drift: bool) -> Path:
    """A copy of the project with its own fresh lock; ``drift`` then edits a tracked file."""
    shutil.copytree(REPO / "dflash", dest / "dflash",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    (dest / "lockfiles").mkdir()
    lock = subprocess.run([sys.executable, "-m", "envguard", "lock", "dflash-train", "--entry",
                           "test", "--file", "dflash/**/*.py"], cwd=dest, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert lock.returncode == 0, lock.stderr
    if drift:
        with open(dest / "dflash" / "loss.py", "a") as fh:
            fh.write("# edited on one node only\n")
    return dest


def test_a_drifted_rank_stops_the_whole_job(tmp_path: Path):
    good = _project_copy(tmp_path / "good", drift=False)
    bad = _project_copy(tmp_path / "bad", drift=True)
    wrapper = tmp_path / "launch.py"
    wrapper.write_text(
        "import os, sys\n"
        f"os.chdir({str(bad)!r} if os.environ['RANK'] == '1' else {str(good)!r})\n"
        "from dflash.cli.train import main\n"
        f"sys.exit(main(['--preset', 'tiny', '--quiet', '--out', {str(tmp_path / 'run')!r}]))\n")
    proc = _torchrun(2, str(wrapper), cwd=tmp_path, timeout=180)
    assert proc.returncode != 0
    assert "rank 1: [file-changed]" in proc.stderr, proc.stderr[-3000:]
    assert "rank(s) 1 of 2 do not match the lock" in proc.stderr
    assert "rank 0: [" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def _run(out: Path, n: int, steps: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return _torchrun(n, "-m", "dflash.cli.train", "--preset", "tiny", "--unguarded", "--quiet",
                     "--out", str(out), f"--steps={steps}", "--set=batch_size=2",
                     "--set=save_every=2", *[a for a in SMALL if "save_every" not in a], *extra)


def test_sharded_checkpoints_resume_exactly_and_at_another_world_size(tmp_path: Path):
    full = _run(tmp_path / "full", 2, 6)
    assert full.returncode == 0, full.stderr[-3000:]
    cut = _run(tmp_path / "cut", 2, 6, "--set=stop_after=4")
    assert cut.returncode == 0, cut.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()) == [
        "latest", "step-00000002", "step-00000004"]
    shutil.copytree(tmp_path / "cut", tmp_path / "wider")

    resumed = _run(tmp_path / "cut", 2, 6, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 4" in resumed.stdout
    # Same world size: the DCP round trip restores weights, optimizer moments, data
    # position and each rank's anchor stream exactly.
    a, b = _losses(tmp_path / "full"), _losses(tmp_path / "cut")
    assert len(b) == 6
    for x, y in zip(a, b, strict=True):
        assert abs(x - y) <= 1e-5 * max(1.0, abs(x)), (a, b)

    wider = _run(tmp_path / "wider", 3, 6, "--resume")  # DCP reshards 2 -> 3
    assert wider.returncode == 0, wider.stderr[-3000:]
    assert "at step 4" in wider.stdout
    assert [json.loads(line)["step"] for line in
            (tmp_path / "wider" / "metrics.jsonl").read_text().splitlines()] == list(range(1, 7))
    assert load_drafter(tmp_path / "wider" / "drafter").cfg.num_layers == 2


def _single(out: Path, steps: int, *extra: str) -> subprocess.CompletedProcess[str]:
    """The same run as :func:`_run`, in one process without torchrun."""
    return subprocess.run([sys.executable, "-m", "dflash.cli.train", "--preset", "tiny",
                           "--unguarded", "--quiet", "--out", str(out), f"--steps={steps}",
                           "--set=batch_size=2", "--set=save_every=2",
                           *[a for a in SMALL if "save_every" not in a], *extra],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=240)


def _same_drafters(a: Path, b: Path) -> None:
    x, y = load_drafter(a).state_dict(), load_drafter(b).state_dict()
    assert x.keys() == y.keys()
    for name in x:
        assert torch.equal(x[name], y[name]), name


def test_a_torchrun_checkpoint_resumes_in_one_process_and_back(tmp_path: Path):
    # torchrun (2 ranks) trains 4 steps; one process resumes that DCP checkpoint with
    # nothing left to do, so it only converts and re-exports: the drafters must be equal.
    two = _run(tmp_path / "two", 2, 4)
    assert two.returncode == 0, two.stderr[-3000:]
    shutil.copytree(tmp_path / "two", tmp_path / "one")
    (tmp_path / "one" / "drafter").rename(tmp_path / "two-drafter")
    one = _single(tmp_path / "one", 4, "--resume")
    assert one.returncode == 0, one.stderr[-3000:]
    assert "at step 4" in one.stdout
    _same_drafters(tmp_path / "two-drafter", tmp_path / "one" / "drafter")
    # The optimizer moments survived the conversion too: the one-process checkpoint it
    # just wrote holds Adam state for every parameter, with the step count of 4 steps.
    state = torch.load(tmp_path / "one" / "checkpoints" / "step-00000004" / "trainer.pt",
                       weights_only=True)
    moments = state["optimizer"]["state"]
    assert len(moments) == len(list(load_drafter(tmp_path / "two-drafter").parameters()))
    assert all(float(m["step"]) == 4.0 and m["exp_avg_sq"].abs().sum() > 0
               for m in moments.values())

    # And back: that one-process checkpoint resumed under torchrun with 3 ranks.
    shutil.copytree(tmp_path / "one", tmp_path / "three")
    (tmp_path / "three" / "drafter").rename(tmp_path / "one-drafter")
    three = _run(tmp_path / "three", 3, 4, "--resume")
    assert three.returncode == 0, three.stderr[-3000:]
    assert "at step 4" in three.stdout
    _same_drafters(tmp_path / "one-drafter", tmp_path / "three" / "drafter")
    # ... and trains on from there.
    more = _run(tmp_path / "three", 3, 6, "--resume")
    assert more.returncode == 0, more.stderr[-3000:]
    losses = _losses(tmp_path / "three")  # 4 lines from the first run, then steps 5-6
    assert len(losses) == 6 and all(x == x for x in losses), losses
