"""Anchor sampling, block inputs, and the weighted same-position CE loss.

Labels are same-position, not shifted: block slot k (1..B-1) predicts x[anchor + k];
slot 0 holds the anchor token itself and is never trained. (Shifted labels train to
~70% accuracy and give tau ~1 at inference, SpecForge#455/#473.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


def sample_anchors(loss_mask_BS: Tensor, n: int, block_size: int,
                   generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Sorted anchors [B, n] (long) and keep [B, n] (bool), fresh every step.

    Valid p: loss_mask[p] == 1 and p <= S - B. Each row takes min(n, #valid) of them,
    uniformly without replacement, sorted ascending (denser flex tiles); the rest are
    padding (anchor 0, keep False) on the right.
    """
    bsz, seq = loss_mask_BS.shape
    dev = loss_mask_BS.device
    valid_BS = loss_mask_BS.bool() & (torch.arange(seq, device=dev) <= seq - block_size)
    # Top-n of i.i.d. uniform keys = a uniform sample without replacement; invalid
    # positions get key -1 so they lose to every valid one.
    keys_BS = torch.rand(bsz, seq, generator=generator, device=dev)
    keys_BS = torch.where(valid_BS, keys_BS, -1.0)
    take = min(n, seq)
    top_keys, top_pos = keys_BS.topk(take, dim=1)
    picked = torch.where(top_keys >= 0, top_pos, seq)  # seq sorts padding to the right
    anchors_Bn = picked.sort(dim=1).values
    if take < n:
        anchors_Bn = F.pad(anchors_Bn, (0, n - take), value=seq)
    keep_Bn = anchors_Bn < seq
    return torch.where(keep_Bn, anchors_Bn, 0), keep_Bn


def block_inputs(input_ids_BS: Tensor, anchors_BN: Tensor, block_size: int,
                 mask_token_id: int) -> tuple[Tensor, Tensor]:
    """Draft-stream ids [B, N*B] = [x_anchor, MASK*(B-1)] per block, and their absolute
    positions [B, N*B] = anchor + 0..B-1."""
    bsz, n = anchors_BN.shape
    ids_BNK = torch.full((bsz, n, block_size), mask_token_id, dtype=input_ids_BS.dtype,
                         device=input_ids_BS.device)
    ids_BNK[:, :, 0] = input_ids_BS.gather(1, anchors_BN)
    offs_K = torch.arange(block_size, device=anchors_BN.device)
    pos_BNK = anchors_BN[:, :, None] + offs_K
    return ids_BNK.reshape(bsz, -1), pos_BNK.reshape(bsz, -1)


def block_targets(input_ids_BS: Tensor, loss_mask_BS: Tensor, anchors_BN: Tensor,
                  keep_BN: Tensor, block_size: int, gamma: float) -> tuple[Tensor, Tensor]:
    """Labels [B, N*B] and loss weights [B, N*B] = w_k * m_{b,k}.

    w_k = exp(-(k-1)/gamma) for k >= 1, 0 for slot 0;
    m = keep * (anchor + k < S) * loss_mask[anchor + k].
    """
    bsz, seq = input_ids_BS.shape
    k_K = torch.arange(block_size, device=anchors_BN.device)
    pos_BNK = anchors_BN[:, :, None] + k_K
    in_seq_BNK = pos_BNK < seq
    pos_BNK = pos_BNK.clamp(max=seq - 1)  # gather-safe; masked by in_seq below
    flat_BQ = pos_BNK.reshape(bsz, -1)
    labels_BQ = input_ids_BS.gather(1, flat_BQ)
    lm_BNK = loss_mask_BS.gather(1, flat_BQ).view_as(pos_BNK).bool()
    m_BNK = keep_BN[:, :, None] & in_seq_BNK & lm_BNK
    w_K = torch.exp(-(k_K.float() - 1) / gamma)
    w_K[0] = 0.0  # slot 0 is the anchor itself: never trained
    weights_BNK = w_K * m_BNK.float()
    return labels_BQ, weights_BNK.reshape(bsz, -1)


@dataclass(frozen=True, slots=True)
class LossOutput:
    loss: Tensor
    """Weighted-mean CE over supervised slots (scalar, differentiable)."""
    acc_K: Tensor
    """Per-slot top-1 accuracy [B]; slot 0 and slots with no supervised token are NaN."""
    count_K: Tensor
    """Supervised tokens per slot [B] (long)."""
    tau_sim: Tensor
    """Teacher-forced acceptance length (scalar): per kept block, 1 + the leading run of
    slots 1.. whose argmax equals the label, averaged over blocks. With labels the
    target generated greedily, this is the tau speculative decoding would see."""


def _chunk_ce(hidden_MD: Tensor, labels_M: Tensor, head: nn.Module) -> tuple[Tensor, Tensor]:
    logits_MV = head(hidden_MD).float()
    ce_M = F.cross_entropy(logits_MV, labels_M, reduction="none")
    return ce_M, logits_MV.argmax(-1) == labels_M


class _LinearCE(torch.autograd.Function):
    """sum(w * CE(hidden @ W^T, labels)) / denom for a frozen head W, chunk by chunk, with
    the gradient for ``hidden`` made in the forward: each chunk's logits live once, for
    the loss and for d(loss)/d(hidden) = (softmax - onehot) * w / denom @ W. The
    checkpointed chunk this replaces ran the head's matmul twice (forward, then again in
    the backward) and read the [chunk, vocab] logits a few more times."""

    @staticmethod
    def forward(ctx: Any, hidden_MD: Tensor, weight_VD: Tensor, labels_M: Tensor,
                w_M: Tensor, denom: Tensor, chunk_size: int) -> tuple[Tensor, Tensor]:
        num = hidden_MD.new_zeros((), dtype=torch.float32)
        grad_MD = torch.empty_like(hidden_MD)
        correct_M = torch.empty(hidden_MD.shape[0], dtype=torch.bool, device=hidden_MD.device)
        scale_M = w_M.float() / denom
        for start in range(0, hidden_MD.shape[0], chunk_size):
            end = start + chunk_size
            logits_MV = (hidden_MD[start:end] @ weight_VD.t()).float()
            labels = labels_M[start:end]
            correct_M[start:end] = logits_MV.argmax(-1) == labels
            lse_M = torch.logsumexp(logits_MV, dim=-1)
            picked_M = logits_MV.gather(1, labels[:, None]).squeeze(1)
            num = num + ((lse_M - picked_M) * w_M[start:end]).sum()
            probs_MV = logits_MV.sub_(lse_M[:, None]).exp_()  # softmax, in place
            probs_MV.scatter_add_(1, labels[:, None],
                                  torch.full_like(picked_M[:, None], -1.0))
            probs_MV.mul_(scale_M[start:end, None])
            grad_MD[start:end] = probs_MV.to(weight_VD.dtype) @ weight_VD
        ctx.save_for_backward(grad_MD)
        ctx.mark_non_differentiable(correct_M)
        return num / denom, correct_M

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_correct: Tensor | None
                 ) -> tuple[Tensor | None, ...]:
        (grad_MD,) = ctx.saved_tensors
        return grad_MD * grad_loss.to(grad_MD.dtype), None, None, None, None, None


def _frozen_weight(head: nn.Module) -> Tensor | None:
    """The weight of a frozen, bias-free ``nn.Linear`` held as a plain tensor (what the
    fused loss needs), else None."""
    if type(head) is not nn.Linear or getattr(head, "bias", None) is not None:
        return None
    weight = head.weight
    if weight.requires_grad or type(weight.data) is not torch.Tensor:
        return None
    return weight.detach()


def dflash_loss(hidden_BQD: Tensor, labels_BQ: Tensor, weights_BQ: Tensor,
                lm_head: nn.Module, block_size: int, chunk_size: int = 2048,
                select_supervised: bool = True) -> LossOutput:
    """L = sum w*m*CE / sum w*m, with lm_head + CE applied chunk by chunk.

    At most one [chunk, vocab] logits block is alive at a time; the full [N*B, vocab]
    logits never exist. For a frozen bias-free ``nn.Linear`` head (the trainer's), the
    gradient for the hidden states is made in the forward, chunk by chunk
    (:class:`_LinearCE`: one head matmul per chunk and direction); any other head runs
    each chunk activation-checkpointed (its matmul again in the backward).
    ``select_supervised`` sends only rows with weight > 0 through lm_head (less compute,
    but ``nonzero`` waits for the device); the trainer passes False and runs every row,
    so a step has fixed shapes and no host sync.
    """
    bsz, q_len, d_model = hidden_BQD.shape
    slot_BQ = torch.arange(q_len, device=hidden_BQD.device).expand(bsz, q_len) % block_size
    if select_supervised:
        sel_M = (weights_BQ > 0).reshape(-1).nonzero().squeeze(1)
        hidden_MD = hidden_BQD.reshape(-1, d_model).index_select(0, sel_M)
        labels_M = labels_BQ.reshape(-1).index_select(0, sel_M)
        w_M = weights_BQ.reshape(-1).index_select(0, sel_M)
    else:
        sel_M = None
        hidden_MD = hidden_BQD.reshape(-1, d_model)
        labels_M, w_M = labels_BQ.reshape(-1), weights_BQ.reshape(-1)

    weight = _frozen_weight(lm_head)
    if weight is not None and torch.is_grad_enabled() and hidden_MD.requires_grad:
        denom = w_M.sum().clamp_min(torch.finfo(torch.float32).tiny)
        loss, correct = _LinearCE.apply(  # type: ignore[no-untyped-call]
            hidden_MD, weight, labels_M, w_M.detach(), denom, chunk_size)
        return _outputs(loss + 0.0 * hidden_BQD.sum(), correct, sel_M, w_M, weights_BQ,
                        slot_BQ, block_size)
    num = hidden_BQD.new_zeros((), dtype=torch.float32)
    correct_parts = []
    for start in range(0, hidden_MD.shape[0], chunk_size):
        end = start + chunk_size
        if torch.is_grad_enabled() and hidden_MD.requires_grad:
            ce_M, ok_M = checkpoint(_chunk_ce, hidden_MD[start:end], labels_M[start:end],
                                    lm_head, use_reentrant=False)
        else:
            ce_M, ok_M = _chunk_ce(hidden_MD[start:end], labels_M[start:end], lm_head)
        num = num + (ce_M * w_M[start:end]).sum()
        correct_parts.append(ok_M)
    # Empty selection: loss is 0 (still attached to the graph), not NaN.
    loss = num / w_M.sum().clamp_min(torch.finfo(torch.float32).tiny) + 0.0 * hidden_BQD.sum()
    correct_M = torch.cat(correct_parts) if correct_parts else labels_M.new_zeros(0).bool()
    return _outputs(loss, correct_M, sel_M, w_M, weights_BQ, slot_BQ, block_size)


def _outputs(loss: Tensor, correct_M: Tensor, sel_M: Tensor | None, w_M: Tensor,
             weights_BQ: Tensor, slot_BQ: Tensor, block_size: int) -> LossOutput:
    """The loss with the per-slot accuracy and the teacher-forced tau of its rows."""
    bsz, q_len = weights_BQ.shape
    correct_BQ = torch.zeros(bsz * q_len, dtype=torch.bool, device=weights_BQ.device)
    if sel_M is None:
        correct_BQ = correct_M & (w_M > 0)
    else:
        correct_BQ[sel_M] = correct_M
    supervised_BQ = (weights_BQ > 0).reshape(-1)
    slot_Q = slot_BQ.reshape(-1)
    count_K = torch.zeros(block_size, dtype=torch.long, device=weights_BQ.device)
    count_K.index_add_(0, slot_Q, supervised_BQ.long())
    hits_K = torch.zeros(block_size, dtype=torch.long, device=weights_BQ.device)
    hits_K.index_add_(0, slot_Q, correct_BQ.long())
    acc_K = torch.where(count_K > 0, hits_K.float() / count_K.clamp_min(1).float(), math.nan)
    return LossOutput(loss=loss, acc_K=acc_K, count_K=count_K,
                      tau_sim=_teacher_forced_tau(correct_BQ.view(bsz, -1, block_size),
                                                  supervised_BQ.view(bsz, -1, block_size)))


def _teacher_forced_tau(correct_BNK: Tensor, supervised_BNK: Tensor) -> Tensor:
    """1 + mean over blocks with a supervised slot 1 of the leading run of hits."""
    run_BN = correct_BNK[:, :, 1:].long().cumprod(dim=-1).sum(dim=-1).float()
    has_BN = supervised_BNK[:, :, 1] if correct_BNK.shape[-1] > 1 else supervised_BNK[:, :, 0]
    blocks = has_BN.sum().clamp_min(1)
    return 1.0 + (run_BN * has_BN).sum() / blocks
