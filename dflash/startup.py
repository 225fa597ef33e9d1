"""What the trainer does before its first step, timed phase by phase.

:class:`dflash.train.Trainer` builds in phases (the target, the drafter, placing it,
the data) and its warm-up is one more. :class:`StartClock` times each (the device
synchronised at the end, so GPU work lands in its own phase) and tells a listener as
each begins and ends: ``dflash-train`` prints them on stderr (:mod:`dflash.cli.display`).

Also here, the parts of the build that decide how long it takes:

- :func:`build_drafter` makes the drafter's parameters on the device it trains on, so an
  8B-sized drafter is never initialised element by element on the host (on CPU it is
  the same build, from the same random stream, as before);
- :func:`training_examples`: the recipe's data. Synthetic data is generated in batches
  as large as a fixed memory budget allows on a GPU (the 64-prompt batches the CPU keeps
  ran an 8B target's decode loop 8 times for the default 512 prompts), and a warm-up-only
  run, which needs nothing but the batch shapes, gets random ids in every bucket instead
  of generating anything. Greedy generation is a pure function of the target, the
  recipe and the numerics, so its result is kept in dflash's cache
  (:func:`remembered_examples`): a later start with the same key reads it (10-15 s of
  an 8B start on the H200 was this decode loop).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Protocol

import torch

from dflash.batching import BatchLoader
from dflash.config import DrafterConfig, TrainConfig
from dflash.data import Example, drop_short, read_examples, write_jsonl_atomic
from dflash.decoding import batched
from dflash.decoding.generate import (
    check_context,
    generate_responses,
    positions_of,
    synthetic_prompts,
)
from dflash.errors import ConfigError, DataError
from dflash.heldout import Split, split_by_source
from dflash.meter import sync_stream
from dflash.model import DFlashDrafter
from dflash.presets import STDLIB_TARGET, target_path
from dflash.target import TargetModel
from envguard.errors import EnvguardError

GENERATION_BYTES = 16 * 2**30
"""Device memory one batch of synthetic generation may use at most for its KV cache (a
prefill keeps the last position's logits only): the default recipe's 512 prompts (16 + 96
tokens) in one batch for an 8B target. A third of the free memory when that is less."""
CPU_GENERATION_BATCH = 64


class PhaseListener(Protocol):
    """Hears each start phase as it begins and when it ends."""

    def begin(self, phase: str, text: str) -> None: ...

    def end(self, phase: str, text: str, seconds: float) -> None: ...


class StartClock:
    """Seconds per start phase, in the order they ran; see the module docstring. A phase
    ends when the device has done what this thread queued for it (not the data's loop
    beside it, which runs on a stream of its own: :class:`DataPhase`)."""

    def __init__(self, device: torch.device, listener: PhaseListener | None = None) -> None:
        self.device = device
        self.listener = listener
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str, text: str) -> Iterator[None]:
        """Time the block as phase ``name``; ``text`` says what it does ("building the
        target"). A phase that raises is not reported as ended."""
        if self.listener is not None:
            self.listener.begin(name, text)
        start = time.perf_counter()
        yield
        sync_stream(self.device)
        seconds = time.perf_counter() - start
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        if self.listener is not None:
            self.listener.end(name, text, seconds)


def build_drafter(cfg: DrafterConfig, device: torch.device) -> DFlashDrafter:
    """The drafter in fp32 with its default initialisation, made on ``device`` (the
    global generator of that device type draws the weights: torch.manual_seed seeds both)."""
    with torch.device(device):
        return DFlashDrafter(cfg)


def generation_batch(target: TargetModel, cfg: TrainConfig) -> int:
    """Prompts per batch of synthetic generation: 64 on CPU (so the data stays what it
    was), on a GPU as many as :data:`GENERATION_BYTES` holds, at least 64."""
    if target.device.type == "cpu":
        return CPU_GENERATION_BATCH
    c = target.config
    heads = int(getattr(c, "num_key_value_heads", None) or c.num_attention_heads)
    head_dim = int(getattr(c, "head_dim", None) or target.hidden_size // c.num_attention_heads)
    itemsize = torch.empty((), dtype=target.dtype).element_size()
    kv_per_token = 2 * target.num_layers * heads * head_dim * itemsize
    tokens = cfg.synthetic_prompt_length + cfg.synthetic_response_tokens
    last_logits = target.vocab_size * (itemsize + 4)
    per_prompt = tokens * kv_per_token + last_logits
    budget = GENERATION_BYTES
    if target.device.type == "cuda":
        budget = min(budget, torch.cuda.mem_get_info(target.device)[0] // 3)
    return max(CPU_GENERATION_BATCH, min(cfg.synthetic_prompts, budget // per_prompt))


def synthetic_examples(target: TargetModel, cfg: TrainConfig, batch: int | None = None, *,
                       on_settled: Callable[[], None] | None = None) -> list[Example]:
    """The paper's 'responses regenerated by the target', from random prompts, ``batch``
    at a time (default :func:`generation_batch`); ``on_settled``: as
    :func:`dflash.decoding.generate.generate_responses`. Every row is
    ``synthetic_prompt_length + synthetic_response_tokens`` ids (greedy, no stop id):
    :func:`synthetic_shapes`."""
    prompts = synthetic_prompts(cfg.synthetic_prompts, vocab_size=target.vocab_size,
                                length=cfg.synthetic_prompt_length, seed=cfg.seed,
                                exclude=(target.mask_token_id,))
    responses = generate_responses(target, prompts, max_new_tokens=cfg.synthetic_response_tokens,
                                   temperature=0.0, seed=cfg.seed,
                                   batch_size=batch or generation_batch(target, cfg),
                                   on_settled=on_settled)
    return [Example(input_ids=tuple(p + r), loss_mask=tuple([0] * len(p) + [1] * len(r)))
            for p, r in zip(prompts, responses, strict=True)]


def synthetic_shapes(cfg: TrainConfig) -> list[tuple[int, int]]:
    """The batch shapes of the recipe's synthetic data, known before it is generated:
    its rows all have one length (:func:`synthetic_examples`)."""
    length = cfg.synthetic_prompt_length + cfg.synthetic_response_tokens
    row = Example(input_ids=(0,) * length, loss_mask=(1,) * length)
    return BatchLoader([row], batch_size=cfg.batch_size, buckets=cfg.buckets, seed=0,
                       pad_id=0).shapes()


def shape_examples(cfg: TrainConfig, vocab_size: int, mask_token_id: int, ranks: int
                   ) -> Split:
    """Random ids filling every bucket (a full batch on each of ``ranks`` ranks), and as
    many held-out rows (copies of the last): what a warm-up needs, which compiles per
    shape and reads no values (every bucket keeps its full batch: no split by source)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    examples = []
    for bucket in cfg.buckets:
        for _ in range(cfg.batch_size * ranks):
            ids = torch.randint(0, vocab_size - 1, (bucket,), generator=gen)
            ids[ids >= mask_token_id] += 1  # never the mask id
            examples.append(Example(input_ids=tuple(ids.tolist()),
                                    loss_mask=(0,) + (1,) * (bucket - 1)))
    held = examples[-1:] * cfg.held_out
    return Split(train=examples, held_out=held, train_sources=len(examples),
                 held_out_sources=min(1, len(held)))


def split_held_out(cfg: TrainConfig, examples: list[Example]) -> Split:
    """Training and held-out rows of the usable examples, from disjoint sources: whole
    sources held out until there are ``cfg.held_out`` rows (:mod:`dflash.heldout`)."""
    usable = drop_short(examples, 2 * cfg.block_size)
    need = f"each needs >= {2 * cfg.block_size} loss tokens"
    if len(usable) <= cfg.held_out:
        raise ConfigError(f"only {len(usable)} usable examples (need more than "
                          f"held_out={cfg.held_out}); {need}")
    try:
        return split_by_source(usable, cfg.held_out)
    except ValueError as exc:
        raise ConfigError(f"{exc} ({need})") from None


def check_against_target(cfg: TrainConfig, target: TargetModel, *, generates: bool) -> None:
    """What the recipe asks of the target, or a one-line ConfigError before the drafter is
    built: a drafter no deeper than its target (a deeper one drafts slower than the target
    decodes; ``draft_layers=100000`` would be built layer by layer until memory ran out),
    and rows that fit the target's positions
    (:func:`dflash.decoding.generate.positions_of`): every row is padded to its bucket (and
    cut to the largest), so the largest bucket must fit, and where the run ``generates``
    its rows, so must a synthetic prompt and its response before they are cut. Past its
    positions a rotary target gives features it was never trained on, and the drafter
    learns from them; a learned position table fails outright."""
    if cfg.draft_layers > target.num_layers:
        raise ConfigError(f"draft_layers={cfg.draft_layers}: deeper than the target "
                          f"({target.num_layers} layers) it drafts for")
    context = positions_of(target)
    if context is None:
        return
    if max(cfg.buckets) > context:
        raise ConfigError(f"buckets: the largest, {max(cfg.buckets)}, passes the target's "
                          f"{context} positions (every row is padded to its bucket): set "
                          f"buckets to at most {context}")
    if generates:
        check_context(target, [range(cfg.synthetic_prompt_length)],
                      cfg.synthetic_response_tokens, option="synthetic_response_tokens=")


def check_decode_positions(cfg: TrainConfig, target: TargetModel,
                           prompts: Sequence[Sequence[int]]) -> None:
    """The held-out decode's longest prompt, ``held_out_decode_tokens`` and a last verify of
    a block's drafts fit the target's positions (as ``dflash-eval`` asks of its own)."""
    if prompts:
        check_context(target, prompts, cfg.held_out_decode_tokens,
                      max_draft=cfg.block_size - 1, option="held_out_decode_tokens=")


def synthetic_key(cfg: TrainConfig, target: TargetModel, batch: int) -> str:
    """What greedy synthetic data depends on, as a digest: the target (a named shape's
    seed, else its files' names, sizes and times), the recipe's prompt settings, the
    generation ``batch`` (:func:`generation_batch`) and the numerics (device, dtype, torch
    build, the network's implementation and whether its decode steps are captured,
    :mod:`dflash.decoding.batched`)."""
    source = target_path(cfg.target) if cfg.target != STDLIB_TARGET else None
    files: list[tuple[str, int, int]] = []
    if source is not None:
        folder = source if source.is_dir() else source.parent
        for path in sorted(folder.iterdir()):
            with suppress(OSError):
                st = path.stat()
                files.append((path.name, st.st_size, st.st_mtime_ns))
    device = target.device
    device_name = (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else device.type)
    parts = {"format": "dflash-synthetic/1", "target": cfg.target, "files": files,
             "seed": cfg.seed, "prompts": cfg.synthetic_prompts,
             "prompt_length": cfg.synthetic_prompt_length,
             "response_tokens": cfg.synthetic_response_tokens,
             "vocab": target.vocab_size, "mask": target.mask_token_id,
             "batch": batch, "device": device_name,
             "dtype": str(target.dtype), "torch": torch.__version__,
             "network": network_of(target),
             "steps": ("captured" if batched.applies(target, False, 0.0, 0,
                                                     cfg.synthetic_response_tokens)
                       else "eager")}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def network_of(target: TargetModel) -> str:
    """Which code runs the target: dflash's own Qwen3, or transformers (its version, read
    from the installed metadata: no import)."""
    if type(target.model).__module__.startswith("dflash."):
        return f"{type(target.model).__module__}.{type(target.model).__name__}"
    from importlib.metadata import PackageNotFoundError, version
    try:
        return f"transformers {version('transformers')}"
    except PackageNotFoundError:
        return type(target.model).__module__


def remembered_path(cfg: TrainConfig, target: TargetModel, folder: Path,
                    batch: int) -> Path | None:
    """Where synthetic data generated ``batch`` prompts at a time is kept in ``folder``;
    None where that folder is not private (:func:`envguard.paths.private_folder`: owned by
    this user, not writable by group or others): data another user could write is never
    trained on, and none is kept there (the start generates, which costs time only)."""
    from envguard.paths import private_folder

    kept = folder / "synthetic"
    return (kept / f"{synthetic_key(cfg, target, batch)}.jsonl"
            if private_folder(kept) else None)


def remembered_examples(target: TargetModel, cfg: TrainConfig, path: Path,
                        batch: int | None = None, *,
                        on_settled: Callable[[], None] | None = None) -> list[Example]:
    """:func:`synthetic_examples`, kept in ``path`` (:func:`remembered_path`: the data
    file format under a :func:`synthetic_key`) and read back by a later start with the same
    key. A file that does not read is generated again; one that cannot be written costs
    time."""
    with suppress(DataError, OSError):
        return read_examples(path, max_length=cfg.synthetic_prompt_length
                             + cfg.synthetic_response_tokens, vocab_size=target.vocab_size)
    examples = synthetic_examples(target, cfg, batch, on_settled=on_settled)
    with suppress(OSError, EnvguardError):
        write_jsonl_atomic(path, ({"input_ids": list(e.input_ids), "loss_mask": list(e.loss_mask)}
                                  for e in examples))
    return examples


def training_examples(cfg: TrainConfig, target: TargetModel, *, shapes_only: bool = False,
                      ranks: int = 1, remembered: Path | None = None,
                      batch: int | None = None,
                      on_settled: Callable[[], None] | None = None) -> Split:
    """Training and held-out examples: the recipe's data file, else generated by the
    target ``batch`` prompts at a time (kept in the file ``remembered`` when given,
    :func:`remembered_path`: the target was loaded from ``cfg.target``); with
    ``shapes_only`` and no data file, :func:`shape_examples`."""
    if cfg.data:
        examples = read_examples(cfg.data, tokenizer=target.tokenizer,
                                 max_length=max(cfg.buckets), vocab_size=target.vocab_size)
    elif shapes_only:
        return shape_examples(cfg, target.vocab_size, target.mask_token_id, ranks)
    elif remembered is not None:
        examples = remembered_examples(target, cfg, remembered, batch, on_settled=on_settled)
    else:
        examples = synthetic_examples(target, cfg, batch, on_settled=on_settled)
    return split_held_out(cfg, examples)
