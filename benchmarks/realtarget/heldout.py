"""The heldout stage: the saved target reloaded with transformers, its loss on held-out files."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from realtarget.corpus import Doc, corpus_docs
from realtarget.pretrain import (
    load_hf_tokenizer,
    spread_windows,
    stream_tensor,
    sync,
    token_losses,
    window_starts,
)
from realtarget.run import Run


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


