from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dflash.loss import block_inputs, block_targets, dflash_loss, sample_anchors
from dflash.masks import dense_mask, sdpa_attend
from tests.dflash.conftest import Tiny, random_batch, train_forward


def test_sample_anchors_valid_sorted_padded() -> None:
    g = torch.Generator().manual_seed(0)
    seq, bs = 30, 4
    loss_mask = torch.zeros(3, seq, dtype=torch.long)
    loss_mask[0, 10:] = 1   # 17 valid (10..26)
    loss_mask[1, 25:] = 1   # 2 valid (25, 26): fewer than n
    # row 2: no response tokens at all
    anchors, keep = sample_anchors(loss_mask, 8, bs, g)
    assert anchors.shape == keep.shape == (3, 8)
    assert keep[0].all() and keep[1].sum() == 2 and not keep[2].any()
    assert anchors[1, :2].tolist() == [25, 26]
    assert (anchors[~keep] == 0).all()
    kept = anchors[0]
    assert torch.equal(kept, kept.sort().values) and len(set(kept.tolist())) == 8
    assert ((kept >= 10) & (kept <= seq - bs)).all()
    # Fresh anchors each call.
    again, _ = sample_anchors(loss_mask, 8, bs, g)
    assert not torch.equal(again[0], anchors[0])


def test_block_inputs_and_same_position_labels() -> None:
    ids = torch.arange(100, 112)[None]  # token at position p is 100 + p
    loss_mask = torch.ones(1, 12, dtype=torch.long)
    loss_mask[0, 7] = 0
    anchors, keep = torch.tensor([[2, 6, 10]]), torch.tensor([[True, True, False]])
    blk_ids, pos = block_inputs(ids, anchors, 4, mask_token_id=9)
    assert blk_ids.tolist() == [[102, 9, 9, 9, 106, 9, 9, 9, 110, 9, 9, 9]]
    assert pos.tolist() == [[2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
    labels, w = block_targets(ids, loss_mask, anchors, keep, 4, gamma=2.0)
    # Same position, not shifted: slot k is labelled with x[anchor + k].
    assert labels[0, :8].tolist() == [102, 103, 104, 105, 106, 107, 108, 109]
    wk = [0.0, 1.0, math.exp(-0.5), math.exp(-1.0)]
    expected = wk + [0.0, 0.0, wk[2], wk[3]] + [0.0] * 4  # pos 7 masked; block 2 padding
    torch.testing.assert_close(w[0], torch.tensor(expected))
    # anchor + k >= S is masked even for a kept block.
    _, w2 = block_targets(ids, loss_mask, torch.tensor([[10]]), torch.tensor([[True]]), 4, 2.0)
    assert w2[0].tolist() == [0.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("fused", [True, False], ids=["fused-head", "checkpointed-head"])
@pytest.mark.parametrize(("chunk_size", "select"), [(3, True), (2048, True), (3, False)])
def test_loss_is_weighted_mean_ce_and_accuracy(chunk_size: int, select: bool,
                                               fused: bool) -> None:
    """A frozen nn.Linear head takes the fused path (the gradient made in the forward);
    any other module, the checkpointed one: both give autograd's loss and gradient."""
    torch.manual_seed(0)
    bsz, q_len, d, vocab, bs = 2, 8, 16, 32, 4
    linear = nn.Linear(d, vocab, bias=False).requires_grad_(False)
    head: nn.Module = linear if fused else nn.Sequential(linear)
    hidden = torch.randn(bsz, q_len, d, requires_grad=True)
    labels = torch.randint(0, vocab, (bsz, q_len))
    weights = torch.rand(bsz, q_len)
    weights[:, ::bs] = 0.0
    weights[1, 4:] = 0.0
    out = dflash_loss(hidden, labels, weights, head, bs, chunk_size=chunk_size,
                      select_supervised=select)
    reference = hidden.detach().clone().requires_grad_(True)
    logits = head(reference)
    ce = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1), reduction="none")
    expected = (ce * weights.reshape(-1)).sum() / weights.sum()
    torch.testing.assert_close(out.loss, expected)
    expected.backward()
    correct = (logits.argmax(-1) == labels) & (weights > 0)
    slot = torch.arange(q_len) % bs
    for k in range(bs):
        sel = (slot[None] == k) & (weights > 0)
        assert out.count_K[k] == sel.sum()
        if k == 0:
            assert math.isnan(out.acc_K[0])
        else:
            assert out.acc_K[k] == pytest.approx(correct[sel].float().mean().item())
    (out.loss * 3.0).backward()  # a scaled loss: the gradient passed in is used
    assert hidden.grad is not None
    # the fused head (made in the forward) gives autograd's gradient of the full logits
    torch.testing.assert_close(hidden.grad, 3.0 * reference.grad)
    # Slot 0 and zero-weight rows carry no gradient; supervised rows do.
    assert (hidden.grad[weights == 0] == 0).all()
    assert (hidden.grad[weights > 0].abs().sum(-1) > 0).all()
    assert linear.weight.grad is None


def test_teacher_forced_tau_is_leading_run_plus_one() -> None:
    # One sequence, 3 blocks of 4; the head is the identity so argmax = the one-hot label.
    vocab, bs = 4, 4
    head = nn.Linear(vocab, vocab, bias=False).requires_grad_(False)
    head.weight.copy_(torch.eye(vocab))
    labels = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]])
    right = torch.nn.functional.one_hot(labels, vocab).float()
    hidden = right.clone()
    hidden[0, 2] = torch.nn.functional.one_hot(torch.tensor(0), vocab)  # block 0: slot 2 wrong
    hidden[0, 5] = torch.nn.functional.one_hot(torch.tensor(0), vocab)  # block 1: slot 1 wrong
    weights = torch.ones(1, 12)
    weights[0, 8:] = 0.0  # block 2 unsupervised: not counted
    for select in (True, False):
        out = dflash_loss(hidden, labels, weights, head, bs, select_supervised=select)
        # block 0: slot 1 hit, slot 2 miss -> 1 + 1; block 1: miss at slot 1 -> 1 + 0.
        assert out.tau_sim.item() == pytest.approx(1.5)


def test_loss_with_nothing_supervised_is_zero_not_nan() -> None:
    head = nn.Linear(4, 8, bias=False).requires_grad_(False)
    hidden = torch.randn(1, 4, 4, requires_grad=True)
    out = dflash_loss(hidden, torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4), head, 4)
    assert out.loss.item() == 0.0
    out.loss.backward()
    assert hidden.grad is not None and (hidden.grad == 0).all()


def test_end_to_end_loss_ignores_slot0_and_masked(tiny_setup: Tiny) -> None:
    t, bs = tiny_setup, tiny_setup.cfg.block_size
    ids, feats = random_batch(t.cfg, 1, 24)
    loss_mask = torch.zeros(1, 24, dtype=torch.long)
    loss_mask[0, 6:] = 1
    loss_mask[0, 14] = 0
    anchors, keep = sample_anchors(loss_mask, 6, bs, torch.Generator().manual_seed(0))
    labels, weights = block_targets(ids, loss_mask, anchors, keep, bs, t.cfg.gamma)
    blk_ids, pos = block_inputs(ids, anchors, bs, t.cfg.mask_token_id)
    emb = t.embed(blk_ids).requires_grad_(True)
    logits = train_forward(t, ids, feats, anchors, keep, block_emb_BQD=emb)
    ce = F.cross_entropy(logits.reshape(-1, t.cfg.vocab_size), labels.reshape(-1),
                         reduction="none")
    ref = (ce * weights.reshape(-1)).sum() / weights.sum()
    # The chunked loss on the drafter's hidden states gives the same number.
    hidden = t.drafter(emb, feats, pos, torch.arange(24)[None],
                       sdpa_attend(dense_mask(anchors, keep, 24, bs)))
    out = dflash_loss(hidden, labels, weights, t.head, bs, chunk_size=5)
    torch.testing.assert_close(out.loss, ref)
    assert (weights.view(-1, bs)[:, 0] == 0).all()
    masked_pos = pos[weights == 0]
    assert not ((pos == 14) & (weights > 0)).any() and masked_pos.numel() > 0
    out.loss.backward()
    assert t.head.weight.grad is None and t.embed.weight.grad is None
