"""Train = inference, and lossless speculative decoding, on a real tiny target.

A trained drafter comes from the session fixture ``trained_tiny`` (the ``tiny`` preset),
so the lossless check also covers cycles that accept several drafts."""

from __future__ import annotations

import pytest
import torch

from dflash.decoding.evaluate import evaluate
from dflash.decoding.generate import synthetic_prompts
from dflash.decoding.speculative import (
    DraftStream,
    ngram_decoder,
    ngram_greedy,
    speculative_greedy,
    target_greedy,
)
from dflash.loss import block_inputs
from dflash.masks import dense_mask, sdpa_attend
from dflash.model import DFlashDrafter
from dflash.target import drafter_config_for


@pytest.fixture
def untrained(tiny_target) -> DFlashDrafter:
    torch.manual_seed(0)
    cfg = drafter_config_for(tiny_target, num_layers=2, block_size=4, gamma=4.0)
    return DFlashDrafter(cfg).float().eval()


def _training_logits(target, drafter, ids_1S, anchors):
    bs = drafter.cfg.block_size
    anchors_1N = torch.tensor([anchors])
    keep_1N = torch.ones_like(anchors_1N, dtype=torch.bool)
    ids_1Q, pos_1Q = block_inputs(ids_1S, anchors_1N, bs, drafter.cfg.mask_token_id)
    seq = ids_1S.shape[1]
    hidden = drafter(target.embed(ids_1Q), target.features(ids_1S), pos_1Q,
                     torch.arange(seq)[None], sdpa_attend(dense_mask(anchors_1N, keep_1N, seq, bs)))
    return target.lm_head(hidden)[0].view(len(anchors), bs, -1)


@torch.no_grad()
@pytest.mark.parametrize("block_size", [4, 7])
def test_decode_path_equals_training_forward(tiny_target, block_size):
    torch.manual_seed(1)
    cfg = drafter_config_for(tiny_target, num_layers=2, block_size=block_size, gamma=4.0)
    drafter = DFlashDrafter(cfg).float().eval()
    ids_1S = torch.randint(0, 511, (1, 48), generator=torch.Generator().manual_seed(3))
    anchors = [1, 5, 6, 13, 30, 40]  # several crop cycles, gaps of 1 and more
    train = _training_logits(tiny_target, drafter, ids_1S, anchors)
    feats = tiny_target.features(ids_1S)
    stream = DraftStream(drafter, tiny_target)
    seen = 0
    for n, a in enumerate(anchors):
        got = stream.draft(int(ids_1S[0, a]), a, feats[:, seen:a])
        seen = a
        assert stream.cache.length == a  # block dropped, context kept
        torch.testing.assert_close(got, train[n].float(), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_decode_path_refuses_a_gap_in_context(tiny_target, untrained):
    feats = tiny_target.features(torch.zeros(1, 10, dtype=torch.long))
    stream = DraftStream(untrained, tiny_target)
    with pytest.raises(ValueError, match="anchor is at"):
        stream.draft(0, 10, feats[:, :8])


def _prompts(n: int, seed: int = 99) -> list[list[int]]:
    return synthetic_prompts(n, vocab_size=512, length=12, seed=seed, exclude=(511,))


def test_lossless_with_an_untrained_drafter(tiny_target, untrained):
    report = evaluate(tiny_target, untrained, _prompts(3), max_new_tokens=40, warmup=False)
    assert report.lossless, report.mismatches
    assert report.tau >= 1.0 and report.tokens == 3 * 40


def test_lossless_with_a_trained_drafter(tiny_target, trained_tiny):
    drafter = trained_tiny.drafter
    report = evaluate(tiny_target, drafter, _prompts(6), max_new_tokens=64, warmup=False)
    assert report.lossless, report.mismatches
    # The trained drafter gets whole runs accepted, so crops after partial acceptance
    # and after full blocks are both exercised.
    assert sum(report.acceptance_histogram[1:]) > 0
    assert report.acceptance_histogram[-1] > 0


def test_stop_ids_cut_both_paths_identically(tiny_target, untrained):
    prompt = _prompts(1)[0]
    full = target_greedy(tiny_target, prompt, max_new_tokens=30)
    stop = full.tokens[7]
    first = full.tokens.index(stop)
    ref = target_greedy(tiny_target, prompt, max_new_tokens=30, stop_ids=(stop,))
    spec = speculative_greedy(tiny_target, untrained, prompt, max_new_tokens=30,
                              stop_ids=(stop,))
    assert ref.tokens == spec.tokens == full.tokens[: first + 1]


def test_a_broken_verifier_is_caught(tiny_target, trained_tiny, monkeypatch):
    """The lossless check can fail: accept one draft too many and it must notice."""
    import dflash.decoding.evaluate as ev
    import dflash.decoding.speculative as spec

    real = spec.target_greedy
    prompts = _prompts(3)
    good = evaluate(tiny_target, trained_tiny.drafter, prompts, max_new_tokens=32, warmup=False)
    assert good.lossless

    def off_by_one(target, prompt, *, max_new_tokens, stop_ids=()):
        r = real(target, prompt, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
        return spec.DecodeResult((*r.tokens[:5], (r.tokens[5] + 1) % 511, *r.tokens[6:]),
                                 r.target_forwards, r.seconds)

    monkeypatch.setattr(ev, "target_greedy", off_by_one)  # the reference evaluate() runs
    bad = evaluate(tiny_target, trained_tiny.drafter, prompts, max_new_tokens=32, warmup=False)
    assert not bad.lossless and bad.mismatches[0].position == 5
    # The speculative token is the target's true argmax there: the corrupted reference
    # token scores lower, so the gap is negative (not a near-tie).
    assert bad.mismatches[0].logit_gap is not None and bad.mismatches[0].logit_gap < 0


def test_max_draft_caps_each_cycle_and_stays_lossless(tiny_target, trained_tiny):
    prompt = _prompts(1, seed=5)[0]
    ref = target_greedy(tiny_target, prompt, max_new_tokens=40)
    for cap in (0, 1, 2):
        got = speculative_greedy(tiny_target, trained_tiny.drafter, prompt,
                                 max_new_tokens=40, max_draft=cap)
        assert got.tokens == ref.tokens
        assert max(got.accepted) <= cap + 1 and max(got.drafted) <= cap
    with pytest.raises(ValueError, match="max_draft must be in"):
        speculative_greedy(tiny_target, trained_tiny.drafter, prompt, max_new_tokens=4,
                           max_draft=trained_tiny.drafter.cfg.block_size)


def test_drafts_never_run_past_max_new_tokens(tiny_target, trained_tiny):
    for max_new in (1, 2, 5, 17):
        got = speculative_greedy(tiny_target, trained_tiny.drafter, _prompts(1, seed=6)[0],
                                 max_new_tokens=max_new)
        # The prefill's token, then every cycle's tokens: exactly max_new, none cut off.
        assert len(got.tokens) == max_new == 1 + sum(got.accepted)


def test_ngram_greedy_equals_target_greedy(tiny_target):
    looping = [5, 9, 5, 9, 5, 9, 17, 3, 5, 9]
    for prompt in (looping, *_prompts(2)):
        ref = target_greedy(tiny_target, prompt, max_new_tokens=30)
        got = ngram_greedy(tiny_target, prompt, max_new_tokens=30, max_draft=6)
        assert got.tokens == ref.tokens
        assert got.target_forwards == len(got.accepted) and got.seconds > 0
        assert len(got.drafted) == len(got.accepted) and max(got.drafted) <= 6
        assert 1 + sum(got.accepted) == len(got.tokens)


def test_evaluate_takes_any_decoder(tiny_target):
    prompts = [[5, 9, 5, 9, 5, 9, 17, 3, 5, 9], *_prompts(2)]
    decode = ngram_decoder(tiny_target, max_draft=7)
    phases: list[str] = []
    done: list[tuple[int, int]] = []
    report = evaluate(tiny_target, decode, prompts, max_new_tokens=24, max_draft=7,
                      on_phase=phases.append, on_prompt=lambda i, n: done.append((i, n)))
    assert report.lossless and report.tokens == report.target_tokens == 3 * 24
    assert len(report.acceptance_histogram) == 8 and report.cycles == sum(
        p["cycles"] for p in report.per_prompt)
    assert report.tau >= 1.0 and 0 <= report.draft_acceptance <= 1
    assert report.tokens_from_drafts == sum(report.acceptance_histogram[i] * i
                                            for i in range(8))
    assert phases[0] == "warming up" and phases[1].startswith("decoding 3")
    assert done == [(1, 3), (2, 3), (3, 3)]
    d = report.to_dict()
    assert d["speculative_tokens_per_s"] > 0 and d["target_tokens_per_s"] > 0
    with pytest.raises(ValueError, match="max_draft is needed"):
        evaluate(tiny_target, decode, prompts, max_new_tokens=4, warmup=False)
