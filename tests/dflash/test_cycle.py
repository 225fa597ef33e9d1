"""The static decode cycle and the hybrid drafter, on the real tiny target (CPU, fp32).

On CPU the static path runs uncaptured (CUDA graphs need a GPU; tests/dflash/test_gpu.py
checks the captured one there): the same fixed-shape code, so equal tokens here mean the
static cache, its masks and the staged drafter context are right. The trained drafter
(``trained_tiny``) accepts several drafts a cycle, so partial and full acceptance are
both exercised."""

from __future__ import annotations

import pytest
import torch

from dflash.decoding import static
from dflash.decoding.cycle import (
    Drafting,
    StaticEngine,
    choose_path,
    cycle_decoder,
    run_cycles,
)
from dflash.decoding.evaluate import evaluate
from dflash.decoding.generate import synthetic_prompts
from dflash.decoding.reference import CapturedGreedy
from dflash.decoding.speculative import DraftStream, speculative_greedy, target_greedy
from dflash.model import DFlashDrafter
from dflash.ngram import NgramDrafter
from dflash.target import drafter_config_for


def _prompts(n: int, seed: int = 99, length: int = 12) -> list[list[int]]:
    return synthetic_prompts(n, vocab_size=512, length=length, seed=seed, exclude=(511,))


@pytest.fixture
def drafter(tiny_target) -> DFlashDrafter:
    torch.manual_seed(2)
    cfg = drafter_config_for(tiny_target, num_layers=2, block_size=4, gamma=4.0)
    return DFlashDrafter(cfg).float().eval()


@torch.no_grad()
def test_static_drafter_drafts_what_the_eager_stream_drafts(tiny_target, drafter):
    """Anchors with gaps of 1 and of more than a stage holds (rows=3: full stages are
    run and their drafts dropped), the block's K/V dropped between calls."""
    ids_1S = torch.randint(0, 511, (1, 48), generator=torch.Generator().manual_seed(3))
    feats = tiny_target.features(ids_1S)
    eager = DraftStream(drafter, tiny_target)
    fixed = static.StaticDrafter(drafter, tiny_target, rows=3, slots=64, graphs=False)
    seen = 0
    for a in [1, 5, 6, 13, 30, 40]:
        want = eager.draft(int(ids_1S[0, a]), a, feats[:, seen:a])[1:].argmax(dim=-1)
        fixed.feed(feats[:, seen:a])
        got = fixed.draft(ids_1S[0, a:a + 1], a)
        seen = a
        assert got.tolist() == want.tolist()


@torch.no_grad()
def test_static_drafter_refuses_a_gap_in_context(tiny_target, drafter):
    feats = tiny_target.features(torch.zeros(1, 10, dtype=torch.long))
    fixed = static.StaticDrafter(drafter, tiny_target, rows=4, slots=64, graphs=False)
    fixed.feed(feats[:, :8])
    with pytest.raises(ValueError, match="anchor is at 10"):
        fixed.draft(torch.zeros(1, dtype=torch.long), 10)
    fixed.feed(feats[:, 8:10])
    assert fixed.draft(torch.zeros(1, dtype=torch.long), 10).shape == (3,)


@torch.no_grad()
def test_static_verify_gives_the_eager_forward_s_tokens_and_features(tiny_target):
    prompt = _prompts(1)[0]
    fixed = static.StaticTarget(tiny_target, block=5, slots=64, graphs=False)
    first, feats = fixed.prefill(prompt)
    cache = tiny_target.new_cache()
    logits, want_feats = tiny_target.forward_cached(torch.tensor([prompt]), cache, 0)
    assert first == int(logits[0, -1].argmax())
    torch.testing.assert_close(feats, want_feats, rtol=1e-5, atol=1e-5)
    p = len(prompt)
    for block in ([first, 7, 9], [first], [first, 1, 2, 3, 4]):  # padded, then full
        truth, got_feats = fixed.verify(torch.tensor([block]), p)
        logits, want_feats = tiny_target.forward_cached(torch.tensor([block]), cache, p)
        assert truth.tolist() == logits[0].argmax(dim=-1).tolist()
        torch.testing.assert_close(got_feats[:, :len(block)], want_feats, rtol=1e-5, atol=1e-5)
        tiny_target.crop_cache(cache, p)  # the static cache needs no crop: its mask hides it


def test_the_graph_path_is_chosen_on_cuda_only(tiny_target):
    """No GPU here: the device is only compared, never used."""
    assert not static.graphs_for(torch.device("cpu"))
    assert static.graphs_for(torch.device("cuda"))
    assert static.graphs_for(torch.device("cuda", 1))
    assert choose_path("auto", torch.device("cpu"), True) == "eager"
    assert choose_path("auto", torch.device("cuda"), True) == "static"
    assert choose_path("auto", torch.device("cuda"), False) == "eager"  # transformers target
    assert choose_path("static", torch.device("cpu"), True) == "static"
    assert choose_path("eager", torch.device("cuda"), True) == "eager"
    with pytest.raises(ValueError, match="own Qwen3"):
        choose_path("static", torch.device("cuda"), False)
    assert static.supports(tiny_target)


def test_cache_sizes_grow_by_doubling_and_never_shrink():
    assert static.slots_for(10) == static.SLOT_FLOOR
    assert static.slots_for(static.SLOT_FLOOR + 1) == 2 * static.SLOT_FLOOR
    assert static.slots_for(10, have=4096) == 4096


@pytest.mark.parametrize("kind", ["dflash", "ngram", "hybrid"])
def test_static_path_decodes_the_eager_path_s_tokens(tiny_target, drafter, kind, monkeypatch):
    """Every drafting on both paths: the same tokens as target-only greedy and as each
    other, with the same cycles; for DFlash also a prompt long enough to need a second
    cache size (the floor lowered to keep the test short), and the same cycles as
    ``speculative_greedy``. The static hybrid verifies both drafts a cycle, so its
    cycles are its own (test_branches.py); here a static engine without the second
    branch runs the eager path's choice rule and must give the eager path's cycles."""
    monkeypatch.setattr(static, "SLOT_FLOOR", 32)
    prompts = _prompts(2)
    if kind == "dflash":
        prompts.append(_prompts(1, seed=5, length=40)[0])
    drafting = Drafting(kind=kind, min_match=1)
    paths = {path: cycle_decoder(tiny_target, drafter, drafting, path=path)
             for path in ("eager", "static")}
    one_branch = StaticEngine(tiny_target, drafter, 3, graphs=False)
    for prompt in prompts:
        ref = target_greedy(tiny_target, prompt, max_new_tokens=20)
        got = {path: decode(prompt, max_new_tokens=20) for path, decode in paths.items()}
        assert got["eager"].tokens == got["static"].tokens == ref.tokens
        if kind == "hybrid":
            one_branch.size_for(len(prompt) + 20)
            got["static"] = run_cycles(one_branch, drafting, prompt, device=tiny_target.device,
                                       max_new_tokens=20, max_draft=3)
            assert got["static"].tokens == ref.tokens
        assert got["eager"].accepted == got["static"].accepted
        assert got["eager"].drafted == got["static"].drafted
        if kind == "dflash":
            spec = speculative_greedy(tiny_target, drafter, prompt, max_new_tokens=20)
            assert (spec.tokens, spec.accepted) == (got["static"].tokens,
                                                    got["static"].accepted)


def test_static_path_with_a_trained_drafter_is_lossless_and_accepts(tiny_target, trained_tiny):
    drafter = trained_tiny.drafter
    prompts = _prompts(4, seed=7)
    eager = evaluate(tiny_target, cycle_decoder(tiny_target, drafter, Drafting(kind="dflash"),
                                                path="eager"),
                     prompts, max_new_tokens=48, warmup=False, max_draft=3)
    fixed = evaluate(tiny_target, cycle_decoder(tiny_target, drafter, Drafting(kind="dflash"),
                                                path="static"),
                     prompts, max_new_tokens=48, warmup=False, max_draft=3)
    assert fixed.lossless, fixed.mismatches
    assert fixed.acceptance_histogram == eager.acceptance_histogram
    # partial and full acceptances both exercised (whatever the drafter's exact tau)
    assert sum(fixed.acceptance_histogram[1:-1]) > 0 and fixed.acceptance_histogram[-1] > 0
    assert fixed.cycle_cost > 0


# -- the hybrid's choice --------------------------------------------------------------------

def test_hybrid_takes_the_lookup_where_enough_tokens_repeat():
    hybrid = Drafting(kind="hybrid", min_match=3)
    context = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7]  # ends with 5 6 7, seen before: then 8 9
    assert hybrid.pick(hybrid.lookup(context), 2) == [8, 9]


def test_hybrid_takes_the_drafter_where_the_match_is_short():
    hybrid = Drafting(kind="hybrid", min_match=3)
    context = [5, 6, 7, 8, 9, 1, 2, 4, 6, 7]  # only 6 7 repeats: two tokens
    assert hybrid.pick(hybrid.lookup(context), 2) is None
    # prompt lookup alone drafts from the shorter match, and the lookup answers alike
    ngram = Drafting(kind="ngram")
    assert ngram.pick(ngram.lookup(context), 2) == [8, 9]
    assert NgramDrafter(n_min=1, context=context).propose(2) == [8, 9]
    assert Drafting(kind="dflash").pick(None, 2) is None


def test_hybrid_is_lossless_and_uses_both_drafters(tiny_target, trained_tiny):
    """Prompts that repeat themselves (a segment twice), so the lookup fires, and random
    stretches, so the drafter drafts too; on both cycle paths."""
    drafter = trained_tiny.drafter
    prompts = [p[:10] + p[:10] + p[10:] for p in _prompts(3, seed=11, length=16)]
    for path in ("eager", "static"):
        decode = cycle_decoder(tiny_target, drafter, Drafting(kind="hybrid", min_match=2),
                               path=path)
        report = evaluate(tiny_target, decode, prompts, max_new_tokens=48, warmup=False,
                          max_draft=3)
        assert report.lossless, (path, report.mismatches)
        assert 0 < report.lookups < report.cycles, path


def test_hybrid_needs_a_drafter(tiny_target):
    with pytest.raises(ValueError, match="needs a drafter"):
        cycle_decoder(tiny_target, None, Drafting(kind="hybrid"))
    with pytest.raises(ValueError, match="min_match"):
        Drafting(kind="hybrid", min_match=0)


def test_the_captured_reference_decodes_the_eager_references_tokens(tiny_target):
    """Target-only decoding on the static cache, one token a step (uncaptured on a CPU):
    the same tokens as target-only greedy decoding, a stop id ending both alike, and a
    longer prompt growing its cache."""
    reference = CapturedGreedy(tiny_target, graphs=False)
    for prompt in (*_prompts(3), *_prompts(1, seed=5, length=500)):
        eager = target_greedy(tiny_target, prompt, max_new_tokens=24)
        got = reference(prompt, max_new_tokens=24)
        assert got.tokens == eager.tokens and got.target_forwards == eager.target_forwards
        stop = eager.tokens[5]
        assert (reference(prompt, max_new_tokens=24, stop_ids=(stop,)).tokens
                == target_greedy(tiny_target, prompt, max_new_tokens=24,
                                 stop_ids=(stop,)).tokens)
    assert reference.slots == static.slots_for(500 + 24 + 1) == 2 * static.SLOT_FLOOR
