from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import BlockMask, create_mask, flex_attention

from dflash.masks import (
    TILE,
    block_mask_from_anchors,
    dense_mask,
    dflash_block_mask,
    dflash_mask_mod,
    reference_mask,
    sdpa_attend,
)
from tests.dflash.conftest import FLEX_EAGER

# (ctx_len S, block_size B, anchors per sequence, keep per sequence)
CASES = [
    # anchor 0 and anchor S-B, no padding
    (10, 4, [[0, 3, 6]], [[True, True, True]]),
    # a padding block on the right
    (12, 4, [[2, 5, 0]], [[True, True, False]]),
    # B = 1
    (7, 1, [[0, 3, 6, 0]], [[True, True, True, False]]),
    # batch of two with different anchors and padding
    (9, 3, [[0, 2, 6], [4, 0, 0]], [[True, True, True], [True, False, False]]),
    # N*B = 160 > 128 and not a multiple of it: create_block_mask pads Q to 256
    (20, 8, [sorted(torch.randint(0, 13, (20,), generator=torch.Generator().manual_seed(3))
                    .tolist())], [[True] * 17 + [False] * 3]),
]


def _oracle(seq: int, bs: int, anchors: list[list[int]], keep: list[list[bool]]
            ) -> torch.Tensor:
    return torch.tensor([reference_mask(a, k, seq, bs) for a, k in zip(anchors, keep,
                                                                        strict=True)])


@pytest.mark.parametrize(("seq", "bs", "anchors", "keep"), CASES)
def test_dense_and_create_mask_match_loop(seq: int, bs: int, anchors: list[list[int]],
                                          keep: list[list[bool]]) -> None:
    a, k = torch.tensor(anchors), torch.tensor(keep)
    expected = _oracle(seq, bs, anchors, keep)
    assert torch.equal(dense_mask(a, k, seq, bs), expected)
    q_len = a.shape[1] * bs
    from_mod = create_mask(dflash_mask_mod(a, k, seq, bs), a.shape[0], None, q_len,
                           seq + q_len, device="cpu")
    assert torch.equal(from_mod[:, 0], expected)


@FLEX_EAGER
@pytest.mark.parametrize("builder", ["create_block_mask", "from_anchors"])
@pytest.mark.parametrize(("seq", "bs", "anchors", "keep"), CASES)
def test_flex_block_mask_as_applied_matches_loop(seq: int, bs: int, anchors: list[list[int]],
                                                 keep: list[list[bool]], builder: str) -> None:
    # q = 0 makes softmax uniform over visible keys; v = identity reads back which keys
    # were visible. This checks the BlockMask exactly as flex applies it (block-sparse
    # skipping included), not just the mask_mod.
    a, k = torch.tensor(anchors), torch.tensor(keep)
    bsz, q_len = a.shape[0], a.shape[1] * bs
    kv_len = seq + q_len
    if builder == "from_anchors" and TILE % bs:
        with pytest.raises(ValueError, match="does not divide"):
            block_mask_from_anchors(a, k, seq, bs)
        return
    bm = (dflash_block_mask(a, k, seq, bs) if builder == "create_block_mask"
          else block_mask_from_anchors(a, k, seq, bs))
    q = torch.zeros(bsz, 1, q_len, kv_len)
    v = torch.eye(kv_len).expand(bsz, 1, kv_len, kv_len)
    out = flex_attention(q, torch.randn(bsz, 1, kv_len, kv_len), v, block_mask=bm)
    assert torch.equal(out[:, 0] > 0, _oracle(seq, bs, anchors, keep))


def test_mask_rules_spelled_out() -> None:
    m = dense_mask(torch.tensor([5, 2, 0]), torch.tensor([True, True, False]), 8, 4)[0]
    blk0 = m[0:4]
    assert blk0[:, :5].all() and not blk0[:, 5:8].any()  # context strictly before anchor 5
    assert blk0[:, 8:12].all()  # own block, bidirectional: slot 0 sees slot 3 and back
    assert not blk0[:, 12:].any()  # no other block
    assert not m[8:12].any()  # padding block sees nothing


def test_padding_rows_give_zero_not_nan_in_sdpa() -> None:
    a, k = torch.tensor([[3, 0]]), torch.tensor([[True, False]])
    mask = dense_mask(a, k, 6, 2)
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    kv = torch.randn(1, 2, 10, 8, requires_grad=True)
    out = sdpa_attend(mask)(q, kv, kv)
    assert torch.isfinite(out).all() and (out[:, :, 2:] == 0).all()
    out.sum().backward()
    assert q.grad is not None and kv.grad is not None
    assert torch.isfinite(q.grad).all() and torch.isfinite(kv.grad).all()


def test_shape_mismatch_refused() -> None:
    with pytest.raises(ValueError, match="anchors"):
        dense_mask(torch.tensor([1, 2]), torch.tensor([True]), 4, 2)


def test_mask_mod_is_safe_past_q_len() -> None:
    # In torch 2.13 eager, create_block_mask evaluates mask_mod only on [0, Q_LEN) and pads
    # afterwards, so the clamp is not exercised above; compiled kernels and older versions
    # do call it for q up to the next multiple of 128 (SpecForge#501/#511). Call it there.
    a, k = torch.tensor([[1, 4]]), torch.tensor([[True, True]])
    mod = dflash_mask_mod(a, k, 6, 4)
    zero = torch.tensor(0)
    for q in (8, 9, 127):
        for kv in (0, 5, 13):
            assert not bool(mod(zero, zero, torch.tensor(q), torch.tensor(kv)))


def _tiles(bm: BlockMask) -> tuple[set[tuple[int, int, int]], set[tuple[int, int, int]]]:
    """(partial tiles, full tiles) as {(batch, q tile, kv tile)}."""
    out = []
    for num, idx in ((bm.kv_num_blocks, bm.kv_indices),
                     (bm.full_kv_num_blocks, bm.full_kv_indices)):
        assert num is not None and idx is not None
        out.append({(b, r, int(idx[b, 0, r, j])) for b in range(num.shape[0])
                    for r in range(num.shape[2]) for j in range(int(num[b, 0, r]))})
    return out[0], out[1]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), bs=st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128]),
       batch=st.integers(1, 2), n=st.integers(1, 24), ctx=st.integers(1, 600))
def test_tile_map_from_anchors_equals_create_block_mask(data: st.DataObject, bs: int,
                                                        batch: int, n: int, ctx: int) -> None:
    # The direct construction must visit exactly the tiles create_block_mask visits (no
    # missing tile: wrong attention; no extra tile: wasted work) and call exactly the
    # same tiles full (a wrongly full tile would skip the mask inside it).
    anchors = torch.tensor([sorted(data.draw(st.lists(st.integers(0, ctx), min_size=n,
                                                      max_size=n))) for _ in range(batch)])
    keep = torch.tensor([data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
                         for _ in range(batch)])
    direct = block_mask_from_anchors(anchors, keep, ctx, bs)
    oracle = dflash_block_mask(anchors, keep, ctx, bs)
    assert _tiles(direct) == _tiles(oracle)
    assert direct.seq_lengths == oracle.seq_lengths


@pytest.mark.parametrize(("ctx", "anchors", "keep"), [
    # block size 128 with S a multiple of 128: each block's own keys are one whole tile,
    # which create_block_mask calls full (hypothesis found this one)
    (128, [0, 0, 0, 0], [False, False, False, True]),
    (256, [256, 10, 129, 0], [True, True, True, False]),
    # S not a multiple of 128 and block 0 sees all context: its visible keys are one
    # interval, so the tile straddling S is full too
    (100, [100, 3], [True, True]),
    (300, [300, 300, 257], [True, True, True]),
])
def test_tile_map_with_block_size_128_edge_cases(ctx: int, anchors: list[int],
                                                 keep: list[bool]) -> None:
    a, k = torch.tensor([anchors]), torch.tensor([keep])
    assert _tiles(block_mask_from_anchors(a, k, ctx, 128)) == _tiles(
        dflash_block_mask(a, k, ctx, 128))
