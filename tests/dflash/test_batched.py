"""Batched greedy generation with a static cache (:mod:`dflash.decoding.batched`).

No GPU here: the step runs uncaptured, the same functions a CUDA graph records (the GPU
test in test_gpu.py records it); what is compared is the eager loop's tokens."""

from __future__ import annotations

import pytest
import torch

from dflash.decoding import batched, generate
from dflash.decoding.batched import BatchedGreedy
from dflash.decoding.generate import generate_responses, synthetic_prompts


def _prompts(target, n: int, length: int, seed: int = 0) -> list[list[int]]:
    return synthetic_prompts(n, vocab_size=target.vocab_size, length=length, seed=seed,
                             exclude=(target.mask_token_id,))


@pytest.mark.parametrize(("n", "length", "new"), [(5, 7, 12), (1, 1, 3), (3, 16, 30)])
def test_the_static_steps_give_the_eager_loops_tokens(tiny_target, n, length, new):
    prompts = _prompts(tiny_target, n, length, seed=n + length)
    eager = generate_responses(tiny_target, prompts, max_new_tokens=new)
    ids = torch.tensor(prompts, dtype=torch.long)
    made = BatchedGreedy(tiny_target, n, length, new, graphs=False).generate(ids)
    assert made == eager
    assert all(len(row) == new for row in made)


def test_one_generator_decodes_batch_after_batch(tiny_target):
    # The step's position, input and output are reset by each generate().
    gen = BatchedGreedy(tiny_target, 2, 5, 6, graphs=False)
    for seed in (1, 2):
        prompts = _prompts(tiny_target, 2, 5, seed)
        assert gen.generate(torch.tensor(prompts)) == generate_responses(
            tiny_target, prompts, max_new_tokens=6)
    with pytest.raises(ValueError, match="shape"):
        gen.generate(torch.zeros(3, 5, dtype=torch.long))


def test_only_equal_greedy_unstopped_batches_on_a_gpu_apply(tiny_target, monkeypatch):
    assert not batched.applies(tiny_target, False, 0.0, 0, 96)  # a CPU: the eager loop
    monkeypatch.setattr(batched, "graphs_for", lambda device: True)  # as on a GPU
    assert batched.applies(tiny_target, False, 0.0, 0, 96)
    assert not batched.applies(tiny_target, True, 0.0, 0, 96)  # left-padded
    assert not batched.applies(tiny_target, False, 0.7, 0, 96)  # sampled
    assert not batched.applies(tiny_target, False, 0.0, 1, 96)  # stops
    assert not batched.applies(tiny_target, False, 0.0, 0, 2)  # too short to record


def test_the_generation_takes_the_static_path_where_it_applies(tiny_target, monkeypatch):
    """generate_responses hands an equal-length greedy batch to the static steps (made to
    apply here, uncaptured: no GPU), and its tokens are the eager loop's."""
    prompts = _prompts(tiny_target, 4, 6, seed=9)
    eager = generate_responses(tiny_target, prompts, max_new_tokens=8)
    made: list[int] = []
    real = BatchedGreedy.__init__

    def uncaptured(self, target, batch, prompt_len, max_new, graphs):
        made.append(batch)
        real(self, target, batch, prompt_len, max_new, graphs=False)

    monkeypatch.setattr(batched, "applies", lambda *a: True)
    monkeypatch.setattr(BatchedGreedy, "__init__", uncaptured)
    assert generate.generate_responses(tiny_target, prompts, max_new_tokens=8) == eager
    assert made == [4]


def test_the_loop_says_it_has_settled_after_its_prefill_and_before_any_step(tiny_target):
    """Once settled, the loop only replays its recorded step: the prefill's token is in
    and no step has run yet (no new-token column past the first is written)."""
    prompts = torch.tensor(_prompts(tiny_target, 3, 5, seed=4))
    gen = BatchedGreedy(tiny_target, 3, 5, 7, graphs=False)
    seen: list[tuple[list[int], list[int], int]] = []

    def settled() -> None:
        seen.append((gen.out_BN[:, 0].tolist(), gen.out_BN[:, 1].tolist(), int(gen.pos)))

    rows = gen.generate(prompts, settled)
    assert seen == [([r[0] for r in rows], [0, 0, 0], 5)]


def test_only_the_last_batchs_loop_says_it_has_settled(tiny_target, monkeypatch):
    """With several batches the earlier ones still allocate after theirs settle: only the
    last one's tells; an eager loop never does (its caller learns at the end)."""
    prompts = _prompts(tiny_target, 5, 6, seed=2)
    made: list[int] = []
    real_init, real_generate = BatchedGreedy.__init__, BatchedGreedy.generate

    def uncaptured(self, target, batch, prompt_len, max_new, graphs):
        real_init(self, target, batch, prompt_len, max_new, graphs=False)

    def generating(self, prompts_BP, on_settled=None):
        made.append(int(prompts_BP.shape[0]))
        return real_generate(self, prompts_BP, on_settled)

    calls: list[int] = []
    monkeypatch.setattr(batched, "applies", lambda *a: True)
    monkeypatch.setattr(BatchedGreedy, "__init__", uncaptured)
    monkeypatch.setattr(BatchedGreedy, "generate", generating)
    out = generate.generate_responses(tiny_target, prompts, max_new_tokens=4, batch_size=2,
                                      on_settled=lambda: calls.append(len(made)))
    assert made == [2, 2, 1] and calls == [3]
    monkeypatch.setattr(batched, "applies", lambda *a: False)
    assert generate.generate_responses(tiny_target, prompts, max_new_tokens=4, batch_size=2,
                                       on_settled=lambda: calls.append(-1)) == out
    assert calls == [3]


@pytest.mark.parametrize("after_settling", [False, True])
def test_a_failed_recording_falls_back_but_not_once_settled(tiny_target, monkeypatch,
                                                            after_settling):
    """A recording CUDA refuses leaves the eager loop to decode; a failure after the loop
    said it only replays is raised (the main thread may be compiling by then)."""
    prompts = _prompts(tiny_target, 2, 5, seed=8)
    eager = generate_responses(tiny_target, prompts, max_new_tokens=5)

    def refused(self, target, batch, prompt_len, max_new, graphs):
        if not after_settling:
            raise RuntimeError("operation not permitted when stream is capturing")

    def fails(self, prompts_BP, on_settled=None):
        on_settled()
        raise RuntimeError("a replay failed")

    monkeypatch.setattr(batched, "applies", lambda *a: True)
    monkeypatch.setattr(BatchedGreedy, "__init__", refused)
    monkeypatch.setattr(BatchedGreedy, "generate", fails)
    calls: list[int] = []
    if after_settling:
        with pytest.raises(RuntimeError, match="replay"):
            generate.generate_responses(tiny_target, prompts, max_new_tokens=5,
                                        on_settled=lambda: calls.append(1))
        assert calls == [1]
    else:
        assert generate.generate_responses(tiny_target, prompts, max_new_tokens=5) == eager
