"""GPU-only checks: flex_attention has no backward on CPU, so flex = SDPA for gradients,
and the compiled training step, are verified on a CUDA machine. Skipped without one;
``benchmarks/gpu_dflash.py --stages gpu-tests`` runs them on the H200 (with or without
pytest installed there) and records the outcome."""

from __future__ import annotations

import dataclasses

import torch

try:
    import pytest

    gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
except ImportError:  # the benchmark machine may lack pytest; the runner calls these directly
    def gpu(f):  # type: ignore[no-untyped-def]
        return f

from dflash.compilation.kernels import kernels, unseal
from dflash.loss import block_inputs, sample_anchors
from dflash.masks import dense_mask, dflash_block_mask, flex_attend, sdpa_attend
from dflash.model import DFlashDrafter
from dflash.presets import tiny_drafter


def _grads(drafter: DFlashDrafter) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in drafter.named_parameters()
            if p.grad is not None}


@gpu
def test_flex_equals_sdpa_forward_and_backward_on_gpu() -> None:
    unseal()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    cfg = dataclasses.replace(tiny_drafter(), block_size=8)
    drafter = DFlashDrafter(cfg).to(dev)
    bsz, seq = 2, 200  # N*B = 17*8 = 136: not a multiple of 128
    ids = torch.randint(0, cfg.vocab_size - 1, (bsz, seq), device=dev)
    loss_mask = torch.ones_like(ids)
    loss_mask[1, 10:] = 0  # row 1 has only 10 valid anchors: 7 padding blocks
    anchors, keep = sample_anchors(loss_mask, 17, cfg.block_size,
                                   torch.Generator(device=dev).manual_seed(1))
    assert not bool(keep.all())
    feats = torch.randn(bsz, seq, cfg.num_features * cfg.hidden_size, device=dev)
    emb = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size).to(dev)
    ids_q, pos_q = block_inputs(ids, anchors, cfg.block_size, cfg.mask_token_id)
    pos_ctx = torch.arange(seq, device=dev).expand(bsz, seq)
    probe = torch.randn(bsz, ids_q.shape[1], cfg.hidden_size, device=dev)
    outs, grads = {}, {}
    ker = kernels(True)
    for kind in ("flex", "sdpa"):
        drafter.zero_grad(set_to_none=True)
        if kind == "flex":
            attend = flex_attend(dflash_block_mask(anchors, keep, seq, cfg.block_size,
                                                   builder=ker.block_mask_builder),
                                 flex_fn=ker.flex)
        else:
            attend = sdpa_attend(dense_mask(anchors, keep, seq, cfg.block_size))
        out = drafter(emb(ids_q).detach(), feats, pos_q, pos_ctx, attend)
        (out * probe).sum().backward()
        outs[kind], grads[kind] = out.detach(), _grads(drafter)
    torch.testing.assert_close(outs["flex"], outs["sdpa"], rtol=2e-4, atol=2e-4)
    assert grads["flex"].keys() == grads["sdpa"].keys() and grads["flex"]
    for name in grads["flex"]:
        torch.testing.assert_close(grads["flex"][name], grads["sdpa"][name], rtol=2e-3,
                                   atol=2e-4, msg=lambda m, n=name: f"{n}: {m}")


@gpu
def test_compiled_trainer_matches_the_eager_sdpa_trainer_on_gpu() -> None:
    import tempfile

    from dflash.presets import tiny as tiny_recipe
    from dflash.target import load_target
    from dflash.train import Trainer

    unseal()
    dev = torch.device("cuda")
    target = load_target("tiny", device=dev, dtype=torch.float32)
    losses = {}
    for attention, comp in (("flex", "on"), ("sdpa", "off")):
        cfg = dataclasses.replace(
            tiny_recipe(), attention=attention, compile=comp, dtype="float32", steps=3,
            log_every=1, eval_every=0, save_every=0, synthetic_prompts=48,
            synthetic_response_tokens=48, held_out=4, out=tempfile.mkdtemp())
        trainer = Trainer(cfg, target=target)
        records: list[dict] = []
        trainer.run(records.append, final_save=False)
        losses[attention] = [r["loss"] for r in records]
        # sealed (fail_on_recompile): the held-out evaluation compiles nothing more
        assert trainer.held_out_tau_random() >= 1.0
        unseal()
    for a, b in zip(losses["flex"], losses["sdpa"], strict=True):
        assert abs(a - b) <= 1e-3 * max(1.0, abs(b)), losses


@gpu
def test_captured_cycle_drafts_verifies_and_decodes_as_eager_on_gpu() -> None:
    """The static cycle recorded in CUDA graphs: the drafter's drafts and the target's
    verify equal the eager calls, the captured two-branch verify the uncaptured one, and
    whole decodes (DFlash, prompt lookup, hybrid) give target-only greedy's tokens with
    the eager path's cycles (the hybrid, which verifies both drafts on the static path:
    the cycles of the same static engine run uncaptured) (fp32)."""
    from dflash.decoding import static
    from dflash.decoding.branches import TwoBranchVerify
    from dflash.decoding.cycle import Drafting, StaticEngine, cycle_decoder, run_cycles
    from dflash.decoding.generate import synthetic_prompts
    from dflash.decoding.speculative import DraftStream, target_greedy
    from dflash.target import drafter_config_for, load_target

    dev = torch.device("cuda")
    target = load_target("tiny", device=dev, dtype=torch.float32)
    torch.manual_seed(2)
    drafter = DFlashDrafter(drafter_config_for(target, num_layers=2, block_size=4,
                                               gamma=4.0)).to(dev).eval()
    with torch.no_grad():
        ids_1S = torch.randint(0, 511, (1, 48), device=dev,
                               generator=torch.Generator(device=dev).manual_seed(3))
        feats = target.features(ids_1S)
        eager = DraftStream(drafter, target)
        fixed = static.StaticDrafter(drafter, target, rows=3, slots=64, graphs=True)
        assert fixed.step.graph is not None
        seen = 0
        for a in [1, 5, 6, 13, 30, 40]:
            want = eager.draft(int(ids_1S[0, a]), a, feats[:, seen:a])[1:].argmax(dim=-1)
            fixed.feed(feats[:, seen:a])
            assert fixed.draft(ids_1S[0, a:a + 1], a).tolist() == want.tolist()
            seen = a
        verifier = static.StaticTarget(target, block=4, slots=64, graphs=True)
        assert verifier.step.graph is not None
        prompt = ids_1S[0, :20].tolist()
        first, _ = verifier.prefill(prompt)
        cache = target.new_cache()
        logits, _ = target.forward_cached(ids_1S[:, :20], cache, 0)
        assert first == int(logits[0, -1].argmax())
        for block in ([first, 3, 4, 5], [first, 9]):
            truth, _ = verifier.verify(torch.tensor([block], device=dev), 20)
            logits, _ = target.forward_cached(torch.tensor([block], device=dev), cache, 20)
            assert truth.tolist() == logits[0].argmax(dim=-1).tolist()
            target.crop_cache(cache, 20)
        spared = {g: static.StaticTarget(target, block=4, slots=64, graphs=g, spare=3)
                  for g in (True, False)}
        both = {g: TwoBranchVerify(v, graphs=g) for g, v in spared.items()}
        assert both[True].step.graph is not None and both[True].move.graph is not None
        for v in spared.values():
            v.prefill(prompt)
        for mine, theirs in (([first, 3, 4, 5], [6, 7]), ([first, 9], [1, 2, 3])):
            out = {g: [t.clone() for t in b.verify(torch.tensor([mine], device=dev), theirs, 20)]
                   for g, b in both.items()}
            assert out[True][0].tolist() == out[False][0].tolist()
            assert out[True][1].tolist() == out[False][1].tolist()
            torch.testing.assert_close(out[True][2], out[False][2], rtol=1e-5, atol=1e-5)
            for b in both.values():
                b.keep_lookup(20)
            torch.testing.assert_close(spared[True].cache.keys[-1][:, :, :24],
                                       spared[False].cache.keys[-1][:, :, :24],
                                       rtol=1e-5, atol=1e-5)
    prompts = synthetic_prompts(3, vocab_size=512, length=12, seed=99, exclude=(511,))
    uncaptured = StaticEngine(target, drafter, 3, graphs=False, two_branch=True)
    for kind in ("dflash", "ngram", "hybrid"):
        drafting = Drafting(kind=kind, min_match=1)
        paths = {p: cycle_decoder(target, drafter, drafting, path=p) for p in ("eager", "auto")}
        for prompt in prompts:
            ref = target_greedy(target, prompt, max_new_tokens=40)
            got = {p: d(prompt, max_new_tokens=40) for p, d in paths.items()}
            assert got["auto"].tokens == got["eager"].tokens == ref.tokens, kind
            if kind == "hybrid":
                uncaptured.size_for(len(prompt) + 40)
                got["eager"] = run_cycles(uncaptured, drafting, prompt, device=dev,
                                          max_new_tokens=40, max_draft=3)
                assert got["eager"].tokens == ref.tokens
            assert got["auto"].accepted == got["eager"].accepted, kind


@gpu
def test_captured_batched_generation_in_a_thread_is_the_eager_loops_on_gpu() -> None:
    """The synthetic data's decode steps recorded in one CUDA graph (thread-local capture),
    run in a thread while this one allocates and computes on the device, as beside the
    drafter's placing: the eager loop's tokens (fp32), and generate_responses takes it."""
    import threading

    from dflash.decoding import batched
    from dflash.decoding.generate import _decode_group, generate_responses, synthetic_prompts
    from dflash.target import load_target

    dev = torch.device("cuda")
    target = load_target("tiny", device=dev, dtype=torch.float32)
    prompts = synthetic_prompts(6, vocab_size=512, length=9, seed=5, exclude=(511,))
    ids = torch.tensor(prompts, device=dev)
    with torch.no_grad():
        eager = _decode_group(target, ids, None, 20, 0.0, None,
                              torch.zeros(0, dtype=torch.long, device=dev))
    assert batched.applies(target, False, 0.0, 0, 20)
    got: dict[str, object] = {}

    def run() -> None:
        try:
            gen = batched.BatchedGreedy(target, 6, 9, 20, graphs=True)
            got["graph"] = gen.step.graph is not None
            got["tokens"] = gen.generate(ids)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            got["error"] = exc

    # The main thread keeps the device busy and allocating, as the drafter's placing does,
    # but draws no random numbers: the CUDA generator is the process's own, and a draw
    # while another thread records fails ("offset increment outside graph capture"),
    # which is why the trainer's warm-up beside the data waits until that thread has
    # recorded (dflash.warmup).
    a = torch.ones(256, 256, device=dev)
    thread = threading.Thread(target=run)
    thread.start()
    junk = []
    while thread.is_alive():
        junk.append(a @ a)
        junk = junk[-8:]
    thread.join()
    assert "error" not in got, got.get("error")
    assert got["graph"] is True
    assert got["tokens"] == eager
    assert generate_responses(target, prompts, max_new_tokens=20) == eager


@gpu
def test_captured_target_only_reference_decodes_as_eager_on_gpu() -> None:
    """dflash-eval's second clock: target-only decoding with its one-token step recorded
    as a CUDA graph gives target-only greedy's tokens (fp32), its cache grown for a longer
    prompt and the step recorded again."""
    from dflash.decoding.generate import synthetic_prompts
    from dflash.decoding.reference import CapturedGreedy
    from dflash.decoding.speculative import target_greedy
    from dflash.target import load_target

    target = load_target("tiny", device=torch.device("cuda"), dtype=torch.float32)
    reference = CapturedGreedy(target, graphs=True)
    prompts = [*synthetic_prompts(3, vocab_size=512, length=12, seed=99, exclude=(511,)),
               *synthetic_prompts(1, vocab_size=512, length=500, seed=5, exclude=(511,))]
    for prompt in prompts:
        want = target_greedy(target, prompt, max_new_tokens=40)
        got = reference(prompt, max_new_tokens=40)
        assert got.tokens == want.tokens and got.target_forwards == want.target_forwards
        assert reference._static is not None and reference._static.step.graph is not None
    assert reference.slots == 1024


@gpu
def test_compiled_trainer_warmed_up_beside_its_data_trains_as_in_turn_on_gpu() -> None:
    """The data generated beside the drafter's placing and the compiled warm-up run while
    its decode loop ends (random features, the loop only replaying): the same split and
    the same losses as the trainer that does each in turn."""
    import os
    import tempfile

    from dflash.dataphase import BESIDE_OPT_OUT_ENV
    from dflash.presets import tiny as tiny_recipe
    from dflash.target import load_target
    from dflash.train import Trainer
    from dflash.warmup import BESIDE_OPT_IN_ENV

    unseal()
    dev = torch.device("cuda")
    target = load_target("tiny", device=dev, dtype=torch.float32)
    cfg = dataclasses.replace(
        tiny_recipe(), attention="flex", compile="on", dtype="float32", steps=3, log_every=1,
        eval_every=0, save_every=0, synthetic_prompts=48, synthetic_response_tokens=48,
        held_out=4)
    runs = {}
    for how in ("in turn", "beside"):
        os.environ[BESIDE_OPT_OUT_ENV if how == "in turn" else BESIDE_OPT_IN_ENV] = "1"
        try:
            trainer = Trainer(dataclasses.replace(cfg, out=tempfile.mkdtemp()), target=target)
        finally:
            os.environ.pop(BESIDE_OPT_OUT_ENV, None)
            os.environ.pop(BESIDE_OPT_IN_ENV, None)
        warmed_early = bool(trainer.warm.warmed)
        records: list[dict] = []
        trainer.run(records.append, final_save=False)
        runs[how] = (warmed_early, trainer.split, [r["loss"] for r in records],
                     list(trainer.start_phases))
        unseal()
    assert runs["in turn"][0] is False and runs["beside"][0] is True, runs
    assert runs["beside"][1] == runs["in turn"][1]
    for a, b in zip(runs["beside"][2], runs["in turn"][2], strict=True):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), runs
    # start_phases sums each phase: "data" is the wait to settle and the wait after
    assert runs["beside"][3][:5] == ["drafter", "parallelize", "data", "warmup",
                                     "data_beside"], runs



@gpu
def test_the_trainers_held_out_decode_captured_counts_as_eager_on_gpu() -> None:
    """``held_out_decode_cycle=static`` in a compiled trainer: the held-out decode's cycles
    are captured as CUDA graphs at each evaluation, while the data prefetch thread uses
    the device, and count what the eager decode of the same drafter counts (fp32)."""
    import tempfile

    from dflash.decoding.spread import pooled_tau
    from dflash.heldout import decode_counts
    from dflash.presets import tiny as tiny_recipe
    from dflash.target import load_target
    from dflash.train import Trainer

    unseal()
    target = load_target("tiny", device=torch.device("cuda"), dtype=torch.float32)
    cfg = dataclasses.replace(
        tiny_recipe(), attention="flex", compile="on", dtype="float32", steps=4, log_every=1,
        eval_every=2, save_every=0, synthetic_prompts=48, synthetic_response_tokens=48,
        held_out=4, held_out_decode_prompts=4, held_out_decode_tokens=40,
        held_out_decode_cycle="static", out=tempfile.mkdtemp())
    trainer = Trainer(cfg, target=target)
    records: list[dict] = []
    trainer.run(records.append, final_save=False)
    unseal()
    evals = [r for r in records if "held_out_decode_tau" in r]
    assert [r["step"] for r in evals] == [2, 4]
    eager = decode_counts(target, trainer.drafter, trainer.decode_prompts, max_new_tokens=40,
                          path="eager")
    captured = decode_counts(target, trainer.drafter, trainer.decode_prompts,
                             max_new_tokens=40, path="static")
    assert captured == eager
    assert evals[-1]["held_out_decode_tau"] == pooled_tau(eager)


@gpu
def test_fused_adamw_kernel_steps_as_its_torch_reference_on_gpu() -> None:
    """dflash.adamw_kernel against update_reference_ (the CPU path, itself torch's AdamW
    bit for bit): sizes around the kernel's block, the clip factor read from the device;
    then MasterAdamW on a bf16 model, kernel against reference, through the norm."""
    from torch import nn

    from dflash import adamw_kernel
    from dflash.optim import MasterAdamW
    from tests.dflash.adamw_check import check_kernel_against_reference

    dev = torch.device("cuda")
    model = nn.Linear(64, 96).to(dev, torch.bfloat16)
    chosen = MasterAdamW(model, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1).kernel
    assert chosen is adamw_kernel.adamw_update_  # bf16 on CUDA: the kernel, unasked
    check_kernel_against_reference(
        dev, (1, adamw_kernel.BLOCK - 1, adamw_kernel.BLOCK, 5_000, 1 << 20), exact_bf16=True)
