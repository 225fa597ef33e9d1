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
