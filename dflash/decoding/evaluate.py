"""How good a speculative decoder is: :func:`evaluate` decodes every prompt with the
target alone (:func:`~dflash.decoding.speculative.target_greedy`, the reference) and with
the decoder, on the same prompts, and reports tau, the wall-clock speedup and whether the
tokens are equal (:class:`EvalReport`). Where they differ, :class:`Mismatch` says where
and by how much the target's logits separate the two tokens.

:attr:`EvalReport.tau_interval` is τ's spread over the prompts
(:func:`dflash.decoding.spread.tau_interval`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dflash.decoding.speculative import (
    Decoder,
    check_max_draft,
    dflash_decoder,
    target_greedy,
)
from dflash.decoding.spread import INTERVAL_LEVEL, pooled_tau, tau_interval
from dflash.model import DFlashDrafter
from dflash.target import TargetModel


@dataclass(frozen=True, slots=True)
class Mismatch:
    prompt: int
    position: int
    target_token: int | None
    speculative_token: int | None
    logit_gap: float | None = None
    """The target's logit of its own token minus that of the speculative one, at the
    differing position (full-sequence forward): near 0 means a near-tie that a change of
    kernel (one token vs a block) can flip in low precision; large means a bug."""

    def to_dict(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "position": self.position,
                "target_token": self.target_token, "speculative_token": self.speculative_token,
                "logit_gap": self.logit_gap}


@dataclass(frozen=True, slots=True)
class EvalReport:
    prompts: int
    tokens: int
    """Tokens the speculative decoder emitted (all prompts)."""
    tau: float
    """Mean tokens per verify cycle (accepted drafts + bonus)."""
    target_seconds: float
    speculative_seconds: float
    lossless: bool
    mismatches: tuple[Mismatch, ...] = field(default=())
    acceptance_histogram: tuple[int, ...] = ()
    """Cycles that emitted 1, 2, ..., max_draft + 1 tokens."""
    target_tokens: int = 0
    """Tokens the target-only reference emitted (equal to ``tokens`` when lossless)."""
    drafted: int = 0
    """Draft tokens verified, all cycles."""
    max_draft: int = 0
    warmup_seconds: float = 0.0
    per_prompt: tuple[dict[str, Any], ...] = ()
    """Per prompt: tokens, cycles, tau, target and speculative seconds."""
    lookups: int = 0
    """Hybrid drafting: cycles that kept prompt lookup's draft (the rest: the drafter's)."""
    both_verified: int = 0
    """Hybrid drafting, static cycle: cycles that verified both drafts in one forward."""
    tau_interval: tuple[float, float] = (0.0, 0.0)
    """:func:`~dflash.decoding.spread.tau_interval` over the prompts (at its
    :data:`~dflash.decoding.spread.INTERVAL_LEVEL`)."""
    captured_target_seconds: float = 0.0
    """Target-only greedy decoding with its step captured
    (:class:`dflash.decoding.reference.CapturedGreedy`), all prompts; 0.0: not run."""
    captured_equal: bool | None = None
    """Whether the captured reference's tokens were the eager reference's, every prompt
    (None: not run)."""

    @property
    def speedup(self) -> float:
        return self.target_seconds / self.speculative_seconds if self.speculative_seconds else 0.0

    @property
    def speedup_captured(self) -> float:
        """The speedup over the captured target-only reference (0.0: not run)."""
        return (self.captured_target_seconds / self.speculative_seconds
                if self.captured_target_seconds and self.speculative_seconds else 0.0)

    @property
    def cycle_cost_captured(self) -> float:
        """What a cycle costs in captured target forwards (0.0: not run)."""
        return self._in_forwards(self.captured_target_seconds)

    @property
    def cycles(self) -> int:
        return sum(self.acceptance_histogram)

    @property
    def draft_acceptance(self) -> float:
        """Accepted drafts / verified drafts."""
        return (self.tokens_from_drafts / self.drafted) if self.drafted else 0.0

    @property
    def cycle_cost(self) -> float:
        """What a cycle costs in target forwards: seconds a cycle over seconds a
        target-only token (both include their prompts' prefills)."""
        return self._in_forwards(self.target_seconds)

    def _in_forwards(self, reference_seconds: float) -> float:
        """Seconds a cycle over seconds a token of a target-only reference that took
        ``reference_seconds`` for all its tokens (0.0 where either is missing)."""
        if not (self.cycles and self.target_tokens and reference_seconds):
            return 0.0
        return (self.speculative_seconds / self.cycles) / (reference_seconds
                                                           / self.target_tokens)

    @property
    def tokens_from_drafts(self) -> int:
        return sum(i * n for i, n in enumerate(self.acceptance_histogram))

    def to_dict(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "tokens": self.tokens, "tau": self.tau,
                "tau_interval": list(self.tau_interval), "tau_interval_level": INTERVAL_LEVEL,
                "cycles": self.cycles, "max_draft": self.max_draft,
                "target_seconds": self.target_seconds,
                "speculative_seconds": self.speculative_seconds, "speedup": self.speedup,
                "target_tokens_per_s": _rate(self.target_tokens, self.target_seconds),
                "speculative_tokens_per_s": _rate(self.tokens, self.speculative_seconds),
                "drafted": self.drafted, "draft_acceptance": self.draft_acceptance,
                "cycle_in_target_forwards": self.cycle_cost,
                "captured_target_seconds": self.captured_target_seconds,
                "speedup_captured": self.speedup_captured,
                "cycle_in_captured_target_forwards": self.cycle_cost_captured,
                "captured_equal": self.captured_equal, "lookups": self.lookups,
                "both_verified": self.both_verified,
                "lossless": self.lossless,
                "mismatches": [m.to_dict() for m in self.mismatches],
                "acceptance_histogram": list(self.acceptance_histogram),
                "warmup_seconds": self.warmup_seconds,
                "per_prompt": list(self.per_prompt)}


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds else 0.0


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i] != b[i]:
            return i
    return None


@torch.no_grad()
def _logit_gap(target: TargetModel, prompt: Sequence[int], before: Sequence[int],
               want: int, got: int) -> float:
    """logit(want) - logit(got) after prompt + before, in one uncached forward."""
    ids = torch.tensor([[*prompt, *before]], device=target.device)
    logits, _ = target.forward_cached(ids, target.new_cache(), 0)
    return float(logits[0, -1, want] - logits[0, -1, got])


def evaluate(target: TargetModel, decode: Decoder | DFlashDrafter,
             prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
             stop_ids: Sequence[int] = (), warmup: bool = True,
             max_draft: int | None = None,
             on_phase: Callable[[str], None] | None = None,
             on_prompt: Callable[[int, int], None] | None = None,
             captured: Decoder | None = None) -> EvalReport:
    """Decode every prompt both ways: tau, wall-clock speedup, and token-level equality.

    ``decode`` is a :class:`Decoder` (:func:`dflash_decoder`, :func:`ngram_decoder`) or a
    DFlash drafter; ``max_draft`` sizes the acceptance histogram (default: the drafter's
    block size minus one; required for another decoder). ``on_phase`` hears "warming up"
    and "decoding"; ``on_prompt(done, total)`` after each prompt. ``captured``: a second,
    captured target-only reference (:class:`dflash.decoding.reference.CapturedGreedy`)
    to time the decoder against too; its tokens are checked against the eager one's.
    """
    if not prompts:
        raise ValueError("no prompts to evaluate")
    if isinstance(decode, DFlashDrafter):
        max_draft = check_max_draft(max_draft, decode.cfg.block_size)
        decode = dflash_decoder(target, decode, max_draft)
    if max_draft is None:
        raise ValueError("max_draft is needed to size the acceptance histogram")
    warm_s = 0.0
    if warmup:  # first calls allocate and pick kernels; keep them out of the timings
        if on_phase is not None:
            on_phase("warming up")
        t0 = time.perf_counter()
        target_greedy(target, prompts[0], max_new_tokens=min(8, max_new_tokens))
        decode(prompts[0], max_new_tokens=min(8, max_new_tokens))
        if captured is not None:
            captured(prompts[0], max_new_tokens=min(8, max_new_tokens))
        warm_s = time.perf_counter() - t0
    if on_phase is not None:
        on_phase(f"decoding {len(prompts)} prompt(s), target-only and speculative")
    t_sec = s_sec = c_sec = 0.0
    captured_equal: bool | None = None if captured is None else True
    tokens = ref_tokens = drafted = lookups = both = 0
    cycles: list[int] = []
    counts: list[tuple[int, int]] = []  # accepted tokens and cycles, each prompt
    mismatches = []
    per_prompt = []
    for i, prompt in enumerate(prompts):
        ref = target_greedy(target, prompt, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
        spec = decode(prompt, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
        t_sec += ref.seconds
        s_sec += spec.seconds
        if captured is not None:
            clock = captured(prompt, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
            c_sec += clock.seconds
            captured_equal = captured_equal and clock.tokens == ref.tokens
        tokens += len(spec.tokens)
        ref_tokens += len(ref.tokens)
        drafted += sum(spec.drafted)
        lookups += spec.lookups
        both += spec.both_verified
        cycles.extend(spec.accepted)
        counts.append((sum(spec.accepted), len(spec.accepted)))
        per_prompt.append({"tokens": len(spec.tokens), "cycles": len(spec.accepted),
                           "accepted": sum(spec.accepted),
                           "tau": _rate(sum(spec.accepted), len(spec.accepted)),
                           "lookups": spec.lookups, "both_verified": spec.both_verified,
                           "target_seconds": ref.seconds, "speculative_seconds": spec.seconds})
        at = _first_difference(ref.tokens, spec.tokens)
        if at is not None:
            want = ref.tokens[at] if at < len(ref.tokens) else None
            got = spec.tokens[at] if at < len(spec.tokens) else None
            gap = (None if want is None or got is None
                   else _logit_gap(target, prompt, ref.tokens[:at], want, got))
            mismatches.append(Mismatch(i, at, want, got, gap))
        if on_prompt is not None:
            on_prompt(i + 1, len(prompts))
    histogram = [0] * (max_draft + 1)
    for n in cycles:
        histogram[n - 1] += 1
    return EvalReport(prompts=len(prompts), tokens=tokens,
                      tau=pooled_tau(counts),
                      tau_interval=tau_interval(counts),
                      target_seconds=t_sec, speculative_seconds=s_sec,
                      lossless=not mismatches, mismatches=tuple(mismatches),
                      acceptance_histogram=tuple(histogram), target_tokens=ref_tokens,
                      drafted=drafted, max_draft=max_draft, warmup_seconds=warm_s,
                      per_prompt=tuple(per_prompt), lookups=lookups, both_verified=both,
                      captured_target_seconds=c_sec, captured_equal=captured_equal)
