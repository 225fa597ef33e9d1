"""The held-out rows and what is measured on them: a τ that predicts decoding.

Which rows are held out (:func:`split_by_source`): whole *sources*, never single rows.
A source is a row's ``source`` or ``prompt_id`` (the file a prompt was cut from, as
``dflash-generate`` carries it over from the prompts file), else its prompt's tokens, so
two responses to one prompt, or two prompts cut from one file, fall on the same side.
Sources are taken in the order of their SHA-256 (not the file's order, which groups a
file's rows together) until ``held_out`` rows are held out. Holding out the last rows of
the file, as the trainer did, put prompts of the same files on both sides: the held-out τ
read 10.4 where decoding gave 5.12.

What is measured at each evaluation: the teacher-forced τ (the trainer's
``held_out_tau``: the target's own continuation as context, every block scored) and,
next to it, a free-running one (:func:`decode_tau`): greedy speculative decoding of a
few held-out prompts with the current drafter against the target, where a drafted token
is accepted only if the target would say it. Their ratio says how far the first
overstates the second.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dflash.batching import BatchLoader
from dflash.data import Example
from dflash.decoding.generate import stop_ids_of
from dflash.decoding.speculative import speculative_greedy
from dflash.distributed.world import World
from dflash.loss import LossOutput
from dflash.model import DFlashDrafter
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


@torch.no_grad()
def decode_tau(target: TargetModel, drafter: DFlashDrafter,
               prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               stop_ids: Sequence[int] = ()) -> float:
    """Tokens per verify cycle of greedy speculative decoding of ``prompts`` (every
    cycle of every prompt counted once, as ``dflash-eval``'s τ)."""
    cycles: list[int] = []
    for prompt in prompts:
        got = speculative_greedy(target, drafter, prompt, max_new_tokens=max_new_tokens,
                                 stop_ids=stop_ids)
        cycles.extend(got.accepted)
    return sum(cycles) / len(cycles) if cycles else 1.0


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
    """The mean simulated tau of ``forward_loss`` over ``rows``, with the same anchors at
    every call (its own generator)."""
    loader = BatchLoader(rows, batch_size=batch_size, buckets=buckets, seed=seed, pad_id=0)
    gen = torch.Generator(device=device).manual_seed(seed + 2)
    taus = []
    for _ in range(loader.batches_per_epoch):
        batch = loader.next_batch()
        out, _ = forward_loss(batch.input_ids_BS.to(device), batch.loss_mask_BS.to(device),
                              gen)
        taus.append(out.tau_sim)
    return float(torch.stack(taus).mean().item())


def with_decoding(teacher_forced: float, target: TargetModel, drafter: DFlashDrafter,
                  world: World, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                  device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """One evaluation's record: ``held_out_tau`` (``teacher_forced``) and, when there are
    ``prompts`` and the target can decode (not a drafter rank of split roles, whose target
    has no layers), ``held_out_decode_tau`` and ``held_out_tau_ratio``; under torchrun a
    collective that leaves the decoding figures to rank 0."""
    found = {"held_out_tau": teacher_forced}
    if not prompts or target.released:
        return found
    plain = plain_drafter(drafter, world, device, dtype)
    if plain is None:
        return found
    tau = decode_tau(target, plain, prompts, max_new_tokens=max_new_tokens,
                     stop_ids=stop_ids_of(target))
    found.update(held_out_decode_tau=tau, held_out_tau_ratio=ratio(teacher_forced, tau))
    return found
