"""Tiny fp32 CPU pieces shared by the dflash tests: a frozen stand-in target
(embedding + lm_head) and a drafter from the ``tiny`` preset."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from dflash.config import DrafterConfig
from dflash.loss import block_inputs
from dflash.masks import AttendFn, dense_mask, dflash_block_mask, flex_attend, sdpa_attend
from dflash.model import DFlashDrafter
from dflash.presets import tiny_drafter
from tests.dflash import launch

# Under pytest-xdist torch here takes this worker's share of the cores, not all of them:
# its OpenMP threads spin while they wait, on the cores the other workers need.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))

# Eager flex_attention on CPU warns that it is unfused; that is expected in tests.
FLEX_EAGER = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


@dataclass
class Tiny:
    cfg: DrafterConfig
    drafter: DFlashDrafter
    embed: nn.Embedding
    head: nn.Linear


@pytest.fixture
def tiny_setup() -> Tiny:
    torch.manual_seed(0)
    cfg = tiny_drafter()
    drafter = DFlashDrafter(cfg).float()
    embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size).requires_grad_(False)
    head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False).requires_grad_(False)
    return Tiny(cfg, drafter, embed, head)


def make_attend(kind: str, anchors_BN: Tensor, keep_BN: Tensor, seq: int, bs: int
                ) -> AttendFn:
    if kind == "flex":
        return flex_attend(dflash_block_mask(anchors_BN, keep_BN, seq, bs))
    return sdpa_attend(dense_mask(anchors_BN, keep_BN, seq, bs))


def train_forward(t: Tiny, input_ids_BS: Tensor, feats_BSF: Tensor, anchors_BN: Tensor,
                  keep_BN: Tensor, kind: str = "sdpa", block_emb_BQD: Tensor | None = None
                  ) -> Tensor:
    """Multi-block training forward; returns logits [B, N*B, V]."""
    bs = t.cfg.block_size
    ids_BQ, pos_BQ = block_inputs(input_ids_BS, anchors_BN, bs, t.cfg.mask_token_id)
    if block_emb_BQD is None:
        block_emb_BQD = t.embed(ids_BQ)
    seq = input_ids_BS.shape[1]
    pos_ctx_BS = torch.arange(seq).expand(input_ids_BS.shape[0], seq)
    attend = make_attend(kind, anchors_BN, keep_BN, seq, bs)
    hidden = t.drafter(block_emb_BQD, feats_BSF, pos_BQ, pos_ctx_BS, attend)
    return t.head(hidden)


def random_batch(cfg: DrafterConfig, bsz: int, seq: int, seed: int = 1
                 ) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size - 1, (bsz, seq), generator=g)
    feats = torch.randn(bsz, seq, cfg.num_features * cfg.hidden_size, generator=g)
    return ids, feats


@pytest.fixture(scope="session")
def tiny_target():
    """The ``tiny`` named target shape: a real transformers Qwen3 model, random weights."""
    from dflash.target import load_target

    return load_target("tiny", seed=0)


@dataclass
class TrainedTiny:
    trainer: object
    drafter: DFlashDrafter
    result: object
    records: list
    untrained_tau: float
    out: object


@pytest.fixture(scope="session")
def trained_tiny(tiny_target, tmp_path_factory) -> TrainedTiny:
    """One full run of the ``tiny`` preset (CPU, fp32, about a minute), shared."""
    import dataclasses
    import json

    from dflash.presets import tiny as tiny_recipe
    from dflash.train import Trainer

    out = tmp_path_factory.mktemp("tiny-run")
    trainer = Trainer(dataclasses.replace(tiny_recipe(), out=str(out)), target=tiny_target)
    untrained_tau = trainer.held_out_tau_random()
    result = trainer.run()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return TrainedTiny(trainer, trainer.drafter.eval(), result, records, untrained_tau, out)


@pytest.fixture(scope="package", autouse=True)
def _shared_bytecode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Where PYTHONDONTWRITEBYTECODE is set (this project's CI VMs set it), every child
    process compiled torch and transformers from source again: 3.5 s of a 7.7 s tiny
    dflash-train run. The children of these tests share one bytecode folder for the
    session instead; nothing is written into the checkout or the venv. Package-scoped: the
    variables come back before any test outside tests/dflash runs (a pip install there
    compiles bytecode when PYTHONDONTWRITEBYTECODE is unset, and its RECORD changes)."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        yield
        return
    saved = os.environ.pop("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONPYCACHEPREFIX"] = str(tmp_path_factory.mktemp("pycache"))
    try:
        yield
    finally:
        os.environ.pop("PYTHONPYCACHEPREFIX", None)
        os.environ["PYTHONDONTWRITEBYTECODE"] = saved


@pytest.fixture(scope="session")
def colocated_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One torchrun job (2 ranks, ``launch.STEPS`` steps, a checkpoint every 2) that the
    distributed and split-roles tests compare with and resume from. Copy it before
    writing to it."""
    out = tmp_path_factory.mktemp("colocated") / "run"
    proc = launch.run(out, 2, launch.STEPS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@dataclass(frozen=True)
class ColdRace:
    result: dict[str, object]
    root: Path
    """``root/a/inductor``: the inductor folder it compiled into."""
    store: Path
    """The Mega-Cache folder it saved its artifact to."""


@pytest.fixture(scope="session")
def cold_guarded_race(tmp_path_factory: pytest.TempPathFactory) -> ColdRace:
    """The guarded race harness once, cold: warm-up on the main thread, a Mega-Cache
    artifact saved, then 3 threads x 3 calls and a late shape. The race test and the
    Mega-Cache test both assert on it (each cold CPU compile costs 15-30 s)."""
    root = tmp_path_factory.mktemp("race")
    store = root / "store"
    result = launch.guarded_race(root, "a", "--threads", "3", "--iters", "3", "--late-seq",
                                 "384", "--mega-cache", str(store))
    return ColdRace(result, root, store)
