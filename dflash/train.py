"""The DFlash training loop: one process, one device (torchrun runs one per GPU).

Order of events, which is what makes torch.compile race-free here:
1. build target, drafter, optimizer and data on the main thread; :func:`parallelize`
   places the drafter (FSDP2 under torchrun) and makes the attention kernels (nothing
   traced: on a GPU the target generates its synthetic data meanwhile in a thread,
   eager and greedy, :class:`dflash.dataphase.DataPhase`);
2. warm-up (:mod:`dflash.warmup`): one full step (forward + backward) per batch shape,
   still on the main thread, with its own RNG so training is unaffected (the held-out
   evaluation's no-grad forward attends with SDPA and a dense mask: nothing compiled).
   Where the data is generated beside, it begins once that thread only replays its
   recorded decode step (no compiled code, no tracing, nothing allocated), with random
   features, and the data is taken after it;
3. seal compilation (``fail_on_recompile``; the global FX flag must be clear);
4. only then start the prefetch thread, and train.

A step has fixed shapes and no host sync; metrics stay on the device and are read every
``log_every`` steps. What a checkpoint must hold to continue exactly (step, optimizer with
the master weights, RNG, data position) is :class:`TrainState` (:mod:`dflash.state`);
:mod:`dflash.checkpoint.resume` writes and reads it in either mode. What happens before
the first step, phase by phase and timed, is :mod:`dflash.startup`.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from dflash.batching import BatchLoader, Prefetcher, RankSlice
from dflash.checkpoint import resume as checkpoint
from dflash.checkpoint.layout import METRICS_NAME
from dflash.compilation.kernels import require_main_thread
from dflash.config import DrafterConfig, TrainConfig
from dflash.data import Example
from dflash.dataphase import DataPhase
from dflash.distributed.roles import FeatureClient, Lookahead
from dflash.distributed.stop import Stop, StopVote
from dflash.distributed.world import World
from dflash.flops import count_params, flop_model, visible_pairs
from dflash.heldout import decode_path, decode_prompts, evaluate, teacher_forced_tau
from dflash.loss import LossOutput, block_inputs, block_targets, dflash_loss, sample_anchors
from dflash.masks import (
    TILE,
    AttendFn,
    block_mask_from_anchors,
    dense_mask,
    dflash_block_mask,
    flex_attend,
    sdpa_attend,
)
from dflash.meter import Meter, MetricsLog, remembered_peak, sync_device
from dflash.optim import MasterAdamW, lr_at
from dflash.parallelize import parallelize, resolve
from dflash.serving import export_record
from dflash.startup import (
    PhaseListener,
    StartClock,
    build_drafter,
    check_against_target,
    check_decode_positions,
    generation_batch,
    remembered_path,
    synthetic_shapes,
)
from dflash.state import TrainState
from dflash.stdlib_target import cache_root
from dflash.target import TargetModel, drafter_config_for, load_target, target_text
from dflash.ticks import Tick, TickFn, Values
from dflash.warmup import WarmUp, warms_up_beside

LogFn = Callable[[dict[str, Any]], None]
__all__ = ["StepResult", "TrainResult", "TrainState", "Trainer"]


@dataclass(frozen=True, slots=True)
class StepResult:
    out: LossOutput
    pairs: Tensor
    """Visible (query, key) pairs, for the FLOP count."""
    grad_norm: Tensor
    lr: float


@dataclass(frozen=True, slots=True)
class TrainResult:
    step: int
    stopped_early: bool
    timed_out: bool
    """Ended by ``max_seconds`` before ``steps`` (evaluated and exported as at ``steps``)."""
    warmup_seconds: float
    checkpoint: Path | None
    export: Path | None
    last: dict[str, Any]
    held_out: dict[str, Any]  # the last held-out evaluation (empty when none ran)


class Trainer:
    def __init__(self, cfg: TrainConfig, *, target: TargetModel | None = None,
                 examples: list[Example] | None = None, world: World | None = None,
                 feature_server: int | None = None, on_phase: PhaseListener | None = None,
                 shapes_only: bool = False, on_tick: TickFn | None = None) -> None:
        """``feature_server``: with split roles, the global rank of this rank's target
        rank; features then come from there, and the local target keeps only its
        embedding and LM head. ``on_phase`` hears each start phase (``start_phases``
        keeps their seconds). ``shapes_only``: the run only warms up, so without a data
        file no data is generated (:func:`dflash.startup.training_examples`). ``on_tick``
        hears every step of the target's pretraining (when it has one) and of training."""
        require_main_thread("building the trainer")
        self.cfg = cfg
        self.world = world or World()
        self.rt = resolve(cfg)
        self.out = Path(cfg.out)
        self.clock = StartClock(self.rt.device, on_phase)
        self.start_phases = self.clock.seconds
        self.on_tick = on_tick
        """Seconds per start phase: target, drafter, parallelize, data, then warmup (and
        peak, when the run measures the matmul peak)."""
        torch.manual_seed(cfg.seed)
        loaded_here = target is None  # then cfg.target names it: its data may be cached
        if target is None:
            with self.clock.phase("target", target_text(cfg.target)):
                target = load_target(cfg.target, device=self.rt.device, dtype=self.rt.dtype,
                                     layer_ids=cfg.layer_ids, seed=cfg.seed, on_tick=on_tick)
        self.target = target
        check_against_target(cfg, target, generates=not (examples or shapes_only or cfg.data))
        with self.clock.phase("drafter", f"building the drafter ({cfg.draft_layers} layers)"):
            self.dcfg: DrafterConfig = drafter_config_for(
                self.target, num_layers=cfg.draft_layers, block_size=cfg.block_size,
                gamma=cfg.gamma, mask_token_id=cfg.mask_token_id)
            self.drafter = build_drafter(self.dcfg, self.rt.device)
        batch = generation_batch(self.target, cfg)  # the key's and the loop's, read once
        remembered = (remembered_path(cfg, self.target, cache_root(), batch)
                      if loaded_here and examples is None and not cfg.data and not shapes_only
                      else None)
        data = DataPhase(self.clock, cfg, self.target, examples=examples,
                         shapes_only=shapes_only, ranks=self.world.size, remembered=remembered,
                         batch=batch)
        how = (f"sharding the drafter over {self.world.size} ranks (FSDP2)"
               if self.world.distributed else f"placing the drafter on {self.rt.device}")
        with self.clock.phase("parallelize", data.meanwhile(how)), data.alongside():
            self.kernels = parallelize(self.drafter, self.rt, self.world, cfg.mega_cache)
            optimizer = MasterAdamW(self.drafter, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                    weight_decay=cfg.weight_decay,
                                    kernel=cfg.optimizer_kernel == "auto")
        self.warm = WarmUp(clock=self.clock, device=self.rt.device,
                           vocab_size=self.dcfg.vocab_size, seed=cfg.seed,
                           compiled=self.kernels.compiled, mega_cache=cfg.mega_cache)
        if warms_up_beside(data, self.kernels.compiled, not self.world.distributed):
            with data.alongside():
                self.warm.beside(data, synthetic_shapes(cfg), self._warm_loss,
                                 self.drafter.parameters,
                                 (self.target.feature_dim, self.target.dtype))
        split = data.result()  # on a GPU it frees what the data's loop had cached
        train, self.held_out = split.train, split.held_out
        self.split = split.summary()  # rows and sources on each side
        self.decode_prompts = decode_prompts(self.held_out, cfg.held_out_decode_prompts)
        if feature_server is None:  # with split roles a drafter rank decodes nothing
            check_decode_positions(cfg, self.target, self.decode_prompts)
        if self.decode_prompts and not self.target.released:
            decode_path(cfg, self.target)  # a static cycle this target cannot run: refused now
        batches = BatchLoader(train, batch_size=cfg.batch_size, buckets=cfg.buckets,
                              seed=cfg.seed, pad_id=0)
        loader = RankSlice(batches, self.world) if self.world.distributed else batches
        anchor_gen = torch.Generator(device=self.rt.device).manual_seed(
            cfg.seed + self.world.rank)
        self.state = TrainState(step=0, optimizer=optimizer, loader=loader,
                                loader_state=loader.state_dict(), anchor_gen=anchor_gen)
        layers = self.target.layers[: max(self.dcfg.target_layer_ids) + 1]
        self.flops = flop_model(self.dcfg, count_params(layers),
                                count_params(self.drafter.layers[0]))
        self._peak = cfg.peak_tflops
        self.environment: dict[str, str] | None = None
        """``{"file": "env.json", "sha256": ...}``: the snapshot of the environment this run
        was started in (``dflash-train`` sets it); every checkpoint's trainer.pt names it."""
        self.remote: FeatureClient | None = None
        if feature_server is not None:
            self.remote = FeatureClient(feature_server, self.target.feature_dim,
                                        self.target.dtype, self.rt.device)
            self.target.release_layers()

    # -- one step -------------------------------------------------------------------------
    def _attend(self, anchors_BN: Tensor, keep_BN: Tensor, seq: int, dense: bool) -> AttendFn:
        bs = self.dcfg.block_size
        if self.rt.attention == "flex" and not dense:
            if TILE % bs == 0:  # tile map from the anchors: nothing to compile
                mask = block_mask_from_anchors(anchors_BN, keep_BN, seq, bs)
            else:
                mask = dflash_block_mask(anchors_BN, keep_BN, seq, bs,
                                         builder=self.kernels.block_mask_builder)
            return flex_attend(mask, flex_fn=self.kernels.flex)
        return sdpa_attend(dense_mask(anchors_BN, keep_BN, seq, bs))

    def forward_loss(self, input_ids_BS: Tensor, loss_mask_BS: Tensor, gen: torch.Generator,
                     feats_BSF: Tensor | None = None, *,
                     dense: bool = False) -> tuple[LossOutput, Tensor]:
        """The loss of one batch. ``dense``: SDPA and the dense mask, never the compiled flex
        kernel (the no-grad evaluation: a no-grad flex call is a graph of its own)."""
        bs, seq = self.dcfg.block_size, input_ids_BS.shape[1]
        if feats_BSF is None:
            feats_BSF = (self.remote.features(input_ids_BS) if self.remote is not None
                         else self.target.features(input_ids_BS))
        feats_BSF = feats_BSF.to(self.rt.dtype)
        anchors_BN, keep_BN = sample_anchors(loss_mask_BS, self.cfg.anchors, bs, gen)
        ids_BQ, pos_BQ = block_inputs(input_ids_BS, anchors_BN, bs, self.dcfg.mask_token_id)
        labels_BQ, weights_BQ = block_targets(input_ids_BS, loss_mask_BS, anchors_BN, keep_BN,
                                              bs, self.dcfg.gamma)
        with torch.no_grad():
            emb_BQD = self.target.embed(ids_BQ).to(self.rt.dtype)
        pos_ctx_BS = torch.arange(seq, device=input_ids_BS.device).expand_as(input_ids_BS)
        hidden_BQD = self.drafter(emb_BQD, feats_BSF, pos_BQ, pos_ctx_BS,
                                  self._attend(anchors_BN, keep_BN, seq, dense))
        out = dflash_loss(hidden_BQD, labels_BQ, weights_BQ, self.target.lm_head, bs,
                          chunk_size=self.cfg.loss_chunk, select_supervised=False)
        return out, visible_pairs(anchors_BN, keep_BN, bs)

    def train_step(self, input_ids_BS: Tensor, loss_mask_BS: Tensor,
                   feats_BSF: Tensor | None = None) -> StepResult:
        state = self.state
        out, pairs = self.forward_loss(input_ids_BS, loss_mask_BS, state.anchor_gen, feats_BSF)
        out.loss.backward()  # type: ignore[no-untyped-call]
        lr = lr_at(state.step, base_lr=self.cfg.lr, total_steps=self.cfg.steps,
                   warmup_ratio=self.cfg.warmup_ratio, min_lr_ratio=self.cfg.min_lr_ratio)
        grad_norm = state.optimizer.step(lr, self.cfg.grad_clip)
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a replicated DTensor
            grad_norm = grad_norm.full_tensor()
        state.step += 1
        return StepResult(out, pairs, grad_norm, lr)

    # -- warm-up (dflash.warmup) ------------------------------------------------------------
    def warmup(self) -> float:
        """Compile every graph a step can need, on the main thread, then seal; shapes
        warmed beside the data already are not warmed again. The warm-up's seconds."""
        return self.warm.run(self.state.loader.shapes(), self._warm_loss,
                             self.drafter.parameters)

    def _warm_loss(self, ids_BS: Tensor, mask_BS: Tensor, gen: torch.Generator,
                   feats_BSF: Tensor | None) -> Tensor:
        return self.forward_loss(ids_BS, mask_BS, gen, feats_BSF)[0].loss

    # -- held-out evaluation (dflash.heldout) ----------------------------------------------
    def held_out_tau_random(self) -> float:
        """Teacher-forced tau at random held-out anchors, the same anchors every call
        (dense attention: nothing compiled runs without gradients)."""
        return teacher_forced_tau(functools.partial(self.forward_loss, dense=True),
                                  self.held_out,
                                  batch_size=self.cfg.batch_size, buckets=self.cfg.buckets,
                                  seed=self.cfg.seed, device=self.rt.device)

    def evaluate_held_out(self) -> dict[str, float]:
        """``held_out_tau`` (decoding replayed teacher forced), ``held_out_tau_random``, and
        the free-running ``held_out_decode_tau`` with the ratio (:func:`heldout.evaluate`)."""
        return evaluate(self.cfg, self.held_out_tau_random(), self.target, self.drafter,
                        self.world, self.held_out, self.decode_prompts,
                        device=self.rt.device, dtype=self.rt.dtype)

    # -- checkpoints (dflash.checkpoint.resume does the work, in either mode) ---------------
    def save(self) -> Path:
        return checkpoint.save(self.out, self.state.state_dict(self.cfg, self.rt.device,
                                                               self.environment),
                               self.drafter, self.state.optimizer, self.world,
                               self.cfg.keep_checkpoints)

    def resume(self, folder: Path) -> None:
        resumed = checkpoint.resume(folder, self.drafter, self.state.optimizer, self.world,
                                    self.rt.device)  # a rank it lacks: a fresh, distinct stream
        self.state.continue_at(resumed, self.cfg.seed + self.world.rank + 7919 * resumed.step)

    def close(self) -> str | None:
        """Close the feature stream of split roles (a message if the target rank is gone:
        torchrun reports that rank's failure itself)."""
        if self.remote is None:
            return None
        try:
            self.remote.close()
        except RuntimeError as exc:
            return (f"rank {self.world.rank}: could not close the feature stream: "
                    f"{str(exc).splitlines()[0]}")
        return None

    def peak_tflops(self) -> float:
        """The MFU denominator: the recipe's ``peak_tflops``, else measured once per GPU
        model and torch build (a start phase; :func:`dflash.meter.remembered_peak`)."""
        if not self._peak:
            with self.clock.phase("peak", "measuring the matmul peak (for MFU)"):
                self._peak = remembered_peak(self.rt.device, self.rt.dtype, cache_root())
        return self._peak

    # -- the loop ---------------------------------------------------------------------------
    def run(self, on_log: LogFn | None = None, stop: threading.Event | None = None,
            final_save: bool = True) -> TrainResult:
        """Train to ``cfg.steps`` or for ``cfg.max_seconds`` (or until ``stop``); the last
        step is logged with a held-out evaluation; then checkpoint and, unless stopped
        early, export the drafter. ``final_save=False`` skips both (benchmarks)."""
        require_main_thread("training")
        cfg = self.cfg
        if self.kernels.compiled:
            self.warmup()  # nothing left to do after dflash-train's own call
        peak = self.peak_tflops()
        main = self.world.is_main
        log = MetricsLog(self.out / METRICS_NAME, after=self.state.step) if main else None
        state = self.state
        prefetch = Prefetcher(state.loader, self.rt.device).start()
        ahead = Lookahead(self.remote) if self.remote is not None else None
        meter = Meter()
        last: dict[str, Any] = {}
        saved: Path | None = None
        stopped = timed_out = False
        vote = StopVote(self.world)  # a SIGTERM or the time budget: every rank at one step
        tick = self.on_tick if main else None
        held: Values = {}  # the latest held-out figures, for the heartbeat
        try:
            t0 = start = time.perf_counter()
            if tick is not None:
                tick(Tick(work="training", step=state.step, total=cfg.steps, tokens=0))

            def log_point(evaluate: bool) -> None:
                """Record the steps since the last log point (if any), with a held-out
                evaluation when asked; one line of metrics.jsonl, one ``on_log``."""
                nonlocal meter, last, t0
                if meter.steps:
                    sync_device(self.rt.device)
                    last = meter.record(step=state.step, seconds=time.perf_counter() - t0,
                                        flops=self.flops, peak_tflops=peak, world=self.world,
                                        device=self.rt.device)
                if evaluate:  # its step is logged too, whatever log_every says
                    held.update(self.evaluate_held_out(), step=state.step)
                    last = {**last, **held}  # a record already handed out stays as it was
                if log is not None:
                    log.write(last)
                if on_log is not None and main:
                    on_log(last)
                meter = Meter()
                t0 = time.perf_counter()

            while state.step < cfg.steps:
                over = bool(cfg.max_seconds) and time.perf_counter() - start >= cfg.max_seconds
                decided = vote(Stop.SIGNAL if stop is not None and stop.is_set()
                               else Stop.TIME if over else Stop.NONE)
                if decided is Stop.SIGNAL or (cfg.stop_after and state.step >= cfg.stop_after):
                    stopped = True
                    break
                if decided is Stop.TIME:
                    timed_out = True
                    break
                ids_BS, mask_BS, loader_state, feats_BSF = self._next(prefetch, ahead)
                step = self.train_step(ids_BS, mask_BS, feats_BSF)
                state.loader_state = loader_state
                meter.add(step.out, step.pairs, step.grad_norm, step.lr, ids_BS.numel(),
                          mask_BS.shape[0] * cfg.anchors * cfg.block_size)
                if tick is not None:
                    tick(Tick(work="training", step=state.step, total=cfg.steps,
                              tokens=ids_BS.numel() * self.world.size,
                              read=meter.reader(held)))
                final = state.step == cfg.steps
                evaluating = bool(cfg.eval_every) and (state.step % cfg.eval_every == 0 or final)
                if state.step % cfg.log_every == 0 or final or evaluating:
                    log_point(evaluating)
                if cfg.save_every and state.step % cfg.save_every == 0:
                    meter.check_finite(state.step)  # no checkpoint of weights gone NaN
                    saved = self.save()
            unevaluated = bool(cfg.eval_every) and held.get("step") != state.step
            if timed_out and state.step and (meter.steps or unevaluated):
                # The budget's last step, as at ``steps``: logged, with a last evaluation
                # (a step already logged is written again with it).
                log_point(unevaluated)
            vote.close()
        finally:
            if ahead is not None:  # an answer asked for ahead must still be taken
                ahead.drain()
            prefetch.close()
            if log is not None:
                log.close()
        if final_save and (saved is None or not saved.name.endswith(f"{state.step:08d}")):
            meter.check_finite(state.step)  # steps since the last log point, as at a save
            saved = self.save()
        export = None
        if final_save and not stopped:
            export = checkpoint.export(self.out, self.drafter, self.world, self.rt.dtype,
                                       export_record(cfg.target, self.target))
        return TrainResult(step=state.step, stopped_early=stopped, timed_out=timed_out,
                           warmup_seconds=self.warm.seconds, checkpoint=saved, export=export,
                           last=last, held_out=held)

    def _next(self, prefetch: Prefetcher, ahead: Lookahead | None
              ) -> tuple[Tensor, Tensor, dict[str, Any], Tensor | None]:
        """The next batch, and its features when they come from a target rank (split
        roles: asked for one batch ahead, unless this is the last step)."""
        if ahead is None:
            return (*prefetch.get(), None)
        last = min(self.cfg.steps, self.cfg.stop_after or self.cfg.steps)
        batch, feats_BSF = ahead.next(prefetch.get, more=self.state.step + 1 < last)
        return (*batch, feats_BSF)
