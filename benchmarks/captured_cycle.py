"""What a decoding cycle costs at batch 1, eager against the static (captured) cycle.

    python benchmarks/captured_cycle.py --device cuda --out cycle.json

A target of the real-target experiment's shape (``--hidden`` 768, 12 layers, GQA 12/4,
head 64, vocabulary 16,000: the 88 M Qwen3 ``benchmarks/real_target.py`` pretrains; random
weights, dflash's own Qwen3) and an untrained drafter of block 16 (``--drafter-layers``,
5 as trained by default). Untrained, a DFlash cycle accepts one token, so every cycle
verifies the full block: the same work each time. Measured in one process, alternating
``--reps`` times:

target_ms          a target-only greedy token (eager, the reference every speedup uses);
target_captured_ms the same, its one-token step captured on a static cache
                   (dflash/decoding/reference.py; uncaptured on a CPU);
dflash_eager_ms    a DFlash cycle on dynamic caches (``--cycle eager``);
dflash_static_ms   the same on the static cycle (CUDA graphs on a GPU);
ngram_eager_ms / ngram_static_ms   a prompt-lookup cycle on each path (drafts as they
                   come: the prompt repeats a 64-token stretch, so some cycles draft);
hybrid_eager_ms / hybrid_static_ms  a hybrid cycle (``--min-match`` 3): eager, the lookup's
                   draft instead of the drafter's where it has one; static, both verified
                   in one forward of 2 x 16 - 1 rows where the lookup drafts
                   (dflash/decoding/branches.py), else the DFlash cycle;

each also in target forwards (÷ target_ms) and in captured target forwards
(÷ target_captured_ms), and whether every decode equals target-only greedy decoding.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dflash.decoding import static  # noqa: E402
from dflash.decoding.cycle import Drafting, cycle_decoder  # noqa: E402
from dflash.decoding.reference import CapturedGreedy  # noqa: E402
from dflash.decoding.speculative import target_greedy  # noqa: E402
from dflash.qwen3 import Qwen3Config  # noqa: E402
from dflash.startup import build_drafter  # noqa: E402
from dflash.target import drafter_config_for, load_target  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--drafter-layers", type=int, default=5,
                   help="drafter layers: what a smaller drafter saves a cycle")
    p.add_argument("--prompt", type=int, default=256, help="prompt tokens")
    p.add_argument("--tokens", type=int, default=128, help="new tokens a decode")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    cfg = Qwen3Config(vocab_size=16_000, hidden_size=args.hidden, intermediate_size=2048,
                      num_hidden_layers=args.layers, num_attention_heads=12,
                      num_key_value_heads=4, head_dim=64, rope_theta=10_000.0,
                      tie_word_embeddings=True)
    folder = Path(tempfile.mkdtemp(prefix="captured-cycle-"))
    (folder / "config.json").write_text(json.dumps(cfg.to_json()), encoding="utf-8")
    target = load_target(str(folder / "config.json"), device=args.device, dtype=dtype)
    drafter = build_drafter(drafter_config_for(target, num_layers=args.drafter_layers,
                                               block_size=16, gamma=7.0),
                            target.device).to(dtype).eval()
    gen = torch.Generator().manual_seed(0)
    stretch = torch.randint(0, 15_000, (64,), generator=gen).tolist()
    head = torch.randint(0, 15_000, (args.prompt - 128,), generator=gen).tolist()
    prompt = [*head, *stretch, *stretch]
    decoders = {f"{kind}_{path}": cycle_decoder(target, None if kind == "ngram" else drafter,
                                                Drafting(kind=kind), max_draft=15, path=path)
                for kind in ("dflash", "ngram", "hybrid") for path in ("eager", "static")}
    captured = CapturedGreedy(target, static.graphs_for(target.device))
    target_greedy(target, prompt, max_new_tokens=8)  # warm-up (and the captures)
    captured(prompt, max_new_tokens=args.tokens)
    for decode in decoders.values():
        decode(prompt, max_new_tokens=8)
    rows: dict[str, list[float]] = {name: [] for name in ["target", "target_captured",
                                                            *decoders]}
    taus: dict[str, float] = {}
    lookups: dict[str, int] = {}
    equal = True
    for _ in range(args.reps):
        ref = target_greedy(target, prompt, max_new_tokens=args.tokens)
        rows["target"].append(ref.seconds / max(1, ref.target_forwards) * 1e3)
        clock = captured(prompt, max_new_tokens=args.tokens)
        rows["target_captured"].append(clock.seconds / max(1, clock.target_forwards) * 1e3)
        equal = equal and clock.tokens == ref.tokens
        for name, decode in decoders.items():
            got = decode(prompt, max_new_tokens=args.tokens)
            rows[name].append(got.seconds / max(1, len(got.accepted)) * 1e3)
            taus[name] = sum(got.accepted) / max(1, len(got.accepted))
            lookups[name] = got.lookups
            equal = equal and got.tokens == ref.tokens
    summary: dict[str, object] = {
        "device": torch.cuda.get_device_name() if target.device.type == "cuda" else "cpu",
        "dtype": args.dtype, "hidden": args.hidden, "layers": args.layers,
        "drafter_layers": args.drafter_layers,
        "prompt": len(prompt), "tokens": args.tokens, "reps": args.reps,
        "torch": torch.__version__, "lossless_every_decode": equal, "tau": taus,
        "lookups": lookups}
    target_ms = statistics.median(rows["target"])
    captured_ms = statistics.median(rows["target_captured"])
    for name, values in rows.items():
        summary[f"{name}_ms"] = statistics.median(values)
        summary[f"{name}_in_target_forwards"] = statistics.median(values) / target_ms
        summary[f"{name}_in_captured_target_forwards"] = statistics.median(values) / captured_ms
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
