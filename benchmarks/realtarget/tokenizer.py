"""The tokenizer stage: a byte-level BPE learned from training files, the corpus encoded."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import time
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from realtarget.corpus import Doc, corpus_docs
from realtarget.run import BPE_SALT, EOS, Run, log, unit_hash


# -- tokenizer --------------------------------------------------------------------------------
def train_bpe(texts: Iterable[str], vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def hf_tokenizer(tok: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   model_max_length=10**6, clean_up_tokenization_spaces=False)


def save_tokenizer(tokenizer: Any, folder: Path) -> None:
    """save_pretrained, with the class named so that transformers 4.x loads it too (5.x
    writes its own TokenizersBackend, which 4.x lacks)."""
    tokenizer.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def token_dtype(vocab: int) -> type[np.unsignedinteger[Any]]:
    return np.uint16 if vocab <= 2**16 else np.uint32


# One tokenizer per worker process, over texts the workers inherit from the fork: the
# library's own batch parallelism stays on one core in some environments (lock contention
# in its thread pool), separate processes scale with the cores.
_POOL_TOKENIZER: Any = None
_POOL_DOCS: list[Doc] = []


def pool_state() -> tuple[Any, list[Doc]]:
    """(tokenizer, documents) of this worker process of :func:`tokenizer_pool`."""
    return _POOL_TOKENIZER, _POOL_DOCS


def _pool_init(tokenizer_json: str) -> None:
    global _POOL_TOKENIZER
    from tokenizers import Tokenizer

    _POOL_TOKENIZER = Tokenizer.from_str(tokenizer_json)


@contextlib.contextmanager
def tokenizer_pool(tokenizer_json: str, docs: list[Doc]) -> Iterator[ProcessPoolExecutor]:
    """Worker processes, each with the tokenizer; they see ``docs`` (forked, not copied)."""
    global _POOL_DOCS
    _POOL_DOCS = docs
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker, no fork warning
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: no CUDA
            with ProcessPoolExecutor(max_workers=os.cpu_count() or 1, mp_context=context,
                                     initializer=_pool_init,
                                     initargs=(tokenizer_json,)) as pool:
                yield pool
    finally:
        _POOL_DOCS = []


def _encode_range(task: tuple[int, int, int, str]
                  ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    start, stop, eos_id, dtype = task
    encode = getattr(_POOL_TOKENIZER, "encode_batch_fast", _POOL_TOKENIZER.encode_batch)
    parts, lengths = [], []
    for enc in encode([d.text for d in _POOL_DOCS[start:stop]]):
        ids = enc.ids
        ids.append(eos_id)
        parts.append(np.asarray(ids, dtype=dtype))
        lengths.append(len(ids))
    stream = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return stream, np.asarray(lengths, dtype=np.int64)


def ranges(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    """[start, stop) cut into pieces of ``size``."""
    return [(i, min(stop, i + size)) for i in range(start, stop, size)]


def encode_docs(pool: ProcessPoolExecutor, n_docs: int, eos_id: int, dtype: Any
                ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The pool's documents as one stream (EOS after each) and each one's token count."""
    tasks = [(a, b, eos_id, np.dtype(dtype).name) for a, b in ranges(0, n_docs, 64)]
    streams, lengths = zip(*pool.map(_encode_range, tasks), strict=True) if tasks else ((), ())
    if not streams:
        return np.zeros(0, dtype=dtype), np.zeros(0, dtype=np.int64)
    return np.concatenate(streams), np.concatenate(lengths)


def model_vocab(tokenizer_len: int) -> int:
    """Embedding rows: the tokenizer plus at least one spare row (dflash's MASK), rounded
    up to a multiple of 64."""
    return -(-(tokenizer_len + 1) // 64) * 64


def stage_tokenizer(run: Run) -> dict[str, Any]:
    docs = corpus_docs(run)
    train = [d for d in docs if d.split == "train"]
    held = [d for d in docs if d.split == "heldout"]
    sample, sample_bytes = [], 0
    for d in sorted(train, key=lambda d: unit_hash(BPE_SALT, d.rel)):
        if sample_bytes >= run.size.tokenizer_mb * 1e6:
            break
        sample.append(d.text)
        sample_bytes += len(d.text.encode("utf-8"))
    t0 = time.perf_counter()
    tok = train_bpe(sample, run.size.vocab)
    bpe_s = time.perf_counter() - t0
    hf = hf_tokenizer(tok)
    save_tokenizer(hf, run.work / "tokenizer")
    eos_id = tok.token_to_id(EOS)
    vocab = model_vocab(len(hf))
    dtype = token_dtype(vocab)
    log("tokenizer", f"BPE of {len(hf)} tokens from {sample_bytes / 1e6:.1f} MB in "
                     f"{bpe_s:.1f} s; encoding")
    t0 = time.perf_counter()
    tokens = run.work / "tokens"
    tokens.mkdir(parents=True, exist_ok=True)
    stats: dict[str, Any] = {}
    for name, part in (("train", train), ("heldout", held)):
        with tokenizer_pool(tok.to_str(), part) as pool:
            stream, lengths = encode_docs(pool, len(part), eos_id, dtype)
        np.save(tokens / f"{name}.npy", stream)
        np.save(tokens / f"{name}_lengths.npy", lengths)
        nbytes = sum(len(d.text.encode("utf-8")) for d in part)
        stats[name] = {"files": len(part), "bytes": nbytes, "tokens": int(stream.size),
                       "bytes_per_token": nbytes / max(1, stream.size)}
        run.memo[f"tokens_{name}"] = stream
    enc_s = time.perf_counter() - t0
    run.memo[f"tokenizer:{run.work / 'tokenizer'}"] = hf
    total_bytes = stats["train"]["bytes"] + stats["heldout"]["bytes"]
    return {"kind": "byte-level BPE (tokenizers), GPT-2 pre-tokenizer regex, no BOS, no "
                    "chat template", "tokenizer_vocab": len(hf), "requested_vocab":
            run.size.vocab, "model_vocab": vocab, "eos_id": eos_id, "pad_id": eos_id,
            "mask_id_dflash_picks": len(hf), "token_dtype": np.dtype(dtype).name,
            "bpe_training": {"files": len(sample), "bytes": sample_bytes, "seconds": bpe_s,
                             "from": "training files only"},
            "encode_seconds": enc_s, "encode_mb_per_s": total_bytes / 1e6 / max(enc_s, 1e-9),
            "encode_processes": os.cpu_count(), **stats}


