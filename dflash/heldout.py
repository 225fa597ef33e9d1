"""The held-out rows and what is measured on them: a τ that predicts decoding.

Which rows are held out (:func:`split_by_source`): whole *sources*, never single rows.
A source is a row's ``source`` or ``prompt_id`` (the file a prompt was cut from, as
``dflash-generate`` carries it over from the prompts file), else its prompt's tokens, so
two responses to one prompt, or two prompts cut from one file, fall on the same side.
Sources are taken in the order of their SHA-256 (not the file's order, which groups a
file's rows together) until ``held_out`` rows are held out. Holding out the last rows of
the file, as the trainer did, put prompts of the same files on both sides: the held-out τ
read 10.4 where decoding gave 5.12.

What is measured at each evaluation (:func:`evaluate`): the teacher-forced τ (the
trainer's ``held_out_tau``): decoding replayed on every held-out row, teacher forced, the
way decoding walks: the first ``held_out_window`` tokens after the prompt, a cycle's n
accepted drafts a jump of n+1 (:mod:`dflash.replay`). Next to it, a free-running one
(:func:`decode_tau`): greedy speculative decoding of a few held-out prompts with the
current drafter against the target. Their ratio says how far the first overstates the
second. ``held_out_tau_random`` is the mean acceptance over random anchors anywhere in
the rows (:func:`teacher_forced_tau`), which overstated decoding's τ about twofold
(11.6 against 6.13): it weights every position alike and scores anchors far past what
decoding reaches.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dflash.batching import BatchLoader
from dflash.config import TrainConfig
from dflash.data import Example
from dflash.decoding.cycle import Drafting, cycle_decoder, path_for
from dflash.decoding.generate import stop_ids_of
from dflash.decoding.spread import pooled_tau, tau_interval
from dflash.distributed.world import World
from dflash.errors import ConfigError
from dflash.loss import LossOutput
from dflash.model import DFlashDrafter
from dflash.replay import replay
from dflash.target import TargetModel


def prompt_of(ex: Example) -> tuple[int, ...]:
    """The tokens before the first trained one; a row trained on every token (plain
    text) has none, and then its first half is the prompt."""
    first = next((i for i, m in enumerate(ex.loss_mask) if m), len(ex.loss_mask))
    return ex.input_ids[:first] if first else ex.input_ids[: max(1, len(ex.input_ids) // 2)]


def source_key(ex: Example) -> str:
    """Where a row comes from: its ``source`` or ``prompt_id``, else its prompt's tokens."""
    if ex.source is not None:
        return ex.source
    ids = ex.input_ids[: next((i for i, m in enumerate(ex.loss_mask) if m), 0)] or ex.input_ids
    return "ids:" + hashlib.sha256(array("q", ids).tobytes()).hexdigest()


def _rank(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True, slots=True)
class Split:
    """Training and held-out rows, from disjoint sources."""

    train: list[Example]
    held_out: list[Example]
    train_sources: int
    held_out_sources: int

    def summary(self) -> dict[str, int]:
        return {"train_rows": len(self.train), "train_sources": self.train_sources,
                "held_out_rows": len(self.held_out), "held_out_sources": self.held_out_sources}


def split_by_source(examples: Sequence[Example], held_out: int) -> Split:
    """Hold out whole sources, in SHA-256 order, until at least ``held_out`` rows are held
    out; the rest train. ValueError when no source would be left to train on."""
    groups: dict[str, list[Example]] = {}
    for ex in examples:
        groups.setdefault(source_key(ex), []).append(ex)
    held: set[str] = set()
    rows = 0
    for key in sorted(groups, key=_rank):
        if rows >= held_out:
            break
        held.add(key)
        rows += len(groups[key])
    if len(held) == len(groups):
        raise ValueError(f"{len(examples)} rows from {len(groups)} source(s) leave none to "
                         f"train on once held_out={held_out} rows are held out")
    return Split(train=[ex for ex in examples if source_key(ex) not in held],
                 held_out=[ex for ex in examples if source_key(ex) in held],
                 train_sources=len(groups) - len(held), held_out_sources=len(held))


def decode_prompts(held_out: Sequence[Example], n: int) -> list[tuple[int, ...]]:
    """The prompts of the first ``n`` held-out sources (in SHA-256 order), one each."""
    firsts: dict[str, Example] = {}
    for ex in held_out:
        firsts.setdefault(source_key(ex), ex)
    return [prompt_of(firsts[key]) for key in sorted(firsts, key=_rank)[:n]]


def decode_path(cfg: TrainConfig, target: TargetModel) -> str:
    """The cycle path the held-out decode runs (``held_out_decode_cycle`` on this target
    and device, :func:`dflash.decoding.cycle.path_for`); the trainer asks once before
    training, so a ``static`` the target cannot run is refused then, not at an evaluation."""
    try:
        return path_for(cfg.held_out_decode_cycle, target)
    except ValueError as exc:
        raise ConfigError(f"held_out_decode_cycle: {exc}") from None


@torch.no_grad()
def decode_counts(target: TargetModel, drafter: DFlashDrafter,
                  prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                  stop_ids: Sequence[int] = (), path: str = "eager") -> list[tuple[int, int]]:
    """Greedy speculative decoding of each of ``prompts`` on the cycle path ``path`` (one
    engine for all of them; on ``static`` its graphs are captured for this call and freed
    after): its accepted tokens and verify cycles. Pooled
    (:func:`dflash.decoding.spread.pooled_tau`), every cycle of every prompt counted once,
    they are ``dflash-eval``'s τ."""
    decode = cycle_decoder(target, drafter, Drafting(kind="dflash"), path=path)
    counts = []
    for prompt in prompts:
        got = decode(prompt, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
        counts.append((sum(got.accepted), len(got.accepted)))
    return counts


def plain_drafter(drafter: DFlashDrafter, world: World, device: torch.device,
                  dtype: torch.dtype) -> DFlashDrafter | None:
    """A drafter that decodes on its own: ``drafter`` itself in one process; under
    torchrun (FSDP2 shards) a collective that gathers the full weights into a plain copy
    on rank 0 (None on the other ranks)."""
    if not world.distributed:
        return drafter
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(
        drafter, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not world.is_main:
        return None
    plain = DFlashDrafter(drafter.cfg)
    plain.load_state_dict(full)
    return plain.to(device=device, dtype=dtype).eval()


def ratio(teacher_forced: float, decoding: float) -> float:
    """How many times the teacher-forced τ overstates decoding's (1.0: they agree)."""
    return teacher_forced / decoding if decoding > 0 else float("inf")


LossFn = Callable[[Tensor, Tensor, torch.Generator], tuple[LossOutput, Tensor]]


@torch.no_grad()
def teacher_forced_tau(forward_loss: LossFn, rows: list[Example], *, batch_size: int,
                       buckets: tuple[int, ...], seed: int, device: torch.device) -> float:
    """The mean simulated tau of ``forward_loss`` over ``rows`` at random anchors (the
    trainer's ``held_out_tau_random``), with the same anchors at every call (its own
    generator)."""
    loader = BatchLoader(rows, batch_size=batch_size, buckets=buckets, seed=seed, pad_id=0)
    gen = torch.Generator(device=device).manual_seed(seed + 2)
    taus = []
    for _ in range(loader.batches_per_epoch):
        batch = loader.next_batch()
        out, _ = forward_loss(batch.input_ids_BS.to(device), batch.loss_mask_BS.to(device),
                              gen)
        taus.append(out.tau_sim)
    return float(torch.stack(taus).mean().item())


def window_of(cfg: TrainConfig) -> int:
    """The tokens after each prompt that ``held_out_tau`` walks: ``held_out_window``, else
    as many as the free-running decode makes."""
    return cfg.held_out_window or cfg.held_out_decode_tokens


def evaluate(cfg: TrainConfig, random_tau: float, target: TargetModel, drafter: DFlashDrafter,
             world: World, rows: Sequence[Example], prompts: Sequence[Sequence[int]], *,
             device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """One evaluation's record. Where the target has its layers (not a drafter rank of
    split roles): ``held_out_tau``, decoding replayed teacher forced over ``rows``
    (:func:`dflash.replay.replay`, every rank alike: the drafter's forward may be a
    collective), and ``held_out_tau_stopped``, the rows whose stored response left the
    target's greedy choice (or ended) inside the window. Always ``held_out_tau_random``
    (``random_tau``). With ``prompts``, ``held_out_decode_tau`` and ``held_out_tau_ratio``
    (teacher-forced / free-running), and the free-running τ's bootstrap interval over the
    prompts (``held_out_decode_tau_lo`` and ``_hi``,
    :func:`dflash.decoding.spread.tau_interval`: a dozen prompts leave τ uncertain by
    more than the two differ); under torchrun a collective that leaves these to rank 0."""
    if target.released:
        return {"held_out_tau_random": random_tau}
    stop_ids = stop_ids_of(target)
    walked = replay(target, drafter, [(ex.input_ids, len(prompt_of(ex))) for ex in rows],
                    window=window_of(cfg), batch_size=cfg.batch_size, stop_ids=stop_ids,
                    dtype=dtype)
    found = {"held_out_tau": walked.tau, "held_out_tau_random": random_tau,
             "held_out_tau_stopped": walked.stopped}
    plain = plain_drafter(drafter, world, device, dtype) if prompts else None
    if plain is None:
        return found
    counts = decode_counts(target, plain, prompts, max_new_tokens=cfg.held_out_decode_tokens,
                           stop_ids=stop_ids, path=cfg.held_out_decode_cycle)
    tau = pooled_tau(counts) or 1.0
    lo, hi = tau_interval(counts)
    found.update(held_out_decode_tau=tau, held_out_tau_ratio=ratio(walked.tau, tau),
                 held_out_decode_tau_lo=lo or tau, held_out_decode_tau_hi=hi or tau)
    return found


def report(cfg: TrainConfig, split: Mapping[str, Any], decode_prompts: int,
           last: Mapping[str, Any]) -> dict[str, Any]:
    """metadata.json's ``held_out``: the split (rows and sources on each side, disjoint),
    and the last evaluation's teacher-forced τ (the walk over ``window`` tokens, the rows
    it could not follow to the end, and the random-anchor mean), and the decoding τ with
    the ratio."""
    out: dict[str, Any] = {**split, "decode_prompts": decode_prompts,
                           "decode_tokens": cfg.held_out_decode_tokens, "window": window_of(cfg)}
    if "held_out_tau_random" in last:
        out.update(step=last["step"], teacher_forced_tau_random=last["held_out_tau_random"])
    if "held_out_tau" in last:
        out.update(teacher_forced_tau=last["held_out_tau"],
                   stopped_rows=last["held_out_tau_stopped"])
    if "held_out_decode_tau" in last:
        out.update(decode_tau=last["held_out_decode_tau"], ratio=last["held_out_tau_ratio"],
                   decode_tau_interval=[last["held_out_decode_tau_lo"],
                                        last["held_out_decode_tau_hi"]])
    return out
