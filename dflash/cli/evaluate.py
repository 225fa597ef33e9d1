"""``dflash-eval``: real speculative decoding against a target, with a trained DFlash
drafter, an untrained one of the same config, or the n-gram (prompt-lookup) baseline.

Reports tau (mean tokens per target forward), tokens/s and the wall-clock speedup over
target-only greedy decoding of the same prompts, and whether the speculative output
equals the target's own greedy output token for token (it must: anything else is a bug,
or a near-tie flipped by low precision, which the mismatch's ``logit_gap`` tells apart).

``--drafter`` is an exported drafter folder (or a training checkpoint folder, which holds
one), ``ngram[:N_MAX[:N_MIN]]`` for prompt lookup (no drafter model: the target is
loaded with its default taps), or ``hybrid:DIR``: the drafter's block and, where the
context repeats (``--min-match`` tokens or more matched), prompt lookup's draft; the
static cycle verifies both in one forward and keeps the branch that accepted more, the
eager one verifies the lookup's instead (:mod:`dflash.decoding.branches`). ``--cycle``
picks how a cycle runs: ``static`` (a static KV cache, captured in CUDA graphs on a GPU;
dflash's own Qwen3 targets), ``eager``, or ``auto`` (static on a GPU where it can, else
eager). ``--untrained`` keeps the folder's config and replaces its weights by a fresh
initialisation (seed ``--init-seed``): the baseline before training.
``--max-draft`` (default: the drafter's block size minus one, 15 for n-gram) caps the
drafts verified per cycle, the same for every drafter. Progress goes to stderr.

``--check-config`` only compares the drafter's config.json with the target's files
(:mod:`dflash.cli.check_config`): embedding scale, rope, norm eps, vocab size, special
token ids and chat template, one line per difference; it loads no model.

The report goes to stdout as text, ``--format json`` (``--json``) or ``--format markdown``
(:mod:`dflash.cli.eval_report`).

Exit codes (dflash.exitcodes): 0 lossless, 1 an output differed, 2 bad input (drafter,
target, prompts, or a drafter trained for another target), 4 runtime failure, 5
``--check-config`` found a difference, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash.checkpoint.layout import WEIGHTS_NAME, read_config
from dflash.cli import options
from dflash.cli.command import Command
from dflash.cli.command import entry as command_entry
from dflash.cli.eval_report import FORMATS, Run, document, render_markdown, render_text
from dflash.config import DrafterConfig
from dflash.decoding.choices import (
    CYCLE_PATHS,
    DEFAULT_LOOKUP_BRANCH,
    DEFAULT_MIN_MATCH,
    HYBRID_PREFIX,
    LOOKUP_BRANCHES,
)
from dflash.errors import CheckpointError, ConfigError, InputError
from dflash.exitcodes import ExitCode
from dflash.ngram import NgramSpec

if TYPE_CHECKING:
    from dflash.decoding.speculative import Decoder
    from dflash.target import TargetModel

PROG = "dflash-eval"
NGRAM_MAX_DRAFT = 15
"""The n-gram drafter's default draft cap: block size 16 minus one, the paper's DFlash."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Speculative decoding with a DFlash drafter or the n-gram baseline: "
                    "tau, speedup, losslessness.")
    p.add_argument("--drafter", required=True, metavar="DIR|ngram[:N_MAX[:N_MIN]]|hybrid:DIR",
                   help="exported drafter folder (config.json + model.safetensors), "
                        "ngram for prompt-lookup drafts (default orders 4..1), or hybrid:DIR "
                        "for the drafter and, where the context repeats, prompt lookup "
                        "(static cycle: both verified at once, the better kept)")
    p.add_argument("--cycle", choices=CYCLE_PATHS, default="auto",
                   help="static: a static KV cache, in CUDA graphs on a GPU; eager; auto "
                        "(default): static on a GPU where the target allows it")
    p.add_argument("--min-match", type=int, default=DEFAULT_MIN_MATCH, metavar="K",
                   help="hybrid: prompt lookup drafts when at least K tokens matched "
                        f"(default {DEFAULT_MIN_MATCH})")
    p.add_argument("--lookup-branch", choices=LOOKUP_BRANCHES, default=DEFAULT_LOOKUP_BRANCH,
                   help="hybrid, static cycle: verify prompt lookup's draft beside the "
                        "drafter's wherever it has one (always, default), or only where it "
                        "is not the start of the drafter's own (useful: such a draft can "
                        "only tie, but knowing it costs a wait for the drafts)")
    p.add_argument("--untrained", action="store_true",
                   help="the folder's config with freshly initialised weights")
    p.add_argument("--init-seed", type=int, default=0, help="for --untrained")
    p.add_argument("--max-draft", type=int, metavar="K",
                   help="drafts verified per cycle at most (default: block size - 1; "
                        f"{NGRAM_MAX_DRAFT} for ngram)")
    options.add_decoding_options(p, prompts_required=False)
    p.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                   help="target and drafter dtype (auto: bfloat16 on GPU, float32 on CPU)")
    p.add_argument("--target-seed", type=int, default=0,
                   help="weights seed of a random (named-shape or config-only) target; "
                        "use the training run's seed")
    p.add_argument("--seed", type=int, default=1234, help="for --synthetic")
    p.add_argument("--limit", type=int, help="evaluate at most this many prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="the report as text (default), JSON or a Markdown table")
    p.add_argument("--json", action="store_true", help="the same as --format json")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--check-config", action="store_true",
                   help="only compare the drafter's config with the target's where serving "
                        "needs them equal (exit 5 on a difference); no prompts, no decoding")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.check_config:
        from dflash.cli import check_config

        folder = Path(args.drafter.removeprefix(HYBRID_PREFIX))
        return Command(PROG).run(lambda: check_config.run(PROG, folder, args.target))
    return Command(PROG).run(lambda: _main(args))


@dataclass(frozen=True, slots=True)
class DrafterChoice:
    """What ``--drafter`` (and ``--untrained``) name, checked before torch is imported."""

    ngram: NgramSpec | None
    config: DrafterConfig | None
    max_draft: int
    hybrid: bool = False

    @property
    def kind(self) -> str:
        if self.ngram is not None:
            return "ngram"
        return "hybrid" if self.hybrid else "dflash"


def check_inputs(args: argparse.Namespace) -> DrafterChoice:
    """Every flag and path, before torch is imported; what the drafter is."""
    try:
        spec = NgramSpec.parse(args.drafter)
    except ValueError as exc:
        raise InputError(f"--drafter: {exc}") from None
    options.check_decoding_options(args)
    options.at_least("--limit", args.limit, 0)
    options.at_least("--max-draft", args.max_draft, 0)
    options.at_least("--min-match", args.min_match, 1)
    if spec is not None:
        if args.untrained:
            raise InputError("--untrained needs a drafter folder, not ngram")
        max_draft = NGRAM_MAX_DRAFT if args.max_draft is None else args.max_draft
        return DrafterChoice(spec, None, max_draft)
    hybrid = args.drafter.startswith(HYBRID_PREFIX)
    folder = Path(args.drafter.removeprefix(HYBRID_PREFIX))
    drafter_cfg = read_config(folder)
    if not args.untrained:
        options.readable_file(folder / WEIGHTS_NAME, CheckpointError)
    longest = drafter_cfg.block_size - 1
    if args.max_draft is not None and args.max_draft > longest:
        raise InputError(f"--max-draft {args.max_draft}: a drafter of block size "
                         f"{drafter_cfg.block_size} drafts at most {longest} tokens")
    return DrafterChoice(None, drafter_cfg, longest if args.max_draft is None
                         else args.max_draft, hybrid)


def report_format(args: argparse.Namespace) -> str:
    """``--format``, with ``--json`` its short form; the two disagreeing is bad input."""
    if args.json and args.format not in (None, "json"):
        raise ConfigError(f"--json and --format {args.format} ask for two reports: give one")
    return "json" if args.json else args.format or "text"


def check_pair(drafter_cfg: DrafterConfig, target: TargetModel) -> None:
    """Refuse a drafter trained for another target (it would decode, at tau ~ 1)."""
    problems = []
    for name, mine, theirs in (
            ("hidden_size", drafter_cfg.hidden_size, target.hidden_size),
            ("vocab_size", drafter_cfg.vocab_size, target.vocab_size),
            ("num_target_layers", drafter_cfg.num_target_layers, target.num_layers)):
        if mine != theirs:
            problems.append(f"{name} {mine} != target's {theirs}")
    if problems:
        raise ConfigError("the drafter was trained for another target: " + "; ".join(problems))


def _main(args: argparse.Namespace) -> int:
    choice = check_inputs(args)
    form = report_format(args)
    from dflash.cli.progress import Progress

    progress = Progress(PROG, quiet=args.quiet)
    progress.phase("importing torch")
    import torch

    from dflash.checkpoint.export import check_weights, load_drafter
    from dflash.decoding.cycle import Drafting, cycle_decoder
    from dflash.decoding.evaluate import evaluate
    from dflash.decoding.generate import (
        check_context,
        device_and_dtype,
        prompts_for,
        stop_ids_of,
    )
    from dflash.decoding.speculative import ngram_decoder
    from dflash.model import DFlashDrafter
    from dflash.target import load_target

    device, dtype = device_and_dtype(args.device, args.dtype)
    described: dict[str, Any] = {"kind": choice.kind, "source": args.drafter,
                                 "max_draft": choice.max_draft, "cycle": args.cycle}
    folder = args.drafter.removeprefix(HYBRID_PREFIX)
    decode: Decoder
    with progress:
        if choice.ngram is not None:
            progress.phase(f"loading the target {args.target}")
            target = load_target(args.target, device=device, dtype=dtype,
                                 seed=args.target_seed)
            drafting = Drafting(kind="ngram", n_max=choice.ngram.n_max,
                                n_min=choice.ngram.n_min)
            decode = (ngram_decoder(target, max_draft=choice.max_draft,
                                    n_max=choice.ngram.n_max, n_min=choice.ngram.n_min)
                      if _path(args.cycle, target) == "eager" else
                      cycle_decoder(target, None, drafting, max_draft=choice.max_draft,
                                    path=args.cycle))
            described.update(n_max=choice.ngram.n_max, n_min=choice.ngram.n_min)
        elif choice.config is not None:
            if args.untrained:
                progress.phase(f"initialising an untrained drafter of {folder}'s "
                               f"config (seed {args.init_seed})")
                if (Path(folder) / WEIGHTS_NAME).exists():  # the config describes its weights
                    check_weights(Path(folder), choice.config)
                torch.manual_seed(args.init_seed)
                drafter = DFlashDrafter(choice.config).to(device=device, dtype=dtype).eval()
                described.update(untrained=True, init_seed=args.init_seed)
            else:
                progress.phase(f"loading the drafter {folder}")
                drafter = load_drafter(folder, device=device, dtype=dtype).eval()
            progress.phase(f"loading the target {args.target}")
            target = load_target(args.target, device=device, dtype=dtype,
                                 layer_ids=drafter.cfg.target_layer_ids,
                                 mask_token_id=drafter.cfg.mask_token_id,
                                 seed=args.target_seed)
            check_pair(drafter.cfg, target)
            _path(args.cycle, target)
            drafting = Drafting(kind=choice.kind, min_match=args.min_match,
                                lookup_branch=args.lookup_branch)
            decode = cycle_decoder(target, drafter, drafting, max_draft=choice.max_draft,
                                   path=args.cycle)
            described.update(block_size=drafter.cfg.block_size,
                             layers=drafter.cfg.num_layers, untrained=bool(args.untrained))
            if choice.hybrid:
                described.update(min_match=args.min_match, lookup_branch=args.lookup_branch)
        described.update(cycle_path=_path(args.cycle, target))
        progress.phase("reading the prompts")
        prompts = prompts_for(target, prompts_file=args.prompts, synthetic=args.synthetic,
                              length=args.prompt_length, seed=args.seed)
        prompts = prompts[: args.limit] if args.limit else prompts
        check_context(target, prompts, args.max_new_tokens, max_draft=choice.max_draft)

        def on_phase(text: str) -> None:
            progress.phase(text)
            if text.startswith("decoding"):
                progress.start("prompt", len(prompts))

        report = evaluate(target, decode, prompts, max_new_tokens=args.max_new_tokens,
                          stop_ids=stop_ids_of(target), max_draft=choice.max_draft,
                          on_phase=on_phase, on_prompt=progress.update,
                          captured=_captured_reference(described["cycle_path"], target))
    progress.say(f"done: tau {report.tau:.2f}, speedup {report.speedup:.2f}x, "
                 f"{'lossless' if report.lossless else 'NOT LOSSLESS'}")
    run = Run(drafter=described, target=args.target, device=str(target.device),
              dtype=str(dtype).removeprefix("torch."), max_new_tokens=args.max_new_tokens)
    if form == "json":
        print(json.dumps(document(report, run), indent=2))
    elif form == "markdown":
        print(render_markdown(report, run), end="")
    else:
        print(render_text(report))
    return ExitCode.OK if report.lossless else ExitCode.MISMATCH


def _path(requested: str, target: TargetModel) -> str:
    """The cycle path ``--cycle`` gives on this target; a static cycle it cannot run is
    bad input."""
    from dflash.decoding.cycle import path_for

    try:
        return path_for(requested, target)
    except ValueError as exc:
        raise ConfigError(f"--cycle {requested}: {exc}") from None


def _captured_reference(path: str, target: TargetModel) -> Decoder | None:
    """On the static path, target-only decoding captured as the cycle is: the second clock
    (:mod:`dflash.decoding.reference`)."""
    if path != "static":
        return None
    from dflash.decoding.reference import CapturedGreedy
    from dflash.decoding.static import graphs_for

    return CapturedGreedy(target, graphs_for(target.device))


def entry() -> int:
    """The console script and ``python -m``: :func:`main`, with compiled modules kept
    (:func:`dflash.cli.command.entry`)."""
    return command_entry(main)


if __name__ == "__main__":
    sys.exit(entry())
