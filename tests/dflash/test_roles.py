"""Split roles (--target-ranks K) under torchrun on CPU with gloo: real processes, the
target on its own rank, features over point-to-point messages."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from dflash.distributed.roles import Lookahead
from dflash.distributed.world import Roles
from tests.dflash.launch import GLOO_TRANSPORT_FAILURES, REPO, SMALL, STEPS, env, losses, run


def test_roles_put_drafters_first_and_spread_clients_over_target_ranks():
    roles = Roles(world_size=8, target_ranks=5)  # the incident's layout, flipped: rank 0 trains
    assert roles.drafter_ranks == 3
    assert [roles.is_target(r) for r in range(8)] == [False] * 3 + [True] * 5
    assert [roles.server_of(d) for d in range(3)] == [3, 4, 5]
    assert [roles.clients_of(t) for t in range(3, 8)] == [[0], [1], [2], [], []]
    many = Roles(world_size=5, target_ranks=2)
    assert [roles for roles in map(many.clients_of, (3, 4))] == [[0, 2], [1]]
    for bad in (0, 8, -1):
        with pytest.raises(ValueError, match="--target-ranks must be between 1 and"):
            Roles(world_size=8, target_ranks=bad)



class _Client:
    """A FeatureClient's request/answer protocol, recorded: batch n's features are n * 10."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def request(self, input_ids_BS):
        n = int(input_ids_BS[0, 0])
        self.events.append(f"ask {n}")

        def wait():
            self.events.append(f"wait {n}")
            return input_ids_BS * 10
        return wait


def _batches(count: int):
    import torch

    return iter([(torch.full((1, 2), i), torch.ones(1, 2), {"batch": i}) for i in range(count)])


def test_the_lookahead_asks_for_the_next_batch_before_waiting_for_this_one():
    client = _Client()
    batches = _batches(4)
    ahead = Lookahead(client)
    (ids, _, state), feats = ahead.next(lambda: next(batches), more=True)
    assert state == {"batch": 0} and int(ids[0, 0]) == 0 and int(feats[0, 0]) == 0
    assert client.events == ["ask 0", "ask 1", "wait 0"]
    (ids, _, state), feats = ahead.next(lambda: next(batches), more=False)  # the last step
    assert state == {"batch": 1} and int(ids[0, 0]) == 1 and int(feats[0, 0]) == 10
    assert client.events[3:] == ["wait 1"]
    ahead.drain()  # nothing asked for ahead
    assert client.events[4:] == []
    # Stopped early: the answer asked for ahead is still taken, once.
    ahead.next(lambda: next(batches), more=True)
    ahead.drain()
    ahead.drain()
    assert client.events[4:] == ["ask 2", "ask 3", "wait 2", "wait 3"]


@pytest.mark.slow
def test_split_roles_train_exactly_like_colocated_ranks_and_resume_across_layouts(
        colocated_run: Path, tmp_path: Path):
    # 3 processes: ranks 0-1 train (FSDP2 over their own group), rank 2 runs the target.
    split = run(tmp_path / "split", 3, STEPS, "--target-ranks", "1", "--set=stop_after=4")
    assert split.returncode == 0, split.stderr[-3000:]
    a, b = losses(colocated_run), losses(tmp_path / "split")
    assert len(b) == 4
    # Same drafter ranks, data, anchors and target weights: only where the target runs
    # differs, so the losses agree to float rounding.
    for x, y in zip(a, b, strict=False):
        assert abs(x - y) <= 1e-5 * max(1.0, abs(x)), (a, b)
    meta = json.loads((tmp_path / "split" / "metadata.json").read_text())
    assert meta["roles"] == {"target_ranks": 1, "drafter_ranks": 2}
    assert meta["world_size"] == 2
    records = [json.loads(line) for line in
               (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]  # rank 0 alone wrote
    # MFU divides by all 3 devices (the target rank's too), not the 2 training ranks.
    for r in records:
        assert abs(r["mfu"] - r["tflops"] / (3 * r["peak_tflops"])) <= 1e-9 * r["mfu"], r

    # The split run's checkpoint (written by the drafter group) resumes colocated.
    shutil.copytree(tmp_path / "split", tmp_path / "resumed")
    resumed = run(tmp_path / "resumed", 2, STEPS, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 4" in resumed.stdout
    c = losses(tmp_path / "resumed")
    assert len(c) == STEPS
    for x, y in zip(a, c, strict=True):
        assert abs(x - y) <= 1e-5 * max(1.0, abs(x)), (a, c)


@pytest.mark.slow
def test_target_ranks_outside_the_world_is_one_line_and_no_hang(tmp_path: Path):
    proc = run(tmp_path / "bad", 2, 4, "--target-ranks", "2")
    assert proc.returncode != 0
    # Both ranks refuse alike, before joining the process group; torchrun reports exit 2.
    # torchrun SIGTERMs the other rank as soon as the first exits, so on a loaded machine
    # the second may be stopped before it prints: one line per rank that got that far.
    lines = [line for line in proc.stderr.splitlines() if line.startswith("dflash-train:")]
    assert 1 <= len(lines) <= 2, proc.stderr[-3000:]
    assert all("--target-ranks must be between 1 and WORLD_SIZE - 1 = 1" in line
               for line in lines)
    assert "exitcode  : 2" in proc.stderr
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()


def test_target_ranks_without_torchrun_is_refused(tmp_path: Path):
    from dflash.cli.train import main

    assert main(["--target-ranks", "1", "--out", str(tmp_path / "x"), "--unguarded"]) == 2


def _terminated_split_run(out: Path) -> tuple[str, str]:
    """A 3-process split-roles run, SIGTERMed after its third step: (stdout, stderr)."""
    args = ["--preset", "tiny", "--unguarded", "--quiet", "--out", str(out), "--set=batch_size=2",
            "--target-ranks", "1", *SMALL]
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node", "3", "-m", "dflash.cli.train", "--steps=100000",
                             *args], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 200
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    return proc.communicate(timeout=120)


@pytest.mark.slow
def test_sigterm_with_split_roles_checkpoints_and_resumes(tmp_path: Path):
    # torchrun forwards SIGTERM to every rank: the drafter ranks finish their step,
    # checkpoint and close their feature streams; the target rank keeps answering until
    # they have, instead of dying under them.
    out = tmp_path / "run"
    metrics = out / "metrics.jsonl"
    stdout, stderr = _terminated_split_run(out)
    if "stopped by SIGTERM at step" not in stdout and any(
            s in stderr for s in GLOO_TRANSPORT_FAILURES):
        warnings.warn(f"retried after a gloo transport failure: {stderr[-400:]!r}",
                      stacklevel=1)
        shutil.rmtree(out, ignore_errors=True)
        stdout, stderr = _terminated_split_run(out)
    assert "stopped by SIGTERM at step" in stdout, stdout + stderr[-3000:]
    assert "could not close the feature stream" not in stderr
    step = int(stdout.split("stopped by SIGTERM at step ")[1].split(";")[0])
    assert (out / "checkpoints" / f"step-{step:08d}").is_dir()

    resumed = run(out, 3, step + 2, "--target-ranks", "1", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at step {step}" in resumed.stdout
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()][-2:] == [
        step + 1, step + 2]
