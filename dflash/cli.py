"""``dflash-train``: the trainer's console script, guarded by envguard.

It refuses to start unless its environment matches ``lockfiles/dflash-train.toml``.
Launched through ``envguard run`` it trusts the check that already happened (the
``ENVGUARD_VERIFIED`` variable names this lock); launched directly it runs the same
check itself. ``--unguarded`` starts anyway and writes the mismatch into the run's
metadata.

``--check`` stops after the check (a preflight for job scripts).

Exit codes: 0 trained (or stopped by SIGTERM after saving a checkpoint), 2 bad
input or config, 3 refused by the environment gate, 4 training failed at runtime,
130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dflash.exitcodes import ExitCode

LOCK_NAME = "dflash-train"
EXIT_OK, EXIT_BAD_INPUT, EXIT_REFUSED = ExitCode.OK, ExitCode.BAD_INPUT, ExitCode.REFUSED
EXIT_FAILED, EXIT_INTERRUPTED = ExitCode.FAILED, ExitCode.INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    from dflash.recipe import PRESETS

    parser = argparse.ArgumentParser(
        prog="dflash-train",
        description="Train a DFlash drafter. The environment is checked against "
        "lockfiles/dflash-train.toml first.")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                        help="recipe to start from (default: tiny, about a minute on CPU)")
    parser.add_argument("--target", help="local HF model folder/config, or a named shape")
    parser.add_argument("--data", help="training JSONL (default: generate with the target)")
    parser.add_argument("--steps", type=int, help="optimizer steps")
    parser.add_argument("--out", default="runs/dflash", metavar="DIR",
                        help="run folder: metadata.json, metrics.jsonl, checkpoints/, drafter/")
    parser.add_argument("--resume", action="store_true",
                        help="continue from OUT's latest checkpoint (fresh start if none)")
    parser.add_argument("--warmup-only", action="store_true",
                        help="compile every graph once (fills the compile cache) and exit")
    parser.add_argument("--attention", choices=["auto", "flex", "sdpa"])
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override any recipe field (repeatable)")
    parser.add_argument("--unguarded", action="store_true",
                        help="start even if the environment does not match its lock")
    parser.add_argument("--check", action="store_true",
                        help="only check the environment, write OUT/metadata.json, exit")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.add_argument("--target-ranks", type=int, default=0, metavar="K",
                        help="under torchrun: run the frozen target on the last K ranks, "
                        "which stream features to the drafter ranks (default 0: every "
                        "rank holds the target)")
    return parser


def verify_environment() -> tuple[bool, list[str], str]:
    """(passed, finding titles, how it was checked) for this interpreter's environment."""
    verified = os.environ.get("ENVGUARD_VERIFIED", "")
    if verified.split(":", 1)[0] == LOCK_NAME:
        return True, [], f"verified by envguard run ({verified})"
    from envguard.gate import check, find_lock, project_root_of, read_lock
    from envguard.probe import SnapshotOptions, collect

    path = find_lock(LOCK_NAME, Path.cwd())
    lock = read_lock(path)
    root = project_root_of(path)
    names = {p.name for e in lock.entries for p in e.packages}
    snapshot = collect(SnapshotOptions(
        file_patterns=tuple(str(root / p) for p in lock.file_patterns), cwd=root,
        use_project_config=False, write_cache_marker=False, integrity_only=frozenset(names)))
    result = check(snapshot, lock, str(path), root)
    mismatch = [] if result.passed else [f"[{f.rule}] {f.title}" for f in result.findings]
    return result.passed, mismatch, f"checked {path}"


def _config(args: argparse.Namespace) -> Any:
    from dflash.recipe import PRESETS, apply_overrides

    cfg = PRESETS[args.preset]()
    pairs = [f"out={args.out}"]
    for flag, key in (("target", "target"), ("data", "data"), ("steps", "steps"),
                      ("attention", "attention")):
        value = getattr(args, flag)
        if value is not None:
            pairs.append(f"{key}={value}")
    return apply_overrides(cfg, pairs + list(args.overrides))


def format_record(r: dict[str, Any], total: int) -> str:
    held = f" held-out τ {r['held_out_tau']:.2f}" if "held_out_tau" in r else ""
    loss = "nan" if r["loss"] is None else f"{r['loss']:.4f}"
    return (f"step {r['step']:>6}/{total}  loss {loss}  τ_sim {r['tau_sim']:.2f}{held}  "
            f"ctx {r['ctx_tok_s']:,.0f} tok/s  draft {r['draft_tok_s']:,.0f} tok/s  "
            f"MFU {100 * r['mfu']:.1f}%  {r['step_s'] * 1000:.0f} ms/step")


class _Display:
    """A rich progress bar with the latest metrics on a terminal; plain lines otherwise."""

    def __init__(self, total: int, start: int, quiet: bool) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.total, self.quiet = total, quiet
        self.console = Console(highlight=False)
        self.progress = None
        if not quiet and self.console.is_terminal:
            self.progress = Progress(
                TextColumn("dflash-train"), BarColumn(), MofNCompleteColumn(),
                TimeRemainingColumn(), TextColumn("{task.fields[stats]}", markup=False),
                console=self.console)
            self.task = self.progress.add_task("train", total=total, completed=start,
                                               stats="warming up")

    def __enter__(self) -> _Display:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def __call__(self, record: dict[str, Any]) -> None:
        line = format_record(record, self.total)
        if self.progress is not None:
            self.progress.update(self.task, completed=record["step"],
                                 stats=f"loss {record['loss'] or float('nan'):.3f} "
                                       f"τ {record['tau_sim']:.2f} MFU {100 * record['mfu']:.0f}%")
            self.progress.console.print(line, markup=False)
        elif not self.quiet:
            self.console.print(line, markup=False, soft_wrap=True)


def _train(args: argparse.Namespace, meta: dict[str, Any], world: Any) -> int:
    from dflash.checkpoint import CheckpointError, latest_checkpoint
    from dflash.compilation import CompileStateError
    from dflash.data import DataError
    from dflash.recipe import apply_overrides
    from dflash.target import TargetError
    from dflash.train import Trainer

    stop = threading.Event()
    try:
        cfg = _config(args)
        if world.distributed and cfg.device == "auto":
            import torch

            if torch.cuda.is_available():  # one process per GPU
                cfg = apply_overrides(cfg, [f"device=cuda:{world.local_rank}"])
        out = Path(cfg.out)
        server = None
        if args.target_ranks:
            from dflash.roles import split

            roles, role_world = split(world, args.target_ranks)
            if roles.is_target(world.rank):
                return _serve_target(cfg, roles, world)
            meta["roles"] = {"target_ranks": roles.target_ranks,
                             "drafter_ranks": roles.drafter_ranks}
            server = roles.server_of(world.rank)
            world = role_world
        trainer = Trainer(cfg, world=world, feature_server=server)
        resumed_from = latest_checkpoint(out) if args.resume else None
        if resumed_from is not None:
            trainer.resume(resumed_from)
            if world.is_main:
                print(f"dflash-train: resuming from {resumed_from} at step {trainer.step}")
    except (ValueError, DataError, TargetError, CheckpointError, OSError) as exc:
        print(f"dflash-train: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    meta.update({"config": cfg.to_dict(), "device": str(trainer.rt.device),
                 "dtype": str(trainer.rt.dtype), "attention": trainer.rt.attention,
                 "compile": trainer.rt.compile, "torch": _torch_build(),
                 "world_size": world.size})
    if world.is_main:
        _write_meta(out, meta)

    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: object) -> None:
        stop.set()
        signal.signal(signal.SIGTERM, previous)  # a second SIGTERM is not caught

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        if args.warmup_only or trainer.rt.compile:
            trainer.warmup()
            for warning in trainer.warnings:
                print(f"dflash-train: warning: {warning}", file=sys.stderr)
            if trainer.mega_cache_loaded is not None:
                print(f"dflash-train: compile artifacts loaded from the Mega-Cache in "
                      f"{trainer.mega_cache_loaded:.1f} s")
            elif trainer.mega_cache_saved:
                print(f"dflash-train: saved {trainer.mega_cache_saved / 2**20:.1f} MiB of "
                      "compile artifacts to the Mega-Cache")
        if args.warmup_only:
            seconds = trainer.warmup_seconds
            print(f"dflash-train: warm-up done in {seconds:.1f} s "
                  f"({'compiled' if trainer.rt.compile else 'eager'}); exiting")
            return EXIT_OK
        with _Display(cfg.steps, trainer.step, args.quiet or not world.is_main) as display:
            result = trainer.run(display, stop)
    except (CompileStateError, RuntimeError, CheckpointError) as exc:
        print(f"dflash-train: training failed at step {trainer.step}: "
              f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
              file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("dflash-train: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
        if trainer.remote is not None:
            try:
                trainer.remote.close()
            except RuntimeError as exc:  # the target rank is gone; torchrun reports it
                print(f"dflash-train: rank {world.rank}: could not close the feature "
                      f"stream: {str(exc).splitlines()[0]}", file=sys.stderr)
    if not world.is_main:
        return EXIT_OK
    if result.stopped_early:
        why = "stop_after" if cfg.stop_after and result.step >= cfg.stop_after else "SIGTERM"
        print(f"dflash-train: stopped by {why} at step {result.step}; checkpoint "
              f"{result.checkpoint}; continue with --resume")
    else:
        print(f"dflash-train: done at step {result.step}; drafter in {result.export}")
    return EXIT_OK


def _serve_target(cfg: Any, roles: Any, world: Any) -> int:
    """A target rank: build the frozen target, answer feature requests until every
    drafter rank it serves is done."""
    from dflash.roles import serve
    from dflash.target import load_target
    from dflash.train import resolve

    rt = resolve(cfg)
    target = load_target(cfg.target, device=rt.device, dtype=rt.dtype, layer_ids=cfg.layer_ids,
                         seed=cfg.seed)
    # The first SIGTERM (torchrun forwards one to every rank) is the drafter ranks' cue to
    # checkpoint; they still need features until they say done, so keep serving.
    signal.signal(signal.SIGTERM, lambda *_: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    serve(roles, world.rank, target.features, rt.device)
    return EXIT_OK


def _torch_build() -> dict[str, Any]:
    import torch

    return {"version": torch.__version__, "git": torch.version.git_version,
            "cuda": torch.version.cuda}


def _write_meta(out: Path, meta: dict[str, Any]) -> None:
    from envguard.atomic import write_text_atomic

    write_text_atomic(out / "metadata.json", json.dumps(meta, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from dflash.distributed import detect

    try:
        world = detect()
        if args.target_ranks:  # checked before the process group: every rank stops alike
            from dflash.roles import Roles

            if not world.distributed:
                raise ValueError("--target-ranks needs torchrun (WORLD_SIZE > 1)")
            Roles(world.size, args.target_ranks)
    except ValueError as exc:
        print(f"dflash-train: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        passed, findings, how = verify_environment()
    except Exception as exc:  # noqa: BLE001 - the gate's own errors are one line too
        if not world.distributed:
            print(f"dflash-train: cannot check the environment: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        # Under torchrun every rank must still reach the gather below, or the others hang.
        passed, findings, how = False, [f"cannot check the environment: {exc}"], "failed"
    if world.distributed:
        return _distributed(args, world, passed, findings, how)
    if not passed and not args.unguarded:
        for line in findings:
            print(f"dflash-train: {line}", file=sys.stderr)
        print("dflash-train: refusing to start: the environment does not match its lock "
              "(envguard check dflash-train explains; --unguarded starts anyway)",
              file=sys.stderr)
        return EXIT_REFUSED
    return _start(args, passed, findings, how, None)


def _start(args: argparse.Namespace, passed: bool, findings: list[str], how: str,
           world: Any) -> int:
    from dflash.distributed import World

    world = world or World()
    meta = {"started_at": datetime.now(timezone.utc).isoformat(), "guard": how,
            "unguarded": not passed, "mismatch": findings}
    state = "environment verified" if passed else "UNGUARDED: environment does not match"
    if world.is_main:
        print(f"dflash-train: {state} ({how})")
    if args.check:
        try:
            if world.is_main:
                _write_meta(Path(args.out), meta)
        except OSError as exc:
            print(f"dflash-train: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        return EXIT_OK
    return _train(args, meta, world)


def _distributed(args: argparse.Namespace, world: Any, passed: bool, findings: list[str],
                 how: str) -> int:
    """The gate on every rank; any drifted rank stops all of them, before any training
    collective, so nobody waits forever."""
    import torch

    from dflash.distributed import gather_gate, init, shutdown

    device = torch.device(f"cuda:{world.local_rank}" if torch.cuda.is_available() else "cpu")
    try:
        init(world, device)
    except (RuntimeError, ValueError) as exc:
        print(f"dflash-train: rank {world.rank}: cannot join the process group: "
              f"{str(exc).splitlines()[0]}", file=sys.stderr)
        return EXIT_FAILED
    try:
        failed = gather_gate(world, passed, findings)
        if failed and not args.unguarded:
            if world.is_main:
                for rank, lines in failed:
                    for line in lines or ["(no detail)"]:
                        print(f"dflash-train: rank {rank}: {line}", file=sys.stderr)
                ranks = ", ".join(str(r) for r, _ in failed)
                print(f"dflash-train: refusing to start: rank(s) {ranks} of {world.size} do "
                      "not match the lock (envguard check dflash-train on that node explains; "
                      "--unguarded starts anyway)", file=sys.stderr)
            return EXIT_REFUSED
        return _start(args, not failed, [f"rank {r}: {x}" for r, ls in failed for x in ls],
                      how, world)
    finally:
        shutdown(world)


if __name__ == "__main__":
    sys.exit(main())
