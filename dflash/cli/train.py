"""``dflash-train``: the trainer's console script, guarded by envguard.

It refuses to start unless its environment matches ``lockfiles/dflash-train.toml``
(:mod:`dflash.cli.gate`); ``--unguarded`` starts anyway and writes the mismatch into the
run's metadata. ``--check`` stops after the check (a preflight for job scripts).
Under torchrun: ``torchrun --nproc-per-node N -m dflash.cli.train ...``.

Order: flags, recipe and paths are checked first (no torch yet: bad input is one line
within a second), then the environment gate (in a forked child while torch is imported:
nothing is built, compiled or written before it passes), then the model and the run.

Exit codes: 0 trained (or stopped by SIGTERM after saving a checkpoint), 2 bad
input or config, 3 refused by the environment gate, 4 training failed at runtime,
130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import signal
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash.checkpoint.layout import earlier_run, latest_checkpoint
from dflash.cli import options
from dflash.cli.command import Command
from dflash.cli.command import entry as command_entry
from dflash.cli.display import held_out_line
from dflash.cli.gate import Gate, gather, refuse, start_gate
from dflash.cli.heartbeat import DEFAULT_SECONDS
from dflash.cli.reporting import CHOICES, check_installed
from dflash.config import TrainConfig, kernels_for
from dflash.distributed.world import Roles, World, barrier, detect, init, shutdown
from dflash.errors import CheckpointError, ConfigError
from dflash.exitcodes import ExitCode
from dflash.presets import PRESETS, apply_overrides, target_path
from envguard.render.sanitize import escape_controls

if TYPE_CHECKING:
    from dflash.train import Trainer

PROG = "dflash-train"
ENV_FILE = "env.json"
"""The run folder's copy of the snapshot the environment gate took."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
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
    parser.add_argument("--held-out-decode-prompts", "--heldout-decode-prompts", type=int,
                        metavar="N", help="at each evaluation, decode N held-out prompts "
                        "with the drafter against the target for a free-running τ beside "
                        "the teacher-forced one (default 4; 0: off)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override any recipe field (repeatable)")
    parser.add_argument("--unguarded", action="store_true",
                        help="start even if the environment does not match its lock")
    parser.add_argument("--check", action="store_true",
                        help="only check the environment, write OUT/metadata.json, exit")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress display (nor heartbeat lines)")
    parser.add_argument("--log-every-seconds", type=float, default=DEFAULT_SECONDS,
                        metavar="S", help="when stderr is not a terminal: a progress line "
                        "there every S seconds (default 30; 0: none by time)")
    parser.add_argument("--log-every-steps", type=int, default=0, metavar="N",
                        help="when stderr is not a terminal: a progress line every N steps "
                        "(default 0: none by steps)")
    parser.add_argument("--report-to", choices=CHOICES, default="none",
                        help="also log the metrics to wandb or tensorboard (that library "
                        "must be installed; default none)")
    parser.add_argument("--target-ranks", type=int, default=0, metavar="K",
                        help="under torchrun: run the frozen target on the last K ranks, "
                        "which stream features to the drafter ranks (default 0: every "
                        "rank holds the target)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = Command(PROG)
    return command.run(lambda: _main(command, args))


def _main(command: Command, args: argparse.Namespace) -> int:
    cfg = config_of(args)
    resume_from = check_inputs(cfg, resume=args.resume)
    options.at_least("--log-every-seconds", args.log_every_seconds, 0)
    options.at_least("--log-every-steps", args.log_every_steps, 0)
    check_installed(args.report_to)  # before anything is loaded: one line, exit 2
    world = detect()
    if args.target_ranks:  # checked before the process group: every rank stops alike
        if not world.distributed:
            raise ConfigError("--target-ranks needs torchrun (WORLD_SIZE > 1)")
        Roles(world.size, args.target_ranks)
    pending = start_gate(world)  # in a child: torch is imported meanwhile
    try:
        start = time.perf_counter()
        if not args.check:
            _import_torch()
        imported = time.perf_counter() - start
        gate = pending.result()
    finally:
        pending.abandon()
    gate = dataclasses.replace(
        gate, seconds={**pending.seconds, "import_torch": round(imported, 3)})
    if world.distributed:
        return _distributed(command, args, cfg, resume_from, world, gate)
    if not gate.passed and not args.unguarded:
        raise refuse(gate)
    return _start(command, args, cfg, resume_from, world, gate)


def _import_torch() -> None:
    """torch's import, while the gate runs beside it. One that fails here is left for the
    run's own import to raise again, after the gate has spoken."""
    from dflash.compilation.imports import import_torch

    with contextlib.suppress(Exception):  # raised again, reported, where the run imports it
        import_torch()


def config_of(args: argparse.Namespace) -> TrainConfig:
    """The preset with the flags and ``--set`` pairs applied (ConfigError if invalid)."""
    pairs = [f"out={args.out}"]
    for flag in ("target", "data", "steps", "attention", "held_out_decode_prompts"):
        value = getattr(args, flag)
        if value is not None:
            pairs.append(f"{flag}={value}")
    return apply_overrides(PRESETS[args.preset](), pairs + list(args.overrides))


def check_inputs(cfg: TrainConfig, *, resume: bool) -> Path | None:
    """The recipe's paths, before anything is loaded; returns the checkpoint to resume."""
    target_path(cfg.target)
    if cfg.data:
        options.readable_file(cfg.data)
    if cfg.device != "auto":  # the attention/compile choice for a named device
        kernels_for(cfg, gpu=cfg.device.startswith("cuda"))
    out = options.output_folder(cfg.out, "--out")
    if resume:
        return latest_checkpoint(out)
    earlier = earlier_run(out)
    if earlier is not None:  # a new run would log and checkpoint into an earlier run's files
        raise CheckpointError(f"--out {out} holds an earlier run: {earlier}; continue it with "
                              "--resume, or name a new folder")
    return None


def _distributed(command: Command, args: argparse.Namespace, cfg: TrainConfig,
                 resume_from: Path | None, world: World, gate: Gate) -> int:
    import torch

    init(world, torch.device(f"cuda:{world.local_rank}" if torch.cuda.is_available() else "cpu"))
    try:
        gate = gather(world, gate, args.unguarded)
        code = _start(command, args, cfg, resume_from, world, gate)
        # Every rank done before any leaves the group: rank 0 exports alone at the end,
        # and gloo sometimes aborts a rank that leaves while another still works.
        barrier(world)
        return code
    finally:
        shutdown(world)


def _start(command: Command, args: argparse.Namespace, cfg: TrainConfig,
           resume_from: Path | None, world: World, gate: Gate) -> int:
    meta: dict[str, Any] = {"started_at": datetime.now(timezone.utc).isoformat(),
                            "guard": gate.how, "unguarded": not gate.passed,
                            "mismatch": gate.findings, "gate_s": gate.seconds}
    state = "environment verified" if gate.passed else "UNGUARDED: environment does not match"
    if gate.snapshot_json is not None:
        meta["environment"] = {"file": ENV_FILE, "sha256": gate.snapshot_sha256}
    if world.is_main:
        print(f"{PROG}: {state} ({escape_controls(gate.how)})")
        if gate.snapshot_json is not None:
            _write_env(Path(cfg.out), gate.snapshot_json)
    if args.check:
        if world.is_main:
            _write_meta(Path(cfg.out), meta)
        return ExitCode.OK
    gate.share_compat_key()
    return _train(command, args, cfg, resume_from, world, meta)


def _train(command: Command, args: argparse.Namespace, cfg: TrainConfig,
           resume_from: Path | None, world: World, meta: dict[str, Any]) -> int:
    import torch

    from dflash.heldout import report as heldout_report
    from dflash.train import Trainer

    if world.distributed and cfg.device == "auto" and torch.cuda.is_available():
        cfg = dataclasses.replace(cfg, device=f"cuda:{world.local_rank}")  # one GPU a rank
    server = None
    if args.target_ranks:
        from dflash.distributed.roles import split

        roles, role_world = split(world, args.target_ranks)
        if roles.is_target(world.rank):
            return _serve_target(cfg, roles, world)
        meta["roles"] = {"target_ranks": roles.target_ranks,
                         "drafter_ranks": roles.drafter_ranks}
        server = roles.server_of(world.rank)
        world = role_world
    from dflash.cli.display import StartPhases
    from dflash.cli.heartbeat import heartbeat_for

    quiet = args.quiet or not world.is_main
    phases = StartPhases(quiet)
    beat = heartbeat_for(quiet=quiet, every_seconds=args.log_every_seconds,
                         every_steps=args.log_every_steps)
    try:
        trainer = Trainer(cfg, world=world, feature_server=server, on_phase=phases,
                          shapes_only=args.warmup_only,
                          on_tick=beat if beat is not None else phases.tick)
    finally:
        phases.close()
    trainer.environment = meta.get("environment")  # each checkpoint names env.json's digest
    if resume_from is not None:
        trainer.resume(resume_from)
        if world.is_main:
            print(f"{PROG}: resuming from {escape_controls(str(resume_from))} at step "
                  f"{trainer.state.step}")
    meta.update({"config": cfg.to_dict(), "device": str(trainer.rt.device),
                 "dtype": str(trainer.rt.dtype), "attention": trainer.rt.attention,
                 "compile": trainer.rt.compile, "torch": _torch_build(),
                 "world_size": world.size})
    if world.is_main:
        _write_meta(Path(cfg.out), meta)

    command.failing = lambda: f"training failed at step {trainer.state.step}"
    stop = threading.Event()
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: object) -> None:
        stop.set()
        signal.signal(signal.SIGTERM, previous)  # a second SIGTERM is not caught

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        try:
            if args.warmup_only or trainer.rt.compile:
                trainer.warmup()
                _report_warmup(command, trainer)
            if not args.warmup_only:
                trainer.peak_tflops()
        finally:
            phases.close()
        if world.is_main:  # now with the seconds of every start phase
            _write_meta(Path(cfg.out), {**meta, "start_s": trainer.start_phases})
        if args.warmup_only:
            print(f"{PROG}: warm-up done in {trainer.warm.seconds:.1f} s "
                  f"({'compiled' if trainer.rt.compile else 'eager'}); exiting")
            return ExitCode.OK
        from dflash.cli.display import Display
        from dflash.cli.reporting import open_reporter

        reporter = (open_reporter(args.report_to, Path(cfg.out), cfg.to_dict())
                    if world.is_main else None)
        try:
            with Display(cfg.steps, trainer.state.step, quiet) as show:

                def on_log(record: dict[str, Any]) -> None:
                    show(record)
                    if reporter is not None:
                        reporter.log(record)

                result = trainer.run(on_log, stop)
        finally:
            if reporter is not None:
                reporter.close()
    finally:
        signal.signal(signal.SIGTERM, previous)
        warning = trainer.close()
        if warning is not None:
            command.say(warning)
    if world.is_main:
        held = heldout_report(trainer.cfg, trainer.split, len(trainer.decode_prompts),
                             result.held_out)
        _write_meta(Path(cfg.out), {**meta, "start_s": trainer.start_phases, "held_out": held})
        if (line := held_out_line(held)) is not None:
            print(f"{PROG}: {line}")
        if result.stopped_early:
            why = "stop_after" if cfg.stop_after and result.step >= cfg.stop_after else "SIGTERM"
            print(f"{PROG}: stopped by {why} at step {result.step}; checkpoint "
                  f"{escape_controls(str(result.checkpoint))}; continue with --resume")
        else:
            ran_out = f" ({cfg.max_seconds:g} s, max_seconds)" if result.timed_out else ""
            print(f"{PROG}: done at step {result.step}{ran_out}; drafter in "
                  f"{escape_controls(str(result.export))}")
        if result.export is not None:
            _serving_check(command, result.export, cfg.target)
    return ExitCode.OK


def _serving_check(command: Command, export: Path, target: str) -> None:
    """``dflash-eval --check-config`` on the export, as lines; a training that ran to its
    end is not failed for a note."""
    from dflash.cli import check_config
    from dflash.errors import DFlashError

    try:
        lines = check_config.lines(check_config.check(export, target))
    except DFlashError as exc:
        command.say(f"serving check not done: {exc}")
        return
    for line in lines:
        print(f"{PROG}: serving check: {escape_controls(line)}")


def _report_warmup(command: Command, trainer: Trainer) -> None:
    for warning in trainer.warm.warnings:
        command.say(f"warning: {warning}")
    if trainer.warm.mega_loaded is not None:
        print(f"{PROG}: compile artifacts loaded from the Mega-Cache in "
              f"{trainer.warm.mega_loaded:.1f} s")
    elif trainer.warm.mega_saved:
        print(f"{PROG}: saved {trainer.warm.mega_saved / 2**20:.1f} MiB of "
              "compile artifacts to the Mega-Cache")


def _serve_target(cfg: TrainConfig, roles: Roles, world: World) -> int:
    """A target rank: build the frozen target, answer feature requests until every
    drafter rank it serves is done."""
    from dflash.distributed.roles import serve
    from dflash.parallelize import resolve
    from dflash.target import load_target

    rt = resolve(cfg)
    target = load_target(cfg.target, device=rt.device, dtype=rt.dtype, layer_ids=cfg.layer_ids,
                         seed=cfg.seed)
    # The first SIGTERM (torchrun forwards one to every rank) is the drafter ranks' cue to
    # checkpoint; they still need features until they say done, so keep serving.
    signal.signal(signal.SIGTERM, lambda *_: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    serve(roles, world.rank, target.features, rt.device)
    return ExitCode.OK


def _torch_build() -> dict[str, Any]:
    import torch

    return {"version": torch.__version__, "git": torch.version.git_version,
            "cuda": torch.version.cuda}


def _write_env(out: Path, text: str) -> None:
    """The gate's snapshot as the run folder's env.json (``envguard diff RUN_A/env.json
    RUN_B/env.json`` compares two runs' environments)."""
    from envguard.atomic import write_text_atomic

    write_text_atomic(out / ENV_FILE, text)


def _write_meta(out: Path, meta: dict[str, Any]) -> None:
    from envguard.atomic import write_text_atomic

    write_text_atomic(out / "metadata.json", json.dumps(meta, indent=2, default=str) + "\n")


def entry() -> int:
    """The console script and ``python -m``: :func:`main`, with compiled modules kept
    (:func:`dflash.cli.command.entry`)."""
    return command_entry(main)


if __name__ == "__main__":  # torchrun --nproc-per-node N -m dflash.cli.train ...
    sys.exit(entry())
