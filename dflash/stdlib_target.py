"""The CPU demo's target (``--target tiny-stdlib``, the ``demo`` preset): the ``tiny`` shape
pretrained on this Python's standard library, built once and cached.

A random tiny target gives a drafter nothing to learn but noise. This one is a small
language model of code, made on the machine with nothing downloaded:

1. the corpus: every ``.py`` file of the running interpreter's standard library
   (``sysconfig.get_path("stdlib")``), without ``site-packages``, the test suites, idlelib,
   lib2to3, turtledemo and ensurepip; a file whose relative path hashes into one part in
   twenty is held out and never trained on;
2. a byte-level BPE tokenizer (``tokenizers``) of 511 tokens trained on the first
   ``corpus_bytes`` of the training files; row 511 of the embedding is DFlash's mask;
3. the ``tiny`` Qwen3 shape (8 layers, H = 64), pretrained for ``steps`` AdamW steps on
   random windows of the training tokens; the held-out loss is measured and recorded.

The folder (``config.json``, ``model.safetensors``, the tokenizer, ``corpus.json`` with the
split, the sizes and the losses) goes to ``$DFLASH_CACHE_DIR``, else
``$XDG_CACHE_HOME/dflash``, else ``~/.cache/dflash``, under ``targets/stdlib-<key>``: the key
hashes the recipe, the Python version and the corpus (each file's path and size), so
another interpreter or recipe builds its own. Concurrent builders (torchrun ranks) wait
for one another on a lock file; the folder appears only when complete.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import math
import os
import shutil
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash.ticks import Tick, TickFn, Values

NAME = "tiny-stdlib"
SKIP_PARTS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib",
                        "lib2to3", "__pycache__", "turtledemo", "ensurepip"})
EOS = "<|endoftext|>"


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    vocab: int = 511
    """Tokenizer size; the model has one more row, the mask."""
    corpus_bytes: int = 4_000_000
    steps: int = 600
    batch: int = 16
    length: int = 128
    lr: float = 3e-3
    held_out_every: int = 20
    seed: int = 0


def cache_root(env: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    explicit = env.get("DFLASH_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = env.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "dflash"


def corpus(root: Path | None = None) -> tuple[Path, list[str]]:
    """(the stdlib folder, its ``.py`` files relative to it, sorted)."""
    base = Path(root or sysconfig.get_path("stdlib"))
    files = sorted(str(p.relative_to(base)) for p in base.rglob("*.py")
                   if not (set(p.relative_to(base).parts) & SKIP_PARTS) and p.is_file())
    return base, files


def held_out(rel: str, every: int) -> bool:
    return int(hashlib.sha1(rel.encode()).hexdigest()[:8], 16) % every == 0


def key_of(recipe: Recipe, base: Path, files: list[str]) -> str:
    sizes = [(rel, (base / rel).stat().st_size) for rel in files]
    blob = json.dumps({"recipe": dataclasses.asdict(recipe), "python": sys.version.split()[0],
                       "files": sizes}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def folder_of(recipe: Recipe, base: Path, files: list[str]) -> Path:
    """Where the target of ``recipe`` on this corpus is cached."""
    return cache_root() / "targets" / f"stdlib-{key_of(recipe, base, files)}"


def built() -> Path | None:
    """The cached target folder of this Python and the environment's recipe, if built."""
    base, files = corpus()
    folder = folder_of(recipe_from_env(), base, files)
    return folder if (folder / "corpus.json").is_file() else None


def recipe_from_env(env: dict[str, str] | os._Environ[str] = os.environ) -> Recipe:
    """The default recipe; ``DFLASH_STDLIB_STEPS`` shortens the pretraining (a quick test),
    which is part of the cache key."""
    steps = env.get("DFLASH_STDLIB_STEPS")
    return Recipe(steps=int(steps)) if steps and steps.isdigit() and int(steps) > 0 else Recipe()


def ensure(model_config: Any, *, recipe: Recipe | None = None,
           say: Callable[[str], None] | None = None, on_tick: TickFn | None = None) -> Path:
    """The cached target folder, built first if missing (``model_config``: the tiny shape's
    transformers config, vocab 512). ``on_tick`` hears every pretraining step."""
    recipe = recipe or recipe_from_env()
    base, files = corpus()
    if not files:
        raise RuntimeError(f"no .py files under {base}: cannot build {NAME}")
    folder = folder_of(recipe, base, files)
    if (folder / "corpus.json").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another rank may be building it
        if not (folder / "corpus.json").is_file():
            partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
            shutil.rmtree(partial, ignore_errors=True)
            try:
                _build(partial, model_config, recipe, base, files, say, on_tick)
                shutil.rmtree(folder, ignore_errors=True)
                os.rename(partial, folder)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
    return folder


def _texts(base: Path, files: list[str]) -> list[str]:
    return [(base / rel).read_text(encoding="utf-8", errors="ignore") for rel in files]


def _build(folder: Path, model_config: Any, recipe: Recipe, base: Path, files: list[str],
           say: Callable[[str], None] | None, on_tick: TickFn | None = None) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    started = time.perf_counter()
    train = [f for f in files if not held_out(f, recipe.held_out_every)]
    held = [f for f in files if held_out(f, recipe.held_out_every)]
    texts, used = [], []
    total = 0
    for rel, text in zip(train, _texts(base, train), strict=True):
        if total >= recipe.corpus_bytes:
            break
        texts.append(text)
        used.append(rel)
        total += len(text.encode("utf-8", "ignore"))
    if say:
        say(f"{NAME}: training a {recipe.vocab}-token BPE tokenizer on {len(used)} stdlib "
            f"files ({total / 1e6:.1f} MB of {base})")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=recipe.vocab, special_tokens=[EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    eos = int(tok.token_to_id(EOS) or 0)

    def tokens(batch: list[str]) -> Any:
        ids: list[int] = []
        for enc in tok.encode_batch(batch):
            ids.extend(enc.ids)
            ids.append(eos)
        return torch.tensor(ids, dtype=torch.long)

    data = tokens(texts)
    held_data = tokens(_texts(base, held))
    torch.manual_seed(recipe.seed)
    model: Any = AutoModelForCausalLM.from_config(model_config)  # type: ignore[no-untyped-call]
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(recipe.seed)
    if say:
        say(f"{NAME}: pretraining the tiny shape for {recipe.steps} steps on "
            f"{len(data):,} tokens (cached afterwards)")
    losses: list[float] = []
    model.train()
    work = f"pretraining the target ({NAME})"
    if on_tick is not None:  # when the steps began, for the first rate and ETA
        on_tick(Tick(work=work, step=0, total=recipe.steps, tokens=0))
    for step in range(recipe.steps):
        frac = step / max(1, recipe.steps)
        lr = recipe.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))
        for group in opt.param_groups:
            group["lr"] = lr
        inputs, targets = _windows(data, recipe, gen)
        logits = model(input_ids=inputs).logits
        loss: Any = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                      targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if on_tick is not None:
            on_tick(Tick(work=work, step=step + 1, total=recipe.steps,
                         tokens=recipe.batch * recipe.length,
                         read=_loss_reader(losses[-1])))
    model.eval()
    held_loss = _loss(model, held_data, recipe)
    folder.mkdir(parents=True)
    model.save_pretrained(folder, safe_serialization=True)
    fast: Any = PreTrainedTokenizerFast
    fast(tokenizer_object=tok, eos_token=EOS).save_pretrained(folder)
    (folder / "corpus.json").write_text(json.dumps({
        "name": NAME, "root": str(base), "recipe": dataclasses.asdict(recipe),
        "train_files": used, "held_out_files": held, "train_tokens": len(data),
        "held_out_tokens": len(held_data), "bytes_per_token": total / max(1, len(data)),
        "train_loss_last_50": sum(losses[-50:]) / max(1, len(losses[-50:])),
        "held_out_loss": held_loss, "seconds": round(time.perf_counter() - started, 1),
    }, indent=1) + "\n")
    if say:
        say(f"{NAME}: held-out loss {held_loss:.3f} nats/token after "
            f"{time.perf_counter() - started:.0f} s; cached in {folder.parent}")


def _loss_reader(loss: float) -> Callable[[], Values]:
    return lambda: {"loss": loss}


def _windows(data: Any, recipe: Recipe, gen: Any) -> tuple[Any, Any]:
    """A batch of random windows of the training tokens: (inputs, next tokens)."""
    import torch

    starts = torch.randint(0, len(data) - recipe.length - 1, (recipe.batch,), generator=gen)
    rows = torch.stack([data[s:s + recipe.length + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def _loss(model: Any, data: Any, recipe: Recipe, windows: int = 64) -> float:
    """Mean next-token loss over evenly spread held-out windows."""
    import torch

    if len(data) <= recipe.length + 1:
        return float("nan")
    step = max(1, (len(data) - recipe.length - 1) // windows)
    starts = list(range(0, len(data) - recipe.length - 1, step))[:windows]
    rows = torch.stack([data[s:s + recipe.length + 1] for s in starts])
    with torch.no_grad():
        logits = model(input_ids=rows[:, :-1]).logits
    return float(torch.nn.functional.cross_entropy(
        logits.flatten(0, 1).float(), rows[:, 1:].flatten()))
