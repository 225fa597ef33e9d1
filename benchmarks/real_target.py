"""A real small target for the DFlash experiments, trained here from the Python source on
the machine (no downloads): a byte-level BPE tokenizer and a Qwen3-architecture causal LM.

    python benchmarks/real_target.py --out runs/real --size tiny --minutes 0.2   # CPU smoke
    python benchmarks/real_target.py --out $OUT --work /tmp/rt --minutes 3 --size small

Stages (``--stages``, run in this order; each writes ``OUT/<stage>.json`` as soon as it
finishes, so a run cut short still returns what it measured):

corpus     every ``*.py`` under the corpus roots (default: the standard library and the
           site-packages folders), minus unreadable, generated-looking and duplicate
           files, split by FILE into train and held-out by a hash of the relative path
           (``stdlib/json/decoder.py``); ``WORK/manifest.json`` lists each file and split.
tokenizer  a byte-level BPE (``tokenizers``) trained on training files only; the corpus
           encoded to ``WORK/tokens/{train,heldout}.npy`` (one document per file, each
           followed by ``<|endoftext|>``).
pretrain   a ``Qwen3ForCausalLM`` from scratch for ``--minutes`` of training wall-clock
           (AdamW, warm-up + cosine on the clock, bf16 autocast on GPU, random windows of
           the training stream); saved with its tokenizer as the Hugging Face folder
           ``WORK/target`` (eos = pad = ``<|endoftext|>``, no chat template, spare
           embedding rows past the tokenizer, the first of which dflash takes as MASK).
heldout    ``WORK/target`` reloaded with AutoModelForCausalLM/AutoTokenizer: loss in
           nats/token, bits/byte and top-1 accuracy on tokens of held-out files (per
           corpus root, and on as many training tokens for the gap).
prompts    fixed-length code prefixes that end at a function signature's colon:
           ``WORK/prompts-eval.jsonl`` from held-out files, ``WORK/prompts-train.jsonl``
           from training files; rows ``{"prompt_ids": [...], "prompt": text, "source",
           "line", "reference"}`` (``dflash.data`` reads ``prompt_ids``; equal lengths so
           ``dflash-generate`` batches them). Also the target's greedy continuations of
           the eval prompts and the n-gram drafter's exact tau on them.

generate   ``dflash-generate``: the target's own greedy responses (``--gen-new-tokens``)
           to the first ``--gen-prompts`` TRAINING prompts, ``WORK/train-data.jsonl``
           (the paper's training data); also how repetitive they are and the n-gram
           drafter's exact tau on a sample of them.
probe      a short ``dflash-train`` run of the train stage's recipe (``--probe-steps``):
           its step time turns ``--drafter-seconds`` into a step count, and its export
           is the config of the untrained drafter the eval stage measures.
train      ``dflash-train``: a DFlash drafter (``--drafter-layers``, block 16, gamma 7,
           AdamW 6e-4 with 4 % warm-up and cosine to 0: the paper's recipe) on
           WORK/train-data.jsonl for the probed step count, checkpoints at 1/3 and 2/3 of
           it (each one a drafter folder ``dflash-eval`` reads), held-out tau in the
           metrics; a run that reaches ``--deadline-s`` is stopped by SIGTERM and keeps
           its checkpoint.
eval       ``dflash-eval`` on the held-out EVAL prompts, temperature 0, the same prompts,
           lengths and draft cap (15) for each of ``--eval-drafters``: ``ngram``,
           ``untrained`` (the trained drafter's config, fresh weights), ``trained``, and
           ``checkpoints`` (the train stage's intermediate checkpoints, on
           ``--checkpoint-prompts`` prompts). Results of an earlier process (another
           machine call on the same WORK) are kept: OUT/eval.json holds every drafter
           measured so far.

A later stage is one function ``(Run) -> dict`` added to ``STAGES``; :func:`run_cli`
runs a project command (``dflash-generate``, ``dflash-train``, ``dflash-eval``) as a
subprocess for such a stage. ``--stages`` can resume from a finished stage: each stage
reads what the earlier ones left in OUT and WORK (every stage result is also kept in
``WORK/results/``, so a later process with an empty OUT resumes too).

Three machine calls on one WORK, each within the machine's warm window after the last
(what was run for docs/bench/real-target/drafter-2/, run 2 of BENCHMARKS' "Drafter
quality"):

    python3 benchmarks/real_target.py --out $OUT --work /tmp/rt --size small \
        --minutes 7 --deadline-s 520 --reserve-s 70 \
        --stages corpus,tokenizer,pretrain,heldout,prompts
    python3 benchmarks/real_target.py --out $OUT --work /tmp/rt --size small \
        --stages generate,probe,train --gen-batch 1024 --deadline-s 510 \
        --train-reserve-s 20 --train-startup-s 40
    python3 benchmarks/real_target.py --out $OUT --work /tmp/rt --size small \
        --stages eval --eval-dtype float32 --deadline-s 455

Budget the eval stage first: eager batch-1 decoding of this target runs at about 100
tokens/s on the H200, so one drafter on 24 prompts x 192 tokens takes about 70 s
(target-only and speculative), an untrained one (tau 1) on 8 prompts about 55 s.
"""

from __future__ import annotations

import argparse
import ast
import bisect
import contextlib
import hashlib
import json
import math
import multiprocessing
import os
import re
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

STARTED = time.monotonic()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EOS = "<|endoftext|>"
SPLIT_SALT = "real-target-split-v1:"
ORDER_SALT = "real-target-order-v1:"
PROMPT_SALT = "real-target-prompt-v1:"
BPE_SALT = "real-target-bpe-v1:"
PRUNED_DIRS = {"__pycache__", "site-packages", "dist-packages"}
"""Never walked into: caches, and the package folders of another interpreter inside a
root (a base interpreter's site-packages under its stdlib); package roots are their own
roots."""
DENSE_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4}
"""Datasheet dense bf16 of the SXM parts; the MFU denominator unless --peak-tflops."""


# -- sizes ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Size:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    """BPE vocabulary (with the EOS token); the embedding is padded past it."""
    seq_len: int
    micro_batch: int
    accum: int
    lr: float
    tokenizer_mb: float
    """Training text the BPE learns from."""
    max_corpus_mb: float | None
    eval_tokens: int
    prompt_tokens: int
    train_prompts: int
    eval_prompts: int
    sample_tokens: int
    """New tokens of the greedy continuations of the eval prompts."""
    eval_every_s: float
    log_every: int


SIZES: dict[str, Size] = {
    # 8 layers so that dflash's default 5 tapped layers exist; seconds on a laptop CPU.
    "tiny": Size(hidden=64, layers=8, heads=4, kv_heads=2, head_dim=16, intermediate=192,
                 vocab=1024, seq_len=128, micro_batch=8, accum=1, lr=3e-3, tokenizer_mb=2,
                 max_corpus_mb=4, eval_tokens=16_384, prompt_tokens=32, train_prompts=64,
                 eval_prompts=16, sample_tokens=16, eval_every_s=5, log_every=10),
    # ~95 M parameters (tied embeddings): GPT-2-small-like, GQA 12/4.
    "small": Size(hidden=768, layers=12, heads=12, kv_heads=4, head_dim=64,
                  intermediate=2048, vocab=16_000, seq_len=1024, micro_batch=64, accum=2,
                  lr=1.5e-3, tokenizer_mb=48, max_corpus_mb=512, eval_tokens=2**21,
                  prompt_tokens=256, train_prompts=16384, eval_prompts=256, sample_tokens=64,
                  eval_every_s=30, log_every=20),
    # ~270 M parameters.
    "base": Size(hidden=1024, layers=20, heads=16, kv_heads=8, head_dim=64,
                 intermediate=2816, vocab=32_000, seq_len=1024, micro_batch=32, accum=8,
                 lr=1e-3, tokenizer_mb=64, max_corpus_mb=1024, eval_tokens=2**21,
                 prompt_tokens=256, train_prompts=8192, eval_prompts=256, sample_tokens=64,
                 eval_every_s=60, log_every=10),
}


# -- the run and its stages -------------------------------------------------------------------
@dataclass
class Run:
    args: argparse.Namespace
    size: Size
    out: Path
    """The stage results (small JSON files)."""
    work: Path
    """The bulky artifacts: tokens, the target folder, prompt sets."""
    device: torch.device
    memo: dict[str, Any] = field(default_factory=dict)
    """Objects the stages of one process share instead of re-reading them."""

    def result(self, stage: str) -> dict[str, Any]:
        """The result of an earlier stage, of this process or an earlier one (OUT, else
        WORK/results, where every result is kept too)."""
        for path in (self.out / f"{stage}.json", self.results / f"{stage}.json"):
            if path.exists():
                data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
                return data
        raise SystemExit(f"real_target: stage {stage!r} has not run in {self.out} "
                         f"or {self.results}")

    def has_result(self, stage: str) -> bool:
        return any((d / f"{stage}.json").exists() for d in (self.out, self.results))

    @property
    def results(self) -> Path:
        return self.work / "results"

    def save_result(self, stage: str, data: dict[str, Any]) -> None:
        write_json_atomic(self.out / f"{stage}.json", data)
        write_json_atomic(self.results / f"{stage}.json", data)

    def seconds_left(self) -> float:
        """Seconds to ``--deadline-s`` (counted from the script's start); inf without."""
        if self.args.deadline_s is None:
            return math.inf
        return float(self.args.deadline_s - (time.monotonic() - STARTED))

    @property
    def target_dir(self) -> Path:
        return self.work / "target"

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.device.type == "cuda" else torch.float32


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    run: Callable[[Run], dict[str, Any]]


def log(stage: str, message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {stage}: {message}", flush=True)


def write_json_atomic(path: Path, data: Any, *, indent: int | None = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=indent, default=str, allow_nan=False)
        fh.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_jsonl_atomic(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, allow_nan=False) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def run_cli(run: Run, name: str, argv: Sequence[str], *, timeout: float | None = None,
            echo: bool = False, grace_s: float = 60.0) -> dict[str, Any]:
    """Run a command for a pipeline stage, e.g. ``[sys.executable, "-m",
    "dflash.cli.evaluate", "--drafter", ..., "--json"]``, from the repository root.

    stderr (the commands' progress) passes through live; stdout is collected (and echoed
    with ``echo``) and written to ``WORK/<name>.log``. After ``timeout`` seconds the
    command gets SIGTERM (dflash-train then checkpoints and exits), after ``grace_s``
    more SIGKILL. Returns rc, seconds, the command, whether it was stopped, the output's
    tail, and the parsed JSON when stdout is one JSON document."""
    import signal
    import threading

    logfile = run.work / f"{name}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    log(name, " ".join(argv))
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(argv), cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)
    stopped: list[str] = []

    def stop() -> None:
        if proc.poll() is None:
            stopped.append("SIGTERM")
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                stopped.append("SIGKILL")
                proc.kill()

    timer = threading.Timer(timeout, stop) if timeout is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if echo:
            print(f"  {name}| {line}", end="", flush=True)
    rc = proc.wait()
    if timer is not None:
        timer.cancel()
    out = "".join(lines)
    logfile.write_text(out, encoding="utf-8")
    result: dict[str, Any] = {"argv": list(argv), "rc": rc,
                              "seconds": time.perf_counter() - t0, "log": str(logfile),
                              "stopped": stopped, "tail": out[-3000:]}
    with contextlib.suppress(ValueError):
        result["json"] = json.loads(out)
        result["tail"] = ""
    log(name, f"rc {rc} in {result['seconds']:.1f} s" + (f" (stopped: {stopped})"
                                                           if stopped else ""))
    return result


def unit_hash(salt: str, text: str) -> float:
    """A deterministic number in [0, 1) for ``text``, the same on every machine."""
    digest = hashlib.sha256((salt + text).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


# -- corpus -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CorpusRoot:
    label: str
    path: str


@dataclass(frozen=True, slots=True)
class Candidate:
    rel: str
    """``<root label>/<path inside the root>``: what the split hashes."""
    path: str
    size: int


@dataclass(frozen=True, slots=True)
class Doc:
    rel: str
    split: str
    text: str


def default_root_paths() -> list[str]:
    paths = [sysconfig.get_paths()["stdlib"], *site.getsitepackages(),
             sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    user = site.getusersitepackages()
    return [*paths, user] if isinstance(user, str) else paths


def label_roots(paths: Sequence[str]) -> list[CorpusRoot]:
    """Existing folders, each once (by real path); labels ``stdlib``, then folder names."""
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    seen: set[str] = set()
    roots: list[CorpusRoot] = []
    labels: Counter[str] = Counter()
    for raw in paths:
        real = os.path.realpath(raw)
        if real in seen or not os.path.isdir(real):
            continue
        seen.add(real)
        base = "stdlib" if real == stdlib else os.path.basename(real.rstrip("/")) or "root"
        labels[base] += 1
        label = base if labels[base] == 1 else f"{base}-{labels[base]}"
        roots.append(CorpusRoot(label, real))
    return roots


def scan_root(root: CorpusRoot, other_roots: set[str]) -> Iterator[Candidate]:
    for dirpath, dirnames, filenames in os.walk(root.path):
        dirnames[:] = sorted(d for d in dirnames if d not in PRUNED_DIRS
                             and os.path.join(dirpath, d) not in other_roots)
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if not name.endswith(".py") or os.path.islink(full):
                continue
            try:
                size = os.stat(full).st_size
            except OSError:
                continue
            rel = os.path.relpath(full, root.path).replace(os.sep, "/")
            yield Candidate(f"{root.label}/{rel}", full, size)


def read_source(path: str, max_bytes: int, max_line: int) -> tuple[str | None, str]:
    """The file's text, or None and why it is left out."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None, "unreadable"
    if not raw.strip():
        return None, "empty"
    if len(raw) > max_bytes:
        return None, "too_large"
    if b"\0" in raw:
        return None, "nul_bytes"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not_utf8"
    if max(map(len, text.split("\n"))) > max_line:
        return None, "long_lines"  # generated tables, embedded blobs
    return text, "ok"


def split_of(rel: str, fraction: float) -> str:
    return "heldout" if unit_hash(SPLIT_SALT, rel) < fraction else "train"


def select_docs(candidates: list[Candidate], *, cap_bytes: float, fraction: float,
                max_bytes: int, max_line: int) -> tuple[list[Doc], list[dict[str, Any]],
                                                        Counter[str], dict[str, list[str]]]:
    """Read candidates in hash order until ``cap_bytes`` of kept text; drop duplicates
    (the first copy in that order stays, with its own split)."""
    order = sorted(candidates, key=lambda c: unit_hash(ORDER_SALT, c.rel))
    docs: list[Doc] = []
    entries: list[dict[str, Any]] = []
    reasons: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    seen: set[str] = set()
    kept = 0
    with ThreadPoolExecutor(max_workers=min(32, (os.cpu_count() or 1) * 2)) as pool:
        for start in range(0, len(order), 512):
            if kept >= cap_bytes:
                reasons["over_cap"] += len(order) - start
                break
            chunk = order[start:start + 512]
            texts = pool.map(lambda c: read_source(c.path, max_bytes, max_line), chunk)
            for i, (cand, (text, why)) in enumerate(zip(chunk, texts, strict=True)):
                if kept >= cap_bytes:
                    reasons["over_cap"] += len(chunk) - i
                    break
                digest = hashlib.sha1(text.encode("utf-8")).hexdigest() if text else ""
                if text is not None and digest in seen:
                    why = "duplicate"
                if why != "ok" or text is None:
                    reasons[why] += 1
                    if len(examples.setdefault(why, [])) < 10:
                        examples[why].append(cand.rel)
                    continue
                seen.add(digest)
                split = split_of(cand.rel, fraction)
                docs.append(Doc(cand.rel, split, text))
                entries.append({"path": cand.rel, "bytes": len(text.encode("utf-8")),
                                "split": split, "sha1": digest})
                kept += entries[-1]["bytes"]
    return docs, entries, reasons, examples


def check_split(entries: list[dict[str, Any]]) -> dict[str, int]:
    """No held-out file (by path or by content) is a training file."""
    by_split: dict[str, set[str]] = {"train": set(), "heldout": set()}
    sha: dict[str, set[str]] = {"train": set(), "heldout": set()}
    for e in entries:
        by_split[e["split"]].add(e["path"])
        sha[e["split"]].add(e["sha1"])
    assert not by_split["train"] & by_split["heldout"], "a file is in both splits"
    assert not sha["train"] & sha["heldout"], "a held-out file's content is in training"
    assert by_split["heldout"], "no held-out files: raise --heldout-fraction"
    return {"train_files": len(by_split["train"]), "heldout_files": len(by_split["heldout"])}


def stage_corpus(run: Run) -> dict[str, Any]:
    roots = label_roots(run.args.corpus_root or default_root_paths())
    if not roots:
        raise SystemExit("real_target: no corpus root exists")
    real_roots = {r.path for r in roots}
    candidates: list[Candidate] = []
    found: dict[str, dict[str, Any]] = {}
    for root in roots:
        files = list(scan_root(root, real_roots - {root.path}))
        found[root.label] = {"path": root.path, "py_files": len(files),
                             "py_bytes": sum(c.size for c in files)}
        candidates.extend(files)
    log("corpus", f"{len(candidates)} .py files, {sum(c.size for c in candidates) / 1e6:.0f} MB"
                  f" under {[r.path for r in roots]}")
    cap_mb = run.args.max_corpus_mb if run.args.max_corpus_mb is not None \
        else run.size.max_corpus_mb
    docs, entries, reasons, examples = select_docs(
        candidates, cap_bytes=math.inf if cap_mb is None else cap_mb * 1e6,
        fraction=run.args.heldout_fraction, max_bytes=run.args.max_file_kb * 1024,
        max_line=run.args.max_line)
    counts = check_split(entries)
    run.memo["docs"] = docs
    per_root: dict[str, dict[str, int]] = {}
    for e in entries:
        r = per_root.setdefault(e["path"].split("/", 1)[0],
                                {"files": 0, "bytes": 0, "heldout_files": 0})
        r["files"] += 1
        r["bytes"] += e["bytes"]
        r["heldout_files"] += e["split"] == "heldout"
    split_bytes = Counter[str]()
    for e in entries:
        split_bytes[e["split"]] += e["bytes"]
    rule = (f"held out iff int(sha256('{SPLIT_SALT}' + path)[:8 bytes]) / 2**64 < "
            f"{run.args.heldout_fraction}; path = '<root label>/<path in root>'")
    write_json_atomic(run.work / "manifest.json", {
        "roots": {r.label: r.path for r in roots}, "split_rule": rule,
        "order_rule": f"files read in order of sha256('{ORDER_SALT}' + path) until the cap",
        "files": entries}, indent=None)
    return {"roots": found, "kept": per_root, "files": len(entries),
            "bytes": sum(split_bytes.values()), "train_bytes": split_bytes["train"],
            "heldout_bytes": split_bytes["heldout"], **counts,
            "left_out": dict(reasons), "left_out_examples": examples,
            "max_corpus_mb": cap_mb, "heldout_fraction": run.args.heldout_fraction,
            "split_rule": rule, "checks": "no path or content in both splits (asserted)"}


def corpus_docs(run: Run) -> list[Doc]:
    """The kept files, from this process or re-read through WORK/manifest.json."""
    if "docs" not in run.memo:
        manifest = json.loads((run.work / "manifest.json").read_text(encoding="utf-8"))
        docs = []
        for e in manifest["files"]:
            label, rest = e["path"].split("/", 1)
            text = Path(manifest["roots"][label], rest).read_bytes().decode("utf-8")
            if hashlib.sha1(text.encode("utf-8")).hexdigest() != e["sha1"]:
                raise SystemExit(f"real_target: {e['path']} changed since the corpus stage")
            docs.append(Doc(e["path"], e["split"], text))
        run.memo["docs"] = docs
    docs_: list[Doc] = run.memo["docs"]
    return docs_


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


# -- the model --------------------------------------------------------------------------------
def qwen3_config(size: Size, vocab: int, eos_id: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(  # type: ignore[call-arg]
        vocab_size=vocab, hidden_size=size.hidden, intermediate_size=size.intermediate,
        num_hidden_layers=size.layers, num_attention_heads=size.heads,
        num_key_value_heads=size.kv_heads, head_dim=size.head_dim, rope_theta=10_000.0,
        rms_norm_eps=1e-6, max_position_embeddings=size.seq_len, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=eos_id, use_cache=True)


def build_model(size: Size, vocab: int, eos_id: int, device: torch.device, seed: int) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(qwen3_config(size, vocab, eos_id),
                                             attn_implementation="sdpa", dtype=torch.float32)
    return model.to(device)


def param_counts(model: Any) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())  # tied weights counted once
    embedding = model.get_input_embeddings().weight.numel()
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding}


def flops_per_token(model: Any, size: Size) -> float:
    """Training FLOPs per token: 6 x (every matmul weight, the LM head included) plus
    causal attention, 6 x layers x seq x heads x head_dim (QK^T and AV, half the keys on
    average, forward and backward)."""
    layer_matmuls = sum(m.weight.numel() for m in model.get_decoder().layers.modules()
                        if isinstance(m, torch.nn.Linear))
    head = model.get_output_embeddings().weight.numel()
    attention = 6 * size.layers * size.seq_len * size.heads * size.head_dim
    return 6.0 * (layer_matmuls + head) + attention


def peak_tflops(run: Run) -> float | None:
    if run.args.peak_tflops:
        return float(run.args.peak_tflops)
    if run.device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(run.device)
    return next((v for k, v in DENSE_BF16_TFLOPS.items() if k in name), None)


def matmul_tflops(device: torch.device, n: int = 8192, iters: int = 10) -> float | None:
    """The bf16 dense matmul rate this GPU reaches (random data), for a second MFU."""
    if device.type != "cuda":
        return None
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    sync(device)
    return 2 * n**3 * iters / (time.perf_counter() - t0) / 1e12


def optimizer_for(model: Any, lr: float, device: torch.device) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8,
                             fused=device.type == "cuda")


def lr_at(frac: float, peak: float, warmup: float = 0.05, floor: float = 0.1) -> float:
    """Linear warm-up over the first ``warmup`` of the budget, then cosine to
    ``floor * peak``; ``frac`` is the fraction of the training clock spent."""
    if frac < warmup:
        return peak * max(frac, 1e-3) / warmup
    progress = min(1.0, (frac - warmup) / (1 - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def autocast(run: Run) -> Any:
    return torch.autocast(run.device.type, dtype=torch.bfloat16,
                          enabled=run.device.type == "cuda")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stream_tensor(run: Run, name: str) -> torch.Tensor:
    """WORK/tokens/<name>.npy as int32 on the device (the window gather runs there)."""
    arr = run.memo.get(f"tokens_{name}")
    if arr is None:
        arr = np.load(run.work / "tokens" / f"{name}.npy")
    return torch.from_numpy(np.asarray(arr, dtype=np.int32)).to(run.device)


def random_windows(data: torch.Tensor, n: int, length: int, gen: torch.Generator
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, data.numel() - length - 1, (n,), device=data.device,
                           generator=gen)
    win = data[starts[:, None] + torch.arange(length + 1, device=data.device)].long()
    return win[:, :-1], win[:, 1:]


def window_starts(numel: int, n: int, length: int) -> torch.Tensor:
    """Starts of ``n`` windows of ``length + 1`` tokens spread evenly over a stream (at
    most as many as fit without overlap), on the CPU."""
    n = max(1, min(n, (numel - 1) // length))
    last = numel - length - 1
    return torch.tensor([i * last // max(1, n - 1) for i in range(n)], dtype=torch.long)


def spread_windows(data: torch.Tensor, n: int, length: int) -> torch.Tensor:
    starts = window_starts(data.numel(), n, length).to(data.device)
    return data[starts[:, None] + torch.arange(length + 1, device=data.device)].long()


@torch.no_grad()
def token_losses(model: Any, windows: torch.Tensor, batch: int, run: Run
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss (nats) and top-1 hit of every next-token prediction, flattened."""
    losses, hits = [], []
    for start in range(0, windows.shape[0], batch):
        w = windows[start:start + batch]
        with autocast(run):
            logits = model(input_ids=w[:, :-1], use_cache=False).logits
        logits = logits.float()
        losses.append(F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(),
                                      reduction="none"))
        hits.append((logits.argmax(-1) == w[:, 1:]).flatten())
    return torch.cat(losses), torch.cat(hits)


@dataclass
class TrainState:
    step: int = 0
    tokens: int = 0
    train_s: float = 0.0
    eval_s: float = 0.0
    curve: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    marks: list[tuple[float, int]] = field(default_factory=list)
    """(train clock, tokens) at each synchronised log point."""


def _train_step(run: Run, model: Any, opt: torch.optim.Optimizer, data: torch.Tensor,
                gen: torch.Generator, lr: float) -> torch.Tensor:
    size = run.size
    for group in opt.param_groups:
        group["lr"] = lr
    total = torch.zeros((), device=run.device)
    for _ in range(size.accum):
        x, y = random_windows(data, size.micro_batch, size.seq_len, gen)
        with autocast(run):
            logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten()) / size.accum
        loss.backward()
        total += loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return total


def _quick_eval(run: Run, model: Any, windows: torch.Tensor, st: TrainState) -> None:
    t0 = time.perf_counter()
    model.eval()
    loss, hit = token_losses(model, windows, run.size.micro_batch, run)
    model.train()
    st.evals.append({"step": st.step, "tokens": st.tokens, "train_s": st.train_s,
                     "heldout_loss": float(loss.mean()), "heldout_top1": float(hit.float()
                                                                                  .mean())})
    st.eval_s += time.perf_counter() - t0
    log("pretrain", f"step {st.step}: held-out loss {st.evals[-1]['heldout_loss']:.3f}")


def train_for(run: Run, model: Any, data: torch.Tensor, quick: torch.Tensor, budget_s: float
              ) -> TrainState:
    """Train until the training clock (eval pauses excluded) reaches ``budget_s``."""
    size = run.size
    opt = optimizer_for(model, size.lr, run.device)
    gen = torch.Generator(device=run.device).manual_seed(run.args.seed + 1)
    st = TrainState()
    model.train()
    pending: list[torch.Tensor] = []
    last_eval = 0.0
    sync(run.device)
    start = time.perf_counter()
    while True:
        st.train_s = time.perf_counter() - start - st.eval_s
        if st.train_s >= budget_s:
            break
        lr = lr_at(st.train_s / budget_s, size.lr)
        pending.append(_train_step(run, model, opt, data, gen, lr))
        st.step += 1
        st.tokens += size.micro_batch * size.accum * size.seq_len
        if st.step % size.log_every == 0 or st.step == 1:
            losses = torch.stack(pending).tolist()  # synchronises
            pending.clear()
            st.train_s = time.perf_counter() - start - st.eval_s
            st.marks.append((st.train_s, st.tokens))
            st.curve.append({"step": st.step, "tokens": st.tokens, "train_s": st.train_s,
                             "loss": sum(losses) / len(losses), "lr": lr})
            log("pretrain", f"step {st.step} tokens {st.tokens / 1e6:.1f}M loss "
                            f"{st.curve[-1]['loss']:.3f} lr {lr:.2e} "
                            f"{st.tokens / st.train_s / 1e3:.0f}k tok/s")
        if st.train_s - last_eval >= size.eval_every_s:
            _quick_eval(run, model, quick, st)
            last_eval = st.train_s
    sync(run.device)
    st.train_s = time.perf_counter() - start - st.eval_s
    st.marks.append((st.train_s, st.tokens))
    _quick_eval(run, model, quick, st)
    del opt
    return st


def steady_tokens_per_s(marks: list[tuple[float, int]]) -> float | None:
    """Tokens/s between the log point a fifth into training and the end (start-up and
    the first allocations excluded)."""
    if len(marks) < 3:
        return None
    end_s, end_tok = marks[-1]
    first = next((m for m in marks if m[0] >= end_s / 5), marks[1])
    if end_s <= first[0]:
        return None
    return (end_tok - first[1]) / (end_s - first[0])


def save_target(run: Run, model: Any, tokenizer: Any) -> dict[str, Any]:
    folder = run.target_dir
    eos = tokenizer.eos_token_id
    for cfg in (model.config, getattr(model, "generation_config", None)):
        if cfg is not None:
            cfg.eos_token_id, cfg.pad_token_id = eos, eos
    model.to(run.compute_dtype).save_pretrained(folder)
    save_tokenizer(tokenizer, folder)
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir())}
    return {"folder": str(folder), "dtype": str(run.compute_dtype).removeprefix("torch."),
            "files": files}


def load_hf_tokenizer(run: Run, folder: Path) -> Any:
    """AutoTokenizer of ``folder``, loaded once per process."""
    from transformers import AutoTokenizer

    key = f"tokenizer:{folder}"
    if key not in run.memo:
        run.memo[key] = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return run.memo[key]


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def training_budget(run: Run) -> float:
    """``--minutes``, cut so that the run can still end by ``--deadline-s`` (counted from
    the start of the script) with ``--reserve-s`` left for saving and the later stages."""
    budget = run.args.minutes * 60
    if run.args.deadline_s is not None:
        left = run.args.deadline_s - (time.monotonic() - STARTED) - run.args.reserve_s
        if left < budget:
            log("pretrain", f"--deadline-s leaves {left:.0f} s of the {budget:.0f} s asked")
            budget = max(1.0, left)
    return budget


def stage_pretrain(run: Run) -> dict[str, Any]:
    size = run.size
    tokenizer = load_hf_tokenizer(run, run.work / "tokenizer")
    vocab = model_vocab(len(tokenizer))
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    data = stream_tensor(run, "train")
    quick = spread_windows(stream_tensor(run, "heldout"), 32, size.seq_len)
    model = build_model(size, vocab, tokenizer.eos_token_id, run.device, run.args.seed)
    counts = param_counts(model)
    fpt = flops_per_token(model, size)
    log("pretrain", f"Qwen3 {counts['total'] / 1e6:.1f}M params "
                    f"({counts['non_embedding'] / 1e6:.1f}M non-embedding), "
                    f"{data.numel() / 1e6:.1f}M training tokens")
    if run.args.compile == "on":
        model = torch.compile(model)
    measured = matmul_tflops(run.device)
    budget = training_budget(run)
    st = train_for(run, model, data, quick, budget)
    peak = peak_tflops(run)
    mean_tps = st.tokens / st.train_s
    steady = steady_tokens_per_s(st.marks)
    result: dict[str, Any] = {
        "architecture": "Qwen3ForCausalLM", "params": counts, "size": run.args.size,
        "shape": asdict(size), "model_vocab": vocab, "flops_per_token": fpt,
        "compile": run.args.compile, "device": str(run.device),
        "gpu": torch.cuda.get_device_name(run.device) if run.device.type == "cuda" else None,
        "torch": torch.__version__, "transformers": _version("transformers"),
        "tokenizers": _version("tokenizers"), "budget_s": budget,
        "minutes_asked": run.args.minutes, "deadline_s": run.args.deadline_s,
        "steps": st.step, "tokens": st.tokens, "epochs": st.tokens / data.numel(),
        "batch_tokens": size.micro_batch * size.accum * size.seq_len,
        "train_seconds": st.train_s, "eval_pause_seconds": st.eval_s,
        "tokens_per_s": mean_tps, "tokens_per_s_steady": steady,
        "peak_tflops": peak, "mfu": fpt * mean_tps / (peak * 1e12) if peak else None,
        "mfu_steady": fpt * steady / (peak * 1e12) if peak and steady else None,
        "matmul_tflops_measured": measured,
        "mfu_steady_vs_measured_matmul": fpt * steady / (measured * 1e12)
        if measured and steady else None,
        "final_train_loss": st.curve[-1]["loss"] if st.curve else None,
        "final_heldout_loss_quick": st.evals[-1]["heldout_loss"],
        "optimizer": {"name": "AdamW", "lr": size.lr, "betas": [0.9, 0.95],
                      "weight_decay": 0.1, "grad_clip": 1.0,
                      "schedule": "linear warm-up 5% then cosine to 10%, on the training "
                                  "clock"},
        "curve": st.curve, "heldout_quick": st.evals,
        "quick_eval_tokens": int(quick.shape[0] * size.seq_len)}
    if run.device.type == "cuda":
        result["max_memory_gib"] = torch.cuda.max_memory_allocated(run.device) / 2**30
    result["saved"] = save_target(run, getattr(model, "_orig_mod", model), tokenizer)
    del model, data
    if run.device.type == "cuda":
        torch.cuda.empty_cache()
    return result


# -- held-out evaluation --------------------------------------------------------------------
def load_target_model(run: Run) -> Any:
    from transformers import AutoModelForCausalLM

    if "target" not in run.memo:
        model = AutoModelForCausalLM.from_pretrained(run.target_dir, dtype=run.compute_dtype,
                                                     local_files_only=True)
        run.memo["target"] = model.to(run.device).eval()
    return run.memo["target"]


def _summary(loss: torch.Tensor, hit: torch.Tensor, bytes_per_token: float) -> dict[str, float]:
    mean = float(loss.mean())
    return {"tokens": int(loss.numel()), "loss": mean, "top1": float(hit.float().mean()),
            "bits_per_byte": mean / math.log(2) / bytes_per_token}


def _root_of_tokens(run: Run, name: str, docs: list[Doc]) -> np.ndarray[Any, Any]:
    lengths = np.load(run.work / "tokens" / f"{name}_lengths.npy")
    labels = sorted({d.rel.split("/", 1)[0] for d in docs})
    index = np.asarray([labels.index(d.rel.split("/", 1)[0]) for d in docs], dtype=np.int16)
    run.memo.setdefault("root_labels", {})[name] = labels
    return np.repeat(index, lengths)


def stage_heldout(run: Run) -> dict[str, Any]:
    size = run.size
    tok_stats = run.result("tokenizer")
    tokenizer = load_hf_tokenizer(run, run.target_dir)
    model = load_target_model(run)
    docs = corpus_docs(run)
    held_docs = [d for d in docs if d.split == "heldout"]
    held = stream_tensor(run, "heldout")
    train = stream_tensor(run, "train")
    n_windows = max(1, size.eval_tokens // size.seq_len)
    t0 = time.perf_counter()
    windows = spread_windows(held, n_windows, size.seq_len)
    loss, hit = token_losses(model, windows, size.micro_batch * 2, run)
    sync(run.device)
    seconds = time.perf_counter() - t0
    t_loss, t_hit = token_losses(model, spread_windows(train, windows.shape[0], size.seq_len),
                                 size.micro_batch * 2, run)
    # Which corpus root each evaluated (predicted) token comes from.
    roots = _root_of_tokens(run, "heldout", held_docs)
    starts = window_starts(held.numel(), n_windows, size.seq_len)
    pos = (starts[:, None] + torch.arange(1, size.seq_len + 1)).flatten().numpy()
    token_root = roots[np.minimum(pos, len(roots) - 1)]
    by_root: dict[str, dict[str, float]] = {}
    for i, label in enumerate(run.memo["root_labels"]["heldout"]):
        sel = torch.from_numpy(token_root == i).to(loss.device)
        if bool(sel.any()):
            by_root[label] = _summary(loss[sel], hit[sel],
                                      tok_stats["heldout"]["bytes_per_token"])
    sample = held_docs[0].text[:20_000]
    roundtrip = tokenizer.decode(tokenizer.encode(sample, add_special_tokens=False)) == sample
    assert roundtrip, "the saved tokenizer does not round-trip a held-out file"
    vocab = model.get_input_embeddings().weight.shape[0]
    return {
        "heldout": _summary(loss, hit, tok_stats["heldout"]["bytes_per_token"]),
        "train_same_count": _summary(t_loss, t_hit, tok_stats["train"]["bytes_per_token"]),
        "generalisation_gap_nats": float(loss.mean() - t_loss.mean()),
        "by_root": by_root, "windows": int(windows.shape[0]), "seq_len": size.seq_len,
        "eval_seconds": seconds, "eval_tokens_per_s": loss.numel() / max(seconds, 1e-9),
        "dtype": str(run.compute_dtype).removeprefix("torch."),
        "loaded_with": "AutoModelForCausalLM.from_pretrained + AutoTokenizer.from_pretrained",
        "tokenizer": {"len": len(tokenizer), "eos_token_id": tokenizer.eos_token_id,
                      "pad_token_id": tokenizer.pad_token_id,
                      "mask_token_id": getattr(tokenizer, "mask_token_id", None),
                      "chat_template": getattr(tokenizer, "chat_template", None),
                      "roundtrip_ok": roundtrip},
        "embedding_rows": vocab, "spare_rows_past_tokenizer": vocab - len(tokenizer),
        "bits_per_byte_note": "loss / ln 2 / (bytes per token of the split's whole stream)"}


# -- prompts ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Prompt:
    ids: list[int]
    text: str
    source: str
    line: int
    reference: list[int]


def signature_cuts(text: str) -> list[tuple[int, int]]:
    """(def line, char offset just after the colon that ends the signature) of every
    function whose body starts on a later line."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes in old code: SyntaxWarning
            tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    line_starts = [0, *(m.end() for m in re.finditer("\n", text))]
    cuts = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.body:
            continue
        body_line = node.body[0].lineno
        if body_line <= node.lineno:
            continue
        sig_line = body_line - 1  # 1-based: the line before the body's first statement
        begin = line_starts[sig_line - 1]
        end = line_starts[sig_line] - 1 if sig_line < len(line_starts) else len(text)
        line = text[begin:end].rstrip()
        if line.endswith(":"):
            cuts.append((node.lineno, begin + len(line)))
    return cuts


def prompts_of_file(tok: Any, doc: Doc, *, length: int, reference: int, limit: int
                    ) -> tuple[list[Prompt], Counter[str]]:
    """Up to ``limit`` prompts: the ``length`` tokens of the file's own encoding that end
    at a signature (exactly what the model saw in training), plus the real next tokens.
    ``tok`` is a ``tokenizers.Tokenizer``."""
    skipped: Counter[str] = Counter()
    cuts = signature_cuts(doc.text)
    if not cuts:
        return [], skipped
    enc = tok.encode(doc.text, add_special_tokens=False)
    ends = [o[1] for o in enc.offsets]
    ids = enc.ids
    out: list[Prompt] = []
    for line, cut in sorted(cuts, key=lambda c: unit_hash(PROMPT_SALT + doc.rel, str(c[0]))):
        n = bisect.bisect_right(ends, cut)
        if n < length:
            skipped["short_prefix"] += 1
            continue
        prompt = ids[n - length:n]
        text = tok.decode(prompt, skip_special_tokens=False)
        if not doc.text[:cut].endswith(text):  # a token that straddles the cut, or a split
            skipped["not_a_token_boundary"] += 1  # multi-byte character at the start
            continue
        out.append(Prompt(prompt, text, doc.rel, line, ids[n:n + reference]))
        if len(out) == limit:
            break
    return out, skipped


def _prompts_range(task: tuple[int, int, int, int, int]
                   ) -> list[tuple[list[Prompt], Counter[str]]]:
    start, stop, length, reference, per_file = task
    return [prompts_of_file(_POOL_TOKENIZER, doc, length=length, reference=reference,
                            limit=per_file) for doc in _POOL_DOCS[start:stop]]


def collect_prompts(tokenizer_json: str, docs: list[Doc], n: int, *, length: int,
                    reference: int, per_file: int) -> tuple[list[Prompt], dict[str, int]]:
    """The first ``n`` prompts of the files in hash order, ``per_file`` at most each."""
    order = sorted(docs, key=lambda d: unit_hash(PROMPT_SALT, d.rel))
    stats: Counter[str] = Counter()
    prompts: list[Prompt] = []
    with tokenizer_pool(tokenizer_json, order) as pool:
        width = 8 * (os.cpu_count() or 1)
        for a, b in ranges(0, len(order), 8 * width):  # a wave of files, then the count
            tasks = [(x, y, length, reference, per_file) for x, y in ranges(a, b, 8)]
            for got, skipped in (r for chunk in pool.map(_prompts_range, tasks) for r in chunk):
                if len(prompts) < n:
                    stats.update(skipped)
                    stats["files_used"] += bool(got)
                    prompts.extend(got[: n - len(prompts)])
            if len(prompts) >= n:
                break
    stats["prompts"] = len(prompts)
    return prompts, dict(stats)


def prompt_rows(tok: Any, prompts: list[Prompt]) -> Iterator[dict[str, Any]]:
    for p in prompts:
        yield {"prompt_ids": p.ids, "prompt": p.text, "source": p.source, "line": p.line,
               "reference": tok.decode(p.reference)}


@torch.no_grad()
def greedy_continuations(run: Run, model: Any, prompts: list[Prompt], new_tokens: int,
                         batch: int = 64) -> list[list[int]]:
    """The target's greedy continuation of each prompt (equal lengths: no padding)."""
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch):
        ids = torch.tensor([p.ids for p in prompts[start:start + batch]], device=run.device)
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=model.config.eos_token_id)
        out.extend(gen[:, ids.shape[1]:].tolist())
    return out


def _leading_match(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def ngram_replay_tau(prompts: list[Prompt], continuations: list[list[int]], max_draft: int
                     ) -> dict[str, Any]:
    """The n-gram drafter's exact tau on the target's recorded greedy decodes."""
    from dflash.ngram import ReplayVerifier, speculate

    cycles: list[int] = []
    for p, cont in zip(prompts, continuations, strict=True):
        got = speculate(ReplayVerifier([*p.ids, *cont]), p.ids, max_new_tokens=len(cont),
                        max_draft=max_draft)
        cycles.extend(got.accepted)
    return {"max_draft": max_draft, "n_max": 4, "n_min": 1, "cycles": len(cycles),
            "tau": sum(cycles) / max(1, len(cycles))}


def stage_prompts(run: Run) -> dict[str, Any]:
    size = run.size
    tok = load_hf_tokenizer(run, run.target_dir)
    docs = corpus_docs(run)
    length = run.args.prompt_tokens or size.prompt_tokens
    made: dict[str, Any] = {}
    sets: dict[str, list[Prompt]] = {}
    for name, split, n in (("eval", "heldout", run.args.eval_prompts or size.eval_prompts),
                           ("train", "train", run.args.train_prompts or size.train_prompts)):
        part = [d for d in docs if d.split == split]
        t0 = time.perf_counter()
        prompts, stats = collect_prompts(tok.backend_tokenizer.to_str(), part, n,
                                         length=length, reference=64,
                                         per_file=1 if name == "eval" else 2)
        path = run.work / f"prompts-{name}.jsonl"
        write_jsonl_atomic(path, prompt_rows(tok, prompts))
        allowed = {d.rel for d in part}
        assert all(p.source in allowed for p in prompts), f"{name} prompt from another split"
        sets[name] = prompts
        made[name] = {"file": str(path), "from_split": split, "requested": n,
                      "seconds": time.perf_counter() - t0, **stats}
        log("prompts", f"{name}: {len(prompts)} prompts of {length} tokens -> {path}")
    assert not {p.source for p in sets["eval"]} & {p.source for p in sets["train"]}
    model = load_target_model(run)
    t0 = time.perf_counter()
    conts = greedy_continuations(run, model, sets["eval"], size.sample_tokens)
    gen_s = time.perf_counter() - t0
    matches = [_leading_match(c, p.reference) for c, p in zip(conts, sets["eval"], strict=True)]
    samples = [{"source": p.source, "line": p.line, "prompt_tail": p.text[-300:],
                "greedy": tok.decode(c), "reference": tok.decode(p.reference)}
               for p, c in list(zip(sets["eval"], conts, strict=True))[:4]]
    return {"prompt_tokens": length, "format": "JSONL {prompt_ids, prompt, source, line, "
                                               "reference}; dflash.data reads prompt_ids",
            "sets": made, "greedy": {
                "new_tokens": size.sample_tokens, "seconds": gen_s,
                "mean_leading_tokens_equal_to_the_file": sum(matches) / max(1, len(matches)),
                "whole_continuation_equal": sum(m == size.sample_tokens for m in matches)},
            "ngram_on_greedy": {f"max_draft_{k}": ngram_replay_tau(sets["eval"], conts, k)
                                for k in (7, 15)},
            "samples": samples}


# -- the drafter experiment: generate, probe, train, eval ---------------------------------
DRAFT_CAP = 15
"""Drafts verified per cycle, the same for every drafter: DFlash's block 16 minus one."""


def py_module(module: str) -> list[str]:
    return [sys.executable, "-m", module]


def device_flag(run: Run) -> list[str]:
    return ["--device", str(run.device)]


def _subset_jsonl(src: Path, dst: Path, n: int | None) -> int:
    """The first ``n`` rows of ``src`` (all with None) into ``dst``; their count."""
    rows = src.read_text(encoding="utf-8").splitlines()
    rows = rows[:n] if n else rows
    dst.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def distinct_ngram_ratio(seqs: Iterable[Sequence[int]], n: int = 4) -> float:
    """Distinct n-grams / n-grams within each sequence, averaged: 1 = no repetition."""
    ratios = []
    for seq in seqs:
        grams = [tuple(seq[i:i + n]) for i in range(len(seq) - n + 1)]
        if grams:
            ratios.append(len(set(grams)) / len(grams))
    return sum(ratios) / max(1, len(ratios))


def stage_generate(run: Run) -> dict[str, Any]:
    args = run.args
    prompts = run.work / "prompts-gen.jsonl"
    n = _subset_jsonl(run.work / "prompts-train.jsonl", prompts, args.gen_prompts)
    data = run.work / "train-data.jsonl"
    argv = [*py_module("dflash.cli.generate"), "--target", str(run.target_dir), "--prompts",
            str(prompts), "--out", str(data), "--max-new-tokens", str(args.gen_new_tokens),
            "--batch-size", str(args.gen_batch), *device_flag(run)]
    res = run_cli(run, "generate", argv, echo=True)
    if res["rc"] != 0:
        raise SystemExit(f"real_target: dflash-generate failed (rc {res['rc']}): "
                         f"{res['tail'][-800:]}")
    rows = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]
    lengths = [len(r["response_ids"]) for r in rows]
    tok = load_hf_tokenizer(run, run.target_dir)
    eos = tok.eos_token_id
    sample = rows[: args.replay_sample]
    from dflash.ngram import ReplayVerifier, speculate

    cycles: list[int] = []
    for r in sample:  # the n-gram drafter's exact tau on the training responses
        got = speculate(ReplayVerifier([*r["prompt_ids"], *r["response_ids"]]),
                        r["prompt_ids"], max_new_tokens=len(r["response_ids"]),
                        max_draft=DRAFT_CAP)
        cycles.extend(got.accepted)
    return {"command": argv, "rc": res["rc"], "seconds": res["seconds"], "prompts": n,
            "file": str(data), "new_tokens_asked": args.gen_new_tokens,
            "response_tokens": sum(lengths), "mean_response_tokens": sum(lengths) / len(rows),
            "ended_at_eos": sum(1 for r in rows if r["response_ids"][-1:] == [eos]),
            "tokens_per_s": sum(lengths) / max(res["seconds"], 1e-9),
            "distinct_4gram_ratio": distinct_ngram_ratio(r["response_ids"] for r in rows),
            "ngram_replay": {"rows": len(sample), "max_draft": DRAFT_CAP, "cycles": len(cycles),
                             "tau": sum(cycles) / max(1, len(cycles))},
            "samples": [r.get("response", "")[:400] for r in rows[:3]]}


def train_argv(run: Run, steps: int, out: Path, *, probe: bool = False) -> list[str]:
    """dflash-train with the paper's recipe (the qwen3-8b-shape preset: lr 6e-4, 4 %
    warm-up, cosine to 0, AdamW betas 0.9/0.999, clip 1, B=16, gamma 7) on this target,
    sized for it: ``--drafter-layers`` layers, batches of ``--drafter-batch`` sequences of
    prompt + response, ``--drafter-anchors`` blocks per sequence."""
    args = run.args
    length = (args.prompt_tokens or run.size.prompt_tokens) + args.gen_new_tokens
    log_every = 10 if probe else max(1, steps // 24)
    sets = {"draft_layers": args.drafter_layers, "block_size": 16, "gamma": 7.0,
            "batch_size": args.drafter_batch, "buckets": length,
            "anchors": args.drafter_anchors, "held_out": 2 * args.drafter_batch,
            "log_every": log_every, "eval_every": 0 if probe else 2 * log_every,
            "save_every": 0 if probe else max(1, steps // 3), "keep_checkpoints": 10,
            "compile": "off", "mega_cache": "off", "seed": args.seed,
            "peak_tflops": peak_tflops(run) or 0}
    if not sets["peak_tflops"]:
        del sets["peak_tflops"]
    argv = [*py_module("dflash.cli.train"), "--preset", "qwen3-8b-shape", "--target",
            str(run.target_dir), "--data", str(run.work / "train-data.jsonl"), "--steps",
            str(steps), "--out", str(out), "--attention", "sdpa", "--unguarded"]
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    return argv


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def stage_probe(run: Run) -> dict[str, Any]:
    out = run.work / "probe"
    argv = train_argv(run, run.args.probe_steps, out, probe=True)
    res = run_cli(run, "probe", argv, echo=True)
    records = read_metrics(out)
    if res["rc"] != 0 or not records:
        raise SystemExit(f"real_target: the dflash-train probe failed (rc {res['rc']}): "
                         f"{res['tail'][-1500:]}")
    return {"command": argv, "rc": res["rc"], "seconds": res["seconds"],
            "steps": run.args.probe_steps, "step_s": records[-1]["step_s"],
            "records": records, "export": str(out / "drafter")}


def _step_s(run: Run) -> float:
    """Seconds a step, from the probe (the last logged interval: warm by then)."""
    return float(run.result("probe")["step_s"])


def stage_train(run: Run) -> dict[str, Any]:
    args = run.args
    if not run.has_result("probe"):
        run.save_result("probe", stage_probe(run))
    step_s = _step_s(run)
    budget = args.drafter_seconds
    left = run.seconds_left() - args.train_reserve_s
    if left < budget:
        log("train", f"--deadline-s leaves {left:.0f} s of the {budget:.0f} s asked")
        budget = max(10.0, left)
    steps = max(3, int(budget / step_s))
    out = run.work / "drafter-run"
    argv = train_argv(run, steps, out)
    # Start-up (imports, target, data) runs before the first step: allow it, then stop.
    res = run_cli(run, "train", argv, echo=True, timeout=budget + args.train_startup_s)
    records = read_metrics(out)
    checkpoints = sorted(str(p) for p in (out / "checkpoints").glob("step-*") if p.is_dir())
    export = out / "drafter"
    meta_path = out / "metadata.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.exists() else {}
    held = [{"step": r["step"], "held_out_tau": r["held_out_tau"], "loss": r["loss"]}
            for r in records if "held_out_tau" in r]
    if res["rc"] != 0 and not checkpoints:
        raise SystemExit(f"real_target: dflash-train failed (rc {res['rc']}): "
                         f"{res['tail'][-1500:]}")
    last = records[-1] if records else {}
    return {"command": argv, "rc": res["rc"], "seconds": res["seconds"],
            "stopped": res["stopped"], "steps_planned": steps, "budget_s": budget,
            "probe_step_s": step_s, "steps_done": last.get("step"),
            "export": str(export) if export.exists() else None, "checkpoints": checkpoints,
            "held_out_tau": held, "last_record": last, "records": records,
            "config": meta.get("config"), "unguarded": meta.get("unguarded"),
            "attention": meta.get("attention"), "compile": meta.get("compile"),
            "tail": res["tail"][-1500:]}


def trained_drafter(run: Run) -> Path | None:
    """The train stage's export, else its latest checkpoint (a run stopped early)."""
    out = run.work / "drafter-run"
    if (out / "drafter" / "config.json").exists():
        return out / "drafter"
    steps = sorted(p for p in (out / "checkpoints").glob("step-*") if p.is_dir())
    return steps[-1] if steps else None


def eval_argv(run: Run, drafter: list[str], limit: int) -> list[str]:
    args = run.args
    return [*py_module("dflash.cli.evaluate"), *drafter, "--target", str(run.target_dir),
            "--prompts", str(run.work / "prompts-eval.jsonl"), "--limit", str(limit),
            "--max-new-tokens", str(args.eval_new_tokens), "--max-draft", str(DRAFT_CAP),
            "--dtype", args.eval_dtype, *device_flag(run), "--json"]


def _eval_jobs(run: Run) -> list[tuple[str, list[str], int]]:
    """(name, --drafter flags, prompts) of every drafter asked for that exists."""
    jobs: list[tuple[str, list[str], int]] = []
    for item in [n.strip() for n in run.args.eval_drafters.split(",") if n.strip()]:
        name, _, count = item.partition(":")
        try:
            limit = int(count) if count else run.args.eval_limit
        except ValueError:
            raise SystemExit(f"real_target: bad prompt count in --eval-drafters: {item!r}"
                             ) from None
        if name == "ngram":
            jobs.append(("ngram", ["--drafter", "ngram"], limit))
        elif name == "untrained":
            cfg_from = trained_drafter(run) or run.work / "probe" / "drafter"
            jobs.append(("untrained", ["--drafter", str(cfg_from), "--untrained",
                                       "--init-seed", str(run.args.seed)], limit))
        elif name == "trained":
            found = trained_drafter(run)
            if found is None:
                log("eval", "no trained drafter: run the train stage first")
                continue
            jobs.append(("trained", ["--drafter", str(found)], limit))
        elif name == "checkpoints":
            # Every checkpoint but the last, which is the trained drafter's own step.
            ckpts = sorted(p for p in (run.work / "drafter-run" / "checkpoints").glob("step-*")
                           if p.is_dir())
            for ckpt in ckpts[:-1]:
                steps = int(ckpt.name.removeprefix("step-"))
                jobs.append((f"trained@{steps}", ["--drafter", str(ckpt)],
                             int(count) if count else run.args.checkpoint_prompts))
        else:
            raise SystemExit(f"real_target: unknown drafter {name!r} in --eval-drafters")
    return jobs


def _compact(report: dict[str, Any]) -> dict[str, Any]:
    keep = ("drafter", "dtype", "device", "max_new_tokens", "prompts", "tokens", "tau",
            "cycles", "max_draft", "target_seconds", "speculative_seconds", "speedup",
            "target_tokens_per_s", "speculative_tokens_per_s", "drafted",
            "draft_acceptance", "lossless", "mismatches", "acceptance_histogram",
            "warmup_seconds", "per_prompt")
    return {k: report[k] for k in keep if k in report}


def stage_eval(run: Run) -> dict[str, Any]:
    earlier: dict[str, Any] = {}
    if run.has_result("eval"):
        earlier = run.result("eval").get("drafters", {})
    results: dict[str, Any] = dict(earlier)
    for name, flags, limit in _eval_jobs(run):
        left = run.seconds_left() - 5
        if left < 30:
            log("eval", f"skipping {name}: {left:.0f} s left before --deadline-s")
            results.setdefault("skipped", []).append(name)
            continue
        argv = eval_argv(run, flags, limit)
        res = run_cli(run, f"eval-{name.replace('@', '-')}", argv,
                      timeout=None if math.isinf(left) else left, grace_s=5)
        entry: dict[str, Any] = {"command": argv, "rc": res["rc"], "seconds": res["seconds"]}
        if "json" in res:
            entry.update(_compact(res["json"]))
            log("eval", f"{name}: tau {entry['tau']:.2f}, speedup {entry['speedup']:.2f}x, "
                        f"{entry['speculative_tokens_per_s']:.0f} tok/s, lossless "
                        f"{entry['lossless']}")
        else:
            entry["tail"] = res["tail"][-1500:]
        results[name] = entry
        # A run cut short still leaves every drafter measured so far.
        run.save_result("eval", {"drafters": results, "partial": True})
    summary = {name: {k: e.get(k) for k in ("tau", "speedup", "speculative_tokens_per_s",
                                            "target_tokens_per_s", "lossless", "prompts")}
               for name, e in results.items() if isinstance(e, dict) and "tau" in e}
    return {"drafters": results, "summary": summary, "draft_cap": DRAFT_CAP,
            "prompts_file": str(run.work / "prompts-eval.jsonl"),
            "new_tokens": run.args.eval_new_tokens, "dtype": run.args.eval_dtype}


STAGES: list[Stage] = [
    Stage("corpus", stage_corpus),
    Stage("tokenizer", stage_tokenizer),
    Stage("pretrain", stage_pretrain),
    Stage("heldout", stage_heldout),
    Stage("prompts", stage_prompts),
    Stage("generate", stage_generate),
    Stage("probe", stage_probe),
    Stage("train", stage_train),
    Stage("eval", stage_eval),
]


# -- command line -----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="stage results (<stage>.json)")
    p.add_argument("--work", type=Path, help="bulky artifacts (tokens, target, prompts); "
                                             "default: --out")
    p.add_argument("--minutes", type=float, default=3.0, help="pretraining wall-clock")
    p.add_argument("--deadline-s", type=float, metavar="S",
                   help="shorten pretraining so that the whole run can end S seconds after "
                        "the start (for a machine lent for a fixed time)")
    p.add_argument("--reserve-s", type=float, default=60.0,
                   help="with --deadline-s: seconds kept for saving and the later stages")
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--stages", default=",".join(s.name for s in STAGES),
                   help="comma-separated, from: " + ", ".join(s.name for s in STAGES))
    p.add_argument("--seed", type=int, default=0, help="weights and data order (the split "
                                                       "and the file choice do not depend on it)")
    p.add_argument("--corpus-root", action="append", metavar="DIR",
                   help="a folder of .py files (repeatable); default: stdlib + site-packages")
    p.add_argument("--max-corpus-mb", type=float, help="default: the size's")
    p.add_argument("--heldout-fraction", type=float, default=0.03)
    p.add_argument("--max-file-kb", type=int, default=1024)
    p.add_argument("--max-line", type=int, default=1000,
                   help="leave out files with a longer line (generated code)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--compile", choices=["off", "on"], default="on",
                   help="torch.compile the model for pretraining (compile time counts; "
                        "451k against 265k tokens/s eager on the H200)")
    p.add_argument("--peak-tflops", type=float, help="MFU denominator (default: datasheet "
                                                     "dense bf16 of an H100/H200)")
    p.add_argument("--prompt-tokens", type=int, help="default: the size's")
    p.add_argument("--train-prompts", type=int, help="default: the size's")
    p.add_argument("--eval-prompts", type=int, help="default: the size's")
    g = p.add_argument_group("the drafter experiment (generate, probe, train, eval)")
    g.add_argument("--gen-prompts", type=int, help="training prompts to answer (default all)")
    g.add_argument("--gen-new-tokens", type=int, default=320)
    g.add_argument("--gen-batch", type=int, default=512)
    g.add_argument("--replay-sample", type=int, default=256,
                   help="responses the n-gram replay tau of the generate stage uses")
    g.add_argument("--drafter-layers", type=int, default=5)
    g.add_argument("--drafter-batch", type=int, default=32, help="sequences a step")
    g.add_argument("--drafter-anchors", type=int, default=64, help="blocks a sequence")
    g.add_argument("--drafter-seconds", type=float, default=240.0,
                   help="training budget: steps = this / the probe's step time")
    g.add_argument("--probe-steps", type=int, default=30)
    g.add_argument("--train-startup-s", type=float, default=45.0,
                   help="allowed for dflash-train's start before SIGTERM")
    g.add_argument("--train-reserve-s", type=float, default=120.0,
                   help="with --deadline-s: seconds kept for start-up and the eval stage")
    g.add_argument("--eval-drafters", default="ngram,trained,untrained:8,checkpoints:8",
                   help="comma-separated: ngram, untrained, trained, checkpoints; NAME:N "
                        "evaluates that one on N prompts (default --eval-limit, "
                        "--checkpoint-prompts for checkpoints)")
    g.add_argument("--eval-limit", type=int, default=24, help="eval prompts per drafter")
    g.add_argument("--checkpoint-prompts", type=int, default=8,
                   help="eval prompts for each intermediate checkpoint")
    g.add_argument("--eval-new-tokens", type=int, default=192)
    g.add_argument("--eval-dtype", choices=["auto", "bfloat16", "float32"],
                   default="float32", help="float32: the lossless check compares argmaxes "
                                           "that bf16 rounding can flip at near-ties")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [s.strip() for s in args.stages.split(",") if s.strip()]
    known = {s.name: s for s in STAGES}
    if unknown := [n for n in names if n not in known]:
        raise SystemExit(f"real_target: unknown stage(s) {unknown}; known: {list(known)}")
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu")
                          if args.device == "auto" else args.device)
    run = Run(args, SIZES[args.size], args.out, args.work or args.out, device)
    run.out.mkdir(parents=True, exist_ok=True)
    run.work.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    log("real_target", f"size {args.size}, device {device}, stages {names}, out {run.out}, "
                       f"work {run.work}")
    for stage in STAGES:  # the pipeline's order, whatever the order given
        if stage.name not in names:
            continue
        t0 = time.perf_counter()
        result = stage.run(run)
        result["wall_s"] = time.perf_counter() - t0
        run.save_result(stage.name, result)
        log(stage.name, f"done in {result['wall_s']:.1f} s: "
                        f"{json.dumps(result, default=str)[:600]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
