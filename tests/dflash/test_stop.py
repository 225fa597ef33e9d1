"""Stopping together (dflash.distributed.stop): real processes under torchrun, gloo on CPU.

A SIGTERM that reaches one rank a step before the others used to leave them waiting in a
collective until torchrun killed the launch (seen once in twelve split-roles runs on a
loaded machine). Signalling one rank only makes that case certain."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dflash.distributed.stop import Stop, StopVote
from dflash.distributed.world import World
from tests.dflash.launch import REPO, SMALL, env

VOTE_SCRIPT = """
import sys, torch, torch.distributed as dist
from pathlib import Path
from dflash.distributed.stop import Stop, StopVote
from dflash.distributed.world import detect
dist.init_process_group("gloo")
world = detect()
vote = StopVote(world)
# per rank: the round at which it would stop alone, and why (argv: 3:TIME 6:SIGNAL)
first, why = sys.argv[2 + world.rank].split(":")
for round in range(20):
    decided = vote(Stop[why] if round >= int(first) else Stop.NONE)
    if decided is not Stop.NONE:
        Path(sys.argv[1], f"rank{world.rank}").write_text(f"{round} {decided.name}")
        break
    dist.all_reduce(torch.ones(1))  # the step's own collective
vote.close()
dist.destroy_process_group()
"""


def test_a_world_of_one_stops_when_it_wishes():
    vote = StopVote(World())
    assert vote(Stop.NONE) is Stop.NONE
    assert vote(Stop.TIME) is Stop.TIME
    assert vote(Stop.SIGNAL) is Stop.SIGNAL
    vote.close()


def _vote(tmp_path: Path, *wishes: str) -> dict[int, str]:
    script = tmp_path / "vote.py"
    script.write_text(VOTE_SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(script), str(tmp_path), *wishes],
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {rank: (tmp_path / f"rank{rank}").read_text() for rank in (0, 1)}


@pytest.mark.slow
def test_ranks_stop_at_the_same_round_one_after_the_first_wish(tmp_path: Path):
    # rank 0 wished at 3; both stop at the next round, for rank 0's reason
    assert _vote(tmp_path, "3:SIGNAL", "6:SIGNAL") == {0: "4 SIGNAL", 1: "4 SIGNAL"}


@pytest.mark.slow
def test_a_signal_outweighs_the_time_budget_seen_in_the_same_round(tmp_path: Path):
    # The budget runs out on rank 0 as rank 1 is signalled: the run stops early (a
    # checkpoint to resume), not as finished.
    assert _vote(tmp_path, "3:TIME", "3:SIGNAL") == {0: "4 SIGNAL", 1: "4 SIGNAL"}
    (tmp_path / "rank0").unlink()
    (tmp_path / "rank1").unlink()
    assert _vote(tmp_path, "5:TIME", "2:TIME") == {0: "3 TIME", 1: "3 TIME"}


def _rank_pids(launcher: psutil.Process) -> dict[int, int]:
    """{RANK: pid} of torchrun's worker processes."""
    out = {}
    for child in launcher.children(recursive=True):
        try:
            rank = child.environ().get("RANK")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if rank is not None and "dflash.cli.train" in " ".join(child.cmdline()):
            out[int(rank)] = child.pid
    return out


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(tmp_path: Path):
    # Rank 1 alone is signalled: rank 0 learns of it only through the vote.
    out = tmp_path / "run"
    args = ["--preset", "tiny", "--unguarded", "--quiet", "--out", str(out),
            "--set=batch_size=2", *SMALL]
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "2", "-m", "dflash.cli.train",
                             "--steps=100000", *args], cwd=REPO, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 200
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    try:
        ranks = _rank_pids(psutil.Process(proc.pid))
        assert sorted(ranks) == [0, 1], ranks
        os.kill(ranks[1], signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)  # a rank left waiting: a timeout
    finally:
        if proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr[-3000:]
    assert "stopped by SIGTERM at step" in stdout, stdout + stderr[-3000:]
    step = int(stdout.split("stopped by SIGTERM at step ")[1].split(";")[0])
    assert (out / "checkpoints" / f"step-{step:08d}").is_dir()
    logged = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert logged[-1] == step
