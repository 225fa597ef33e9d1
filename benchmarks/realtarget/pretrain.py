"""The pretrain stage: a Qwen3-architecture causal LM from scratch for a wall-clock budget."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from realtarget.run import DENSE_BF16_TFLOPS, STARTED, Run, Size, log
from realtarget.tokenizer import model_vocab, save_tokenizer


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


