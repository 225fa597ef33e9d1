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
        unseal()
    for a, b in zip(losses["flex"], losses["sdpa"], strict=True):
        assert abs(a - b) <= 1e-3 * max(1.0, abs(b)), losses
