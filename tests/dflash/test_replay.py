"""Decoding replayed teacher forced (dflash.replay): on rows that are the target's greedy
output it IS decoding, cycle for cycle; where a row leaves that output it stops; it walks
only the window decoding would decode."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from dflash.decoding.speculative import speculative_greedy, target_greedy
from dflash.heldout import prompt_of
from dflash.model import DFlashDrafter
from dflash.replay import End, Row, replay, walk
from dflash.target import TargetModel, drafter_config_for


def _drafter(target: TargetModel) -> DFlashDrafter:
    """An untrained drafter (random weights): it decodes, accepting little."""
    torch.manual_seed(0)
    cfg = drafter_config_for(target, num_layers=2, block_size=4, gamma=4.0,
                             mask_token_id=target.mask_token_id)
    return DFlashDrafter(cfg).float().eval()


def _prompts(n: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, 500, (5 + 3 * i,), generator=gen).tolist() for i in range(n)]


def _greedy_rows(target: TargetModel, prompts: Sequence[Sequence[int]], length: int
                 ) -> list[Row]:
    """Each prompt followed by ``length`` tokens of the target's greedy decoding."""
    return [(list(p) + list(target_greedy(target, p, max_new_tokens=length).tokens), len(p))
            for p in prompts]


def _decoded(target: TargetModel, drafter: DFlashDrafter, prompts: Sequence[Sequence[int]],
             window: int) -> list[int]:
    """Tokens per cycle of greedy speculative decoding, prompt after prompt."""
    return [n for p in prompts
            for n in speculative_greedy(target, drafter, p, max_new_tokens=window).accepted]


# -- the walk, on hand-made choices --------------------------------------------------------

IDS = list(range(100, 120))  # the stored row: the prompt is 100..103, start = 4
GREEDY = [t + 1 for t in IDS]  # the target's choice at i is the stored token at i+1


def _right(start: int, window: int, block: int = 4) -> list[list[int]]:
    """Drafts that are all the target's choice: slot s of the block at p drafts p+s."""
    return [[100 + start + j + s for s in range(block)] for j in range(window - 1)]


def test_every_draft_right_emits_full_blocks_capped_by_the_window():
    cycles, end = walk(IDS, 4, GREEDY, _right(4, 10), window=10, max_draft=3)
    # first token outside any cycle; then B-1 drafts + 1, twice; then only one token left
    assert (cycles, end) == ([4, 4, 1], End.DONE)
    cycles, _ = walk(IDS, 4, GREEDY, _right(4, 10), window=10, max_draft=1)
    assert cycles == [2] * 4 + [1]


def test_a_stop_id_ends_the_walk_after_its_cycle_as_decoding_does():
    cycles, end = walk(IDS, 4, GREEDY, _right(4, 12), window=12, max_draft=3,
                       stop_ids=(106,))
    assert (cycles, end) == ([4], End.DONE)  # the cycle emitted 105..108, 106 among them
    assert walk(IDS, 4, GREEDY, _right(4, 12), window=12, max_draft=3,
                stop_ids=(104,)) == ([], End.DONE)  # the first token: no cycle at all


def test_where_the_row_leaves_the_greedy_choice_the_walk_stops():
    ids = IDS.copy()
    ids[6] = 0  # the target would put 106 at position 6
    # drafts right past it: decoding accepts 105 and 106 at least; counted as 2 + 1
    assert walk(ids, 4, GREEDY, _right(4, 10), window=10, max_draft=3) == ([3],
                                                                           End.DIVERGED)
    # drafts already wrong at slot 2: the cycle is exact (105 accepted, then the bonus)
    wrong = [[d if s < 2 else 0 for s, d in enumerate(b)] for b in _right(4, 10)]
    assert walk(ids, 4, GREEDY, wrong, window=10, max_draft=3) == ([2], End.DIVERGED)
    ids[4] = 0  # the first generated token already differs
    assert walk(ids, 4, GREEDY, _right(4, 10), window=10, max_draft=3) == ([],
                                                                           End.DIVERGED)


def test_a_row_that_ends_inside_the_window_stops_there():
    cycles, end = walk(IDS[:11], 4, GREEDY, _right(4, 16), window=16, max_draft=3)
    # 105..108, then 109..112: the drafts at 109..111 are judged by the target's choices
    # at 108..110, all inside the row, so that cycle is exact; the walk ends there
    assert (cycles, end) == ([4, 4], End.ENDED)
    assert walk(IDS[:4], 4, GREEDY, _right(4, 8), window=8, max_draft=3) == ([], End.ENDED)


# -- replay against decoding, on the tiny target ------------------------------------------

def test_on_the_targets_own_output_the_walk_is_decoding(trained_tiny, tiny_target):
    """fp32 on CPU: the full-row forwards give the cached decoding's choices exactly here
    (no float64 needed). The trained tiny drafter accepts whole blocks at times, so the
    cycles compared are not all ones."""
    window = 32
    prompts = [prompt_of(ex) for ex in trained_tiny.trainer.held_out]
    rows = _greedy_rows(tiny_target, prompts, window)
    got = replay(tiny_target, trained_tiny.drafter, rows, window=window, batch_size=5)
    decoded = _decoded(tiny_target, trained_tiny.drafter, prompts, window)
    assert list(got.cycles) == decoded
    assert got.stopped == 0 and got.rows == len(prompts)
    assert max(decoded) == 4 and sum(n > 1 for n in decoded) >= 10, decoded
    assert got.tau == sum(decoded) / len(decoded)


def test_an_untrained_drafter_walks_as_it_decodes_too(tiny_target):
    drafter, prompts = _drafter(tiny_target), _prompts(4)
    rows = _greedy_rows(tiny_target, prompts, 24)
    got = replay(tiny_target, drafter, rows, window=24, batch_size=3)
    assert list(got.cycles) == _decoded(tiny_target, drafter, prompts, 24)


def test_a_row_leaving_the_targets_choice_stops_its_walk_there(tiny_target):
    drafter, prompts, window = _drafter(tiny_target), _prompts(3), 16
    rows = _greedy_rows(tiny_target, prompts, window)
    ids, start = rows[1]
    changed = [*ids[:start + 5], (ids[start + 5] + 1) % 500, *ids[start + 6:]]
    rows[1] = (changed, start)
    got = replay(tiny_target, drafter, rows, window=window, batch_size=3)
    assert (got.diverged, got.ended, got.stopped) == (1, 0, 1)
    alone = [replay(tiny_target, drafter, [row], window=window, batch_size=1).cycles
             for row in rows]
    assert got.cycles == alone[0] + alone[1] + alone[2]
    # row 1 follows decoding until the cycle that reaches the changed position
    cut, decoded = list(alone[1]), _decoded(tiny_target, drafter, prompts[1:2], window)
    assert cut[:-1] == decoded[:len(cut) - 1] and cut[-1] <= decoded[len(cut) - 1]
    assert 1 + sum(cut[:-1]) < 6 <= 1 + sum(cut)
    # changed at the first response token: no cycle at all
    first = [*ids[:start], (ids[start] + 1) % 500, *ids[start + 1:]]
    none = replay(tiny_target, drafter, [(first, start)], window=window, batch_size=1)
    assert (none.cycles, none.diverged) == ((), 1)


def test_the_window_caps_the_walk(tiny_target):
    drafter, prompts = _drafter(tiny_target), _prompts(3)
    rows = _greedy_rows(tiny_target, prompts, 40)
    for window in (1, 2, 9):
        got = replay(tiny_target, drafter, rows, window=window, batch_size=2)
        # decoding emits the first token outside any cycle, the other W-1 in cycles
        assert sum(got.cycles) == len(rows) * (window - 1)
        assert got.stopped == 0
        assert list(got.cycles) == _decoded(tiny_target, drafter, prompts, window)
    # what lies past the window is never read: garbage there changes nothing
    ids, start = rows[0]
    garbage = [(ids[:start + 9] + [7] * 30, start), *rows[1:]]
    assert replay(tiny_target, drafter, garbage, window=9, batch_size=2).cycles == \
        replay(tiny_target, drafter, rows, window=9, batch_size=2).cycles
    # a row shorter than the window stops where it ends
    short = replay(tiny_target, drafter, [(ids[:start + 5], start)], window=9,
                   batch_size=1)
    assert (short.ended, short.diverged) == (1, 0) and 1 + sum(short.cycles) >= 6


def test_a_row_needs_a_prompt():
    with pytest.raises(ValueError, match="at least one token"):
        walk(IDS, 0, GREEDY, _right(0, 4), window=4, max_draft=3)
