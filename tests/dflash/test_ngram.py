"""The n-gram (prompt-lookup) drafter: the definition, its incremental index, and the
lossless draft-verify loop (against fake verifiers and the real tiny target)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash.ngram import (
    Decoded,
    NgramDrafter,
    NgramSpec,
    ReplayVerifier,
    TargetVerifier,
    propose,
    speculate,
)


def oracle(context: Sequence[int], k: int, n_max: int, n_min: int) -> list[int]:
    """Brute force: every order, every earlier start, then pick."""
    ctx = list(context)
    for n in range(n_max, n_min - 1, -1):
        if n > len(ctx):
            continue
        starts = [i for i in range(len(ctx) - n) if ctx[i:i + n] == ctx[len(ctx) - n:]]
        if starts:
            i = max(starts)
            return ctx[i + n:i + n + k]
    return []


# -- propose ------------------------------------------------------------------------------
def test_hit_proposes_what_followed():
    assert propose([1, 2, 3, 4, 9, 2, 3], 2) == [4, 9]


def test_miss_is_empty():
    assert propose([1, 2, 3, 4], 3) == []  # the last token never occurred before


def test_empty_and_single_token_contexts():
    assert propose([], 4) == []
    assert propose([7], 4) == []


def test_most_recent_occurrence_wins():
    #          0  1  2  3  4  5  6  7  8
    context = [5, 1, 5, 2, 5, 3, 8, 8, 5]
    assert propose(context, 1, n_max=1) == [3]  # the 5 at index 4, not 0 or 2


def test_longest_order_wins_over_a_more_recent_shorter_match():
    # suffix (1, 2): the bigram occurs at index 0 (followed by 7); the unigram 2 occurs
    # more recently at index 4 (followed by 9). The longer match is preferred.
    context = [1, 2, 7, 0, 2, 9, 1, 2]
    assert propose(context, 1, n_max=2) == [7]
    assert propose(context, 1, n_max=1) == [9]


def test_n_min_refuses_short_matches():
    context = [3, 4, 9, 4]
    assert propose(context, 2, n_min=1) == [9, 4]
    assert propose(context, 2, n_min=2) == []


def test_k_caps_the_proposal_and_the_context_end_cuts_it():
    context = [1, 2, 3, 4, 5, 6, 1]
    assert propose(context, 3) == [2, 3, 4]
    assert propose(context, 100) == [2, 3, 4, 5, 6, 1]
    assert propose(context, 0) == []


def test_overlapping_match_in_a_run():
    # The most recent earlier "7" is the one just before the end: one token follows it.
    assert propose([7, 7, 7, 7], 5, n_max=1) == [7]
    assert propose([7, 7, 7, 7], 5, n_max=3) == [7]  # trigram at 0, followed by index 3


@pytest.mark.parametrize(("n_max", "n_min", "k"), [(4, 0, 1), (1, 2, 1), (4, 1, -1)])
def test_bad_arguments(n_max, n_min, k):
    with pytest.raises(ValueError, match="must be"):
        propose([1, 2, 1], k, n_max=n_max, n_min=n_min)


contexts = st.lists(st.integers(0, 4), max_size=40)  # a small alphabet: many matches
orders = st.tuples(st.integers(1, 6), st.integers(1, 6)).map(sorted)


@settings(max_examples=400, deadline=None)
@given(contexts, st.integers(0, 8), orders)
def test_propose_equals_the_brute_force_oracle(context, k, order):
    n_min, n_max = order
    assert propose(context, k, n_max=n_max, n_min=n_min) == oracle(context, k, n_max, n_min)


# -- the incremental drafter ----------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(contexts, st.lists(st.integers(1, 8)), orders)
def test_drafter_index_equals_propose_as_the_context_grows(context, ks, order):
    n_min, n_max = order
    drafter = NgramDrafter(n_max=n_max, n_min=n_min)
    for i, token in enumerate(context):
        drafter.append(token)
        k = ks[i % len(ks)] if ks else 3
        assert drafter.propose(k) == oracle(context[:i + 1], k, n_max, n_min)
    assert drafter.tokens == tuple(context)
    assert len(drafter) == len(context)


def test_drafter_refuses_bad_orders_and_k():
    with pytest.raises(ValueError, match="n_min"):
        NgramDrafter(n_max=2, n_min=3)
    with pytest.raises(ValueError, match="k must be"):
        NgramDrafter(context=[1, 1]).propose(-1)


@pytest.mark.parametrize(("text", "want"), [
    ("ngram", NgramSpec(4, 1)), ("ngram:6", NgramSpec(6, 1)), ("ngram:6:3", NgramSpec(6, 3)),
    ("runs/drafter", None), ("ngrams", None)])
def test_spec_parse(text, want):
    assert NgramSpec.parse(text) == want


@pytest.mark.parametrize("text", ["ngram:", "ngram:x", "ngram:2:3", "ngram:0", "ngram:1:2:3"])
def test_spec_parse_refuses_malformed(text):
    with pytest.raises(ValueError, match=r"n-gram drafter|n_max|n_min"):
        NgramSpec.parse(text)


# -- the draft-verify loop ----------------------------------------------------------------
class FakeVerifier:
    """A deterministic 'target': the next token is a function of the last ``order``
    tokens (so its output loops, and n-gram drafts get accepted). It checks that the loop
    keeps the cache protocol: blocks start at the cached length; crops only shrink."""

    def __init__(self, table: dict[tuple[int, ...], int], order: int, vocab: int) -> None:
        self.table, self.order, self.vocab = table, order, vocab
        self.cache: list[int] = []
        self.blocks: list[int] = []

    def next_token(self, prefix: Sequence[int]) -> int:
        key = tuple(prefix[-self.order:])
        return self.table.get(key, sum(key) % self.vocab)

    def prefill(self, prompt: Sequence[int]) -> int:
        self.cache = list(prompt)
        return self.next_token(self.cache)

    def verify(self, block: Sequence[int], start: int) -> list[int]:
        assert start == len(self.cache), "a block must start where the cache ends"
        self.blocks.append(len(block))
        out = []
        for token in block:
            self.cache.append(token)
            out.append(self.next_token(self.cache))
        return out

    def keep(self, length: int) -> None:
        assert length <= len(self.cache)
        del self.cache[length:]


def greedy(verifier: FakeVerifier, prompt: Sequence[int], max_new_tokens: int,
           stops: Sequence[int]) -> tuple[int, ...]:
    context, out = list(prompt), []
    while len(out) < max_new_tokens:
        out.append(verifier.next_token(context))
        context.append(out[-1])
        if out[-1] in stops:
            break
    return tuple(out)


def _fake(order: int = 2, vocab: int = 5, seed: int = 0) -> FakeVerifier:
    """A random table from every ``order``-gram over ``vocab`` tokens to a next token."""
    import itertools
    import random

    rng = random.Random(seed)  # noqa: S311 - test data
    keys = itertools.product(range(vocab), repeat=order)
    return FakeVerifier({k: rng.randrange(vocab) for k in keys}, order, vocab)


def test_speculate_accepts_drafts_on_a_looping_target():
    fake = _fake()
    got = speculate(fake, [1, 2, 3], max_new_tokens=60, max_draft=7)
    assert got.tokens == greedy(_fake(), [1, 2, 3], 60, ())
    assert len(got.tokens) == 60
    assert got.tau > 2  # a 2nd-order table over 5 tokens loops: lookups hit
    assert got.target_forwards == len(got.accepted) < 60
    assert max(fake.blocks) <= 8 and max(got.drafted) <= 7
    assert all(1 <= a <= d + 1 for a, d in zip(got.accepted, got.drafted, strict=True))


def test_speculate_with_no_drafts_is_plain_greedy():
    fake = _fake()
    got = speculate(fake, [4, 0], max_new_tokens=12, max_draft=0)
    assert got.accepted == (1,) * 11 and got.drafted == (0,) * 11
    assert got.tokens == greedy(_fake(), [4, 0], 12, ())


def test_speculate_stops_after_a_stop_token():
    ref = greedy(_fake(), [1, 2, 3], 40, ())
    stop = ref[5]
    got = speculate(_fake(), [1, 2, 3], max_new_tokens=40, max_draft=4, stop_ids=[stop])
    assert got.tokens == ref[: ref.index(stop) + 1]


def test_speculate_refuses_bad_arguments():
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculate(_fake(), [1], max_new_tokens=0, max_draft=3)
    with pytest.raises(ValueError, match="empty"):
        speculate(_fake(), [], max_new_tokens=3, max_draft=3)


def test_speculate_refuses_a_verifier_that_returns_the_wrong_length():
    class Short(FakeVerifier):
        def verify(self, block, start):
            return super().verify(block, start)[:-1]

    with pytest.raises(ValueError, match="returned"):
        speculate(Short({}, 1, 3), [1, 1, 1], max_new_tokens=5, max_draft=2)


@settings(max_examples=150, deadline=None)
@given(prompt=st.lists(st.integers(0, 5), min_size=1, max_size=12),
       order=st.integers(1, 3), vocab=st.integers(2, 6), seed=st.integers(0, 10**6),
       max_new=st.integers(1, 50), max_draft=st.integers(0, 9),
       stops=st.lists(st.integers(0, 5), max_size=2), orders=orders)
def test_speculate_is_lossless(prompt, order, vocab, seed, max_new, max_draft, stops, orders):
    n_min, n_max = orders
    fake = _fake(order, vocab, seed)
    got = speculate(fake, prompt, max_new_tokens=max_new, max_draft=max_draft,
                    stop_ids=stops, n_max=n_max, n_min=n_min)
    assert got.tokens == greedy(fake, prompt, max_new, stops)
    assert isinstance(got, Decoded)
    # Each cycle emits accepted drafts + 1; nothing beyond the last cycle is emitted.
    assert 1 + sum(got.accepted) >= len(got.tokens)


@settings(max_examples=100, deadline=None)
@given(prompt=st.lists(st.integers(0, 4), min_size=1, max_size=10), seed=st.integers(0, 999),
       max_new=st.integers(1, 40), max_draft=st.integers(0, 9))
def test_replaying_a_recorded_decode_gives_the_live_cycles(prompt, seed, max_new, max_draft):
    live = speculate(_fake(2, 4, seed), prompt, max_new_tokens=max_new, max_draft=max_draft)
    recorded = greedy(_fake(2, 4, seed), prompt, max_new, ())
    replay = speculate(ReplayVerifier([*prompt, *recorded]), prompt, max_new_tokens=max_new,
                       max_draft=max_draft)
    assert replay == live


def test_replay_refuses_a_foreign_prompt_and_running_off_the_end():
    with pytest.raises(ValueError, match="not the start"):
        ReplayVerifier([1, 2, 3]).prefill([2])
    with pytest.raises(ValueError, match="ends at"):
        speculate(ReplayVerifier([1, 2, 3]), [1, 2], max_new_tokens=3, max_draft=2)


@pytest.fixture(scope="module")
def tiny_target():
    """The ``tiny`` named target shape: a real transformers Qwen3 model, random weights."""
    from dflash.target import load_target

    return load_target("tiny", seed=0)


def test_target_verifier_on_the_tiny_target_equals_uncached_greedy(tiny_target):
    """The adapter over a real transformers model: lossless against a greedy decode that
    reruns the whole sequence (no KV cache, so no shared code path)."""
    import torch

    prompt = [5, 9, 5, 9, 5, 9, 17, 3, 5, 9]
    got = speculate(TargetVerifier(tiny_target), prompt, max_new_tokens=24, max_draft=5)
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(24):
            logits = tiny_target.model(input_ids=torch.tensor([seq])).logits
            seq.append(int(logits[0, -1].argmax()))
    assert got.tokens == tuple(seq[len(prompt):])
    assert sum(got.drafted) > 0  # the repetitive prompt gave drafts to verify
