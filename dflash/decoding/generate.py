"""The target's own responses to prompts: the paper's training data.

DFlash drafters are trained on the target's *own* outputs, so a drafter learns what the
target will say, not what some dataset said. Prompts come from a JSONL file (any format
of :mod:`dflash.data`) or are random; the target decodes them (greedy by default,
batched, with a KV cache). ``dflash-generate`` writes them to a file
(:mod:`dflash.cli.generate`); the trainer makes them itself when it has no data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from dflash.config import TrainConfig
from dflash.data import Example, read_prompts
from dflash.decoding import batched
from dflash.errors import ConfigError
from dflash.target import TargetModel


def synthetic_prompts(n: int, *, vocab_size: int, length: int, seed: int,
                      exclude: Sequence[int] = ()) -> list[list[int]]:
    """n random prompts of ``length`` ids, never using the ids in ``exclude`` (MASK)."""
    if n < 1 or length < 1:
        raise ValueError(f"need n >= 1 and length >= 1, got n={n}, length={length}")
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[list(exclude)] = False
    pool = allowed.nonzero().flatten()
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(pool), (n, length), generator=gen)
    rows: list[list[int]] = pool[picks].tolist()
    return rows


def _next_tokens(logits_BV: torch.Tensor, temperature: float, gen: torch.Generator | None
                 ) -> torch.Tensor:
    if temperature <= 0:
        return logits_BV.argmax(dim=-1)
    probs = torch.softmax(logits_BV / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


_STOP_CHECK_EVERY = 8

GENERATION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                       SDPBackend.MATH]
"""The attention kernels generation may use: not cuDNN's, which plans a kernel for every
key length it meets, and decoding meets a new one every step."""


def _left_padded(prompts: Sequence[Sequence[int]], device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, P] ids, each prompt right-aligned, and each row's padding (None: none padded).
    The padding id is 0; it is masked, so any id would do."""
    longest = max(len(p) for p in prompts)
    if all(len(p) == longest for p in prompts):
        return torch.tensor([list(p) for p in prompts], dtype=torch.long, device=device), None
    rows = [[0] * (longest - len(p)) + list(p) for p in prompts]
    pad = [longest - len(p) for p in prompts]
    return (torch.tensor(rows, dtype=torch.long, device=device),
            torch.tensor(pad, dtype=torch.long, device=device))


@torch.no_grad()
def _generate_group(target: TargetModel, prompts_BP: torch.Tensor, pad_B: torch.Tensor | None,
                    max_new_tokens: int, temperature: float, gen: torch.Generator | None,
                    stop_ids: torch.Tensor, on_settled: Callable[[], None] | None = None
                    ) -> list[list[int]]:
    """Decode one batch of left-padded prompts; a row stops after a stop id. Equal
    lengths, greedy, on a GPU: one captured step a token (:mod:`dflash.decoding.batched`),
    which calls ``on_settled`` when it has allocated all it will (the eager loop never)."""
    bsz, plen = prompts_BP.shape
    if batched.applies(target, pad_B is not None, temperature, len(stop_ids), max_new_tokens):
        settled = []

        def settle() -> None:
            settled.append(True)
            if on_settled is not None:
                on_settled()

        try:
            with sdpa_kernel(GENERATION_BACKENDS):
                return batched.BatchedGreedy(target, bsz, plen, max_new_tokens,
                                             graphs=True).generate(prompts_BP, settle)
        except torch.cuda.OutOfMemoryError:
            raise
        except RuntimeError:  # a recording CUDA refused: the eager loop's tokens instead
            if settled:  # not after saying it only replays: others compile meanwhile
                raise
    with sdpa_kernel(GENERATION_BACKENDS):
        return _decode_group(target, prompts_BP, pad_B, max_new_tokens, temperature, gen,
                             stop_ids)


def _decode_group(target: TargetModel, prompts_BP: torch.Tensor, pad_B: torch.Tensor | None,
                  max_new_tokens: int, temperature: float, gen: torch.Generator | None,
                  stop_ids: torch.Tensor) -> list[list[int]]:
    bsz, plen = prompts_BP.shape
    cache = target.new_cache()
    logits, _ = target.forward_cached(prompts_BP, cache, 0, last_only=True, pad_B=pad_B)
    done_B = torch.zeros(bsz, dtype=torch.bool, device=prompts_BP.device)
    out: list[torch.Tensor] = []
    for i in range(max_new_tokens):
        tok_B = _next_tokens(logits[:, -1], temperature, gen)
        out.append(tok_B)
        if i + 1 == max_new_tokens:
            break
        if len(stop_ids):
            done_B |= torch.isin(tok_B, stop_ids)
            # Asking the device whether every row stopped waits for it; every few steps
            # only, so the host queues the next steps meanwhile (rows cut after stops).
            if i % _STOP_CHECK_EVERY == _STOP_CHECK_EVERY - 1 and bool(done_B.all()):
                break
        logits, _ = target.forward_cached(tok_B[:, None], cache, plen + i, last_only=True,
                                          pad_B=pad_B)
    rows = torch.stack(out, dim=1).tolist()
    stops = set(stop_ids.tolist())
    result = []
    for row in rows:
        cut = next((j + 1 for j, t in enumerate(row) if t in stops), len(row))
        result.append(row[:cut])
    return result


def generate_responses(target: TargetModel, prompts: Sequence[Sequence[int]], *,
                       max_new_tokens: int, temperature: float = 0.0, seed: int = 0,
                       stop_ids: Sequence[int] = (), batch_size: int = 64,
                       on_progress: Callable[[int, int], None] | None = None,
                       on_settled: Callable[[], None] | None = None) -> list[list[int]]:
    """The target's continuation of every prompt, in input order.

    Prompts are sorted by length and decoded ``batch_size`` at a time. A batch whose
    prompts differ in length is left-padded: the padding is masked out of attention and
    each row's positions start at its first token, so a row decodes as it would alone
    (greedy results equal up to rounding: a tie between two logits within float error may
    break the other way, as any change of batch shape may). A batch of equal lengths has
    no padding and no mask. Each row stops after its first stop id or ``max_new_tokens``.
    ``on_progress(done, total)`` hears the prompts done after each batch; ``on_settled()``
    that the last batch's loop will allocate nothing more on the device (its captured steps
    are recorded and its prefill dispatched; an eager loop allocates to its end, and does
    not call it).

    Batching by exact length instead left real prompt sets (lengths cut at many points)
    in hundreds of small batches, each decoding ``max_new_tokens`` steps.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    for i, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {i} is empty")
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    gen = None
    if temperature > 0:
        gen = torch.Generator(device=target.device).manual_seed(seed)
    stops = torch.tensor(list(stop_ids), dtype=torch.long, device=target.device)
    responses: list[list[int]] = [[] for _ in prompts]
    done = 0
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        ids, pad = _left_padded([prompts[i] for i in chunk], target.device)
        last = start + batch_size >= len(order)
        rows = _generate_group(target, ids, pad, max_new_tokens, temperature, gen, stops,
                               on_settled if last else None)
        for i, row in zip(chunk, rows, strict=True):
            responses[i] = row
        done += len(chunk)
        if on_progress is not None:
            on_progress(done, len(prompts))
    return responses


DTYPES = ("auto", "bfloat16", "float32")


def device_and_dtype(name: str, dtype: str = "auto") -> tuple[str, torch.dtype]:
    """``auto`` picks cuda when present; dtype ``auto`` is bf16 on GPU, fp32 on CPU."""
    device = ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name
    if dtype == "auto":
        return device, torch.bfloat16 if device.startswith("cuda") else torch.float32
    return device, {"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]


def prompts_for(target: TargetModel, *, prompts_file: str | None, synthetic: int | None,
                length: int, seed: int) -> list[list[int]]:
    """Prompts from a JSONL file (any dflash.data format) or ``synthetic`` random ones."""
    if prompts_file:
        return read_prompts(prompts_file, tokenizer=target.tokenizer,
                            vocab_size=target.vocab_size)
    return synthetic_prompts(synthetic or 0, vocab_size=target.vocab_size, length=length,
                             seed=seed, exclude=(target.mask_token_id,))


def positions_of(target: TargetModel) -> int | None:
    """How many positions the target was made for (``max_position_embeddings``); None when
    its config does not say."""
    context = getattr(target.config, "max_position_embeddings", None)
    return context if isinstance(context, int) and not isinstance(context, bool) else None


def check_context(target: TargetModel, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
                  max_draft: int = 0, option: str = "--max-new-tokens ") -> None:
    """The longest prompt, ``max_new_tokens`` and a last verify of ``max_draft`` drafts fit
    the target's positions (:func:`positions_of`; a config without them is not checked):
    past them a learned position table fails with an IndexError and a rotary one decodes
    what it was never trained on. ``option``: how the message names ``max_new_tokens``."""
    context = positions_of(target)
    longest = max((len(p) for p in prompts), default=0)
    if context is not None and longest + max_new_tokens + max_draft > context:
        raise ConfigError(f"{option}{max_new_tokens}: the longest prompt "
                          f"({longest} tokens) and {max_new_tokens} new tokens"
                          + (f" and {max_draft} drafts" if max_draft else "")
                          + f" pass the target's {context} positions")


def stop_ids_of(target: TargetModel) -> tuple[int, ...]:
    eos = getattr(target.tokenizer, "eos_token_id", None) if target.tokenizer else None
    return () if eos is None else (int(eos),)


def synthetic_examples(target: TargetModel, cfg: TrainConfig) -> list[Example]:
    """The paper's 'responses regenerated by the target', from random prompts."""
    prompts = synthetic_prompts(cfg.synthetic_prompts, vocab_size=target.vocab_size,
                                length=cfg.synthetic_prompt_length, seed=cfg.seed,
                                exclude=(target.mask_token_id,))
    responses = generate_responses(target, prompts, max_new_tokens=cfg.synthetic_response_tokens,
                                   temperature=0.0, seed=cfg.seed)
    return [Example(input_ids=tuple(p + r), loss_mask=tuple([0] * len(p) + [1] * len(r)))
            for p, r in zip(prompts, responses, strict=True)]
