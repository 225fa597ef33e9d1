"""The hybrid's two-branch verify (dflash/decoding/branches.py) on the real tiny target
(CPU, fp32, uncaptured; tests/dflash/test_gpu.py runs it captured on a GPU).

Each row of the two-branch forward must see exactly what it sees in a verify of its own
branch alone: the greedy tokens are compared exactly, the features within 1e-5 (the same
sums over another number of rows round differently: about 3e-6 measured here). A lookup
win must leave the cache a lookup-only verify leaves, and a whole hybrid decode must be
target-only greedy's, each cycle accepting what the better branch alone would have."""

from __future__ import annotations

import pytest
import torch

from dflash.decoding import static
from dflash.decoding.branches import TwoBranchVerify
from dflash.decoding.cycle import Drafting, StaticEngine, cycle_decoder, matching
from dflash.decoding.generate import synthetic_prompts
from dflash.decoding.speculative import target_greedy

CLOSE = {"rtol": 1e-5, "atol": 1e-5}


def _prompt(seed: int = 99, length: int = 12) -> list[int]:
    return synthetic_prompts(1, vocab_size=512, length=length, seed=seed, exclude=(511,))[0]


def _pair(target, prompt: list[int], block: int = 5
          ) -> tuple[static.StaticTarget, static.StaticTarget, TwoBranchVerify, int]:
    """A one-branch verifier and a two-branch one, both with ``prompt`` prefilled."""
    one = static.StaticTarget(target, block=block, slots=64, graphs=False)
    two = static.StaticTarget(target, block=block, slots=64, graphs=False, spare=block - 1)
    first, _ = one.prefill(prompt)
    assert two.prefill(prompt)[0] == first
    return one, two, TwoBranchVerify(two, graphs=False), first


@torch.no_grad()
def test_each_branch_s_rows_are_a_verify_of_that_branch_alone(tiny_target):
    """A full and a short drafter block against lookup drafts of several lengths, the
    spare slots holding the previous call's rows each time."""
    prompt = _prompt()
    p = len(prompt)
    one, _, both, first = _pair(tiny_target, prompt)
    for mine, theirs in (([7, 9, 3, 4], [1, 2]), ([8], [5, 6, 7, 8]), ([], [3]),
                         ([2, 2, 2], [2, 2, 2, 2])):
        want_a, feats_a = (t.clone() for t in one.verify(torch.tensor([[first, *mine]]), p))
        want_b, feats_b = (t.clone() for t in one.verify(torch.tensor([[first, *theirs]]), p))
        got_a, got_b, feats = both.verify(torch.tensor([[first, *mine]]), theirs, p)
        assert got_a.tolist() == want_a.tolist()
        assert got_b.tolist() == want_b.tolist()
        torch.testing.assert_close(feats[:, :len(mine) + 1], feats_a[:, :len(mine) + 1], **CLOSE)
        rows_b = torch.cat([feats[:, :1], feats[:, 5:5 + len(theirs)]], dim=1)
        torch.testing.assert_close(rows_b, feats_b[:, :len(theirs) + 1], **CLOSE)


@torch.no_grad()
def test_a_lookup_win_leaves_the_cache_a_lookup_only_verify_leaves(tiny_target):
    """The lookup's first three drafts are the target's greedy text, the drafter's first
    is not: the lookup wins with 3; then its K/V, the drafter's next context and the next
    cycle's outputs are those of the cycle that verified the lookup's draft alone."""
    prompt = _prompt(seed=4)
    p = len(prompt)
    greedy = list(target_greedy(tiny_target, prompt, max_new_tokens=8).tokens)
    one, two, both, first = _pair(tiny_target, prompt)
    assert first == greedy[0]
    lookup = [*greedy[1:4], (greedy[4] + 1) % 500]
    mine = [(greedy[1] + 1) % 500, *greedy[2:5]]
    want_b, feats_b = one.verify(torch.tensor([[first, *lookup]]), p)
    got_a, got_b, feats = both.verify(torch.tensor([[first, *mine]]), lookup, p)
    assert matching(lookup, got_b.tolist()) == 3 and matching(mine, got_a.tolist()) == 0
    assert got_b.tolist() == want_b.tolist()
    torch.testing.assert_close(both.accepted_rows(feats, 3, lookup_won=True), feats_b[:, :4],
                               **CLOSE)
    both.keep_lookup(p)
    for layer in range(len(one.cache.keys)):
        for mine_kv, want_kv in ((two.cache.keys[layer], one.cache.keys[layer]),
                                 (two.cache.values[layer], one.cache.values[layer])):
            torch.testing.assert_close(mine_kv[:, :, :p + 4], want_kv[:, :, :p + 4], **CLOSE)
    after = torch.tensor([[greedy[4], *greedy[5:8]]])
    want_next, want_feats = one.verify(after, p + 4)
    got_next, got_feats = two.verify(after, p + 4)
    assert got_next.tolist() == want_next.tolist() == [*greedy[5:8], got_next.tolist()[-1]]
    torch.testing.assert_close(got_feats[:, :4], want_feats[:, :4], **CLOSE)  # 4: padding


def test_the_lookup_branch_needs_its_spare_slots(tiny_target):
    plain = static.StaticTarget(tiny_target, block=5, slots=64, graphs=False)
    with pytest.raises(ValueError, match="needs 4 spare slots"):
        TwoBranchVerify(plain, graphs=False)
    with pytest.raises(ValueError, match="needs a drafter"):
        StaticEngine(tiny_target, None, 4, graphs=False, two_branch=True)


def test_the_static_hybrid_accepts_the_better_branch_every_cycle(tiny_target, trained_tiny,
                                                                 monkeypatch):
    """Prompts that repeat a stretch (so prompt lookup drafts) and plain ones, the trained
    drafter: lossless, and every two-branch cycle accepts 1 + the larger of what each
    branch alone accepts, which (the decode being greedy's) is its drafts' longest
    prefix of the target-only text. The lookup must win some cycles and the drafter
    others: with min_match 1 the lookup drafts from single repeated tokens, often wrong,
    where the drafter still guesses right; in the repeated stretch and where the target
    loops the lookup is right. With the tiny preset's drafter each repeated prompt has
    several of both; the counts are summed over the prompts, so that a retrained drafter
    a little different does not fail the test, while one branch never winning does."""
    calls: list[tuple[list[int], list[int], int]] = []
    verify_both = StaticEngine.verify_both

    def spy(engine, block_1M, lookup, at):
        calls.append((block_1M[0].tolist(), list(lookup), at))
        return verify_both(engine, block_1M, lookup, at)

    monkeypatch.setattr(StaticEngine, "verify_both", spy)
    decode = cycle_decoder(tiny_target, trained_tiny.drafter,
                           Drafting(kind="hybrid", min_match=1), path="static", max_draft=3)
    wins = {"lookup": 0, "drafter": 0}
    for seed, repeat in ((4, True), (5, True), (8, True), (4, False), (8, False)):
        prompt = _prompt(seed, length=16)
        prompt = prompt[:10] + prompt[:10] + prompt[10:] if repeat else prompt
        calls.clear()
        got = decode(prompt, max_new_tokens=48)
        ref = target_greedy(tiny_target, prompt, max_new_tokens=48)
        assert got.tokens == ref.tokens, seed
        text = [*prompt, *ref.tokens]
        cycle_at, at = {}, len(prompt)
        for cycle, emitted in enumerate(got.accepted):
            cycle_at[at] = cycle
            at += emitted
        lookup_won = 0
        for block, lookup, at in calls:
            mine, theirs = matching(block[1:], text[at + 1:]), matching(lookup, text[at + 1:])
            assert got.accepted[cycle_at[at]] == 1 + max(mine, theirs), (seed, at)
            lookup_won += theirs > mine
            wins["drafter"] += mine > theirs
        assert got.lookups == lookup_won
        wins["lookup"] += lookup_won
    assert wins["lookup"] > 0 and wins["drafter"] > 0, wins


def test_a_lookup_draft_that_starts_the_drafters_own_is_not_verified(tiny_target, trained_tiny,
                                                                     monkeypatch):
    """``lookup_branch="useful"`` skips the second branch where the lookup's draft is the
    start of the drafter's (it could at best tie, and a tie keeps the drafter's): the same
    tokens, cycles and lookup wins as verifying it always, in fewer two-branch forwards,
    and exactly those cycles' fewer."""
    covered = [0]
    verify_both = StaticEngine.verify_both

    def spy(engine, block_1M, lookup, at):
        covered[0] += block_1M[0, 1:1 + len(lookup)].tolist() == list(lookup)
        return verify_both(engine, block_1M, lookup, at)

    monkeypatch.setattr(StaticEngine, "verify_both", spy)
    decoders = {mode: cycle_decoder(tiny_target, trained_tiny.drafter,
                                    Drafting(kind="hybrid", min_match=1, lookup_branch=mode),
                                    path="static", max_draft=3)
                for mode in ("always", "useful")}
    both = {"always": 0, "useful": 0}
    for seed in (4, 5, 8):
        prompt = _prompt(seed, length=16)
        prompt = prompt[:10] + prompt[:10] + prompt[10:]
        got = {mode: d(prompt, max_new_tokens=48) for mode, d in decoders.items()}
        assert got["useful"].tokens == got["always"].tokens
        assert got["useful"].accepted == got["always"].accepted
        assert got["useful"].lookups == got["always"].lookups
        for mode in both:
            both[mode] += got[mode].both_verified
    skipped = covered[0]  # counted in the "always" decodes only: "useful" never sends them
    assert skipped > 0
    assert both["useful"] == both["always"] - skipped


def test_the_lookup_branch_setting_is_checked():
    with pytest.raises(ValueError, match="lookup branch"):
        Drafting(kind="hybrid", lookup_branch="sometimes")
