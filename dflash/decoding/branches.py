"""Two drafts verified in one target forward: the hybrid drafter's cycle on the static path.

Choosing one draft per cycle before the verify loses whenever the other would have been
accepted further: on the real target of issue 36 the hybrid that took prompt lookup's
draft wherever the context repeated reached τ 4.49 against the DFlash drafter's 6.13
alone (BENCHMARKS.md, "Why the hybrid lost"). But at batch 1 a target forward is bound by
its launches, not its rows: one of 2T-1 tokens costs about one of T. So where prompt
lookup has a draft, both are verified at once, side by side, and the cycle keeps the
branch that accepted more (a tie keeps the drafter's). A cycle then accepts the larger
of the two by construction, and every emitted token is still the target's greedy choice.

With the anchor at position p, T = max_draft + 1 and S the cache's ``slots``:

- rows: ``[anchor, A_1..A_{T-1}, B_1..B_{T-1}]`` (A: the drafter's drafts, B: the
  lookup's, padded; the rows past a short draft are never read);
- positions (RoPE): p, p+1..p+T-1, then p+1..p+T-1 again;
- K/V slots: p..p+T-1 as a one-branch verify, then B's in the spare region S..S+T-2 of
  :class:`~dflash.decoding.static.StaticTarget` (past every position, so no other query
  ever sees it, and every B slot is written before a B row reads it);
- visible: A row i the slots <= p+i; B row j the slots <= p (the text and the anchor)
  and the spare slots S..S+j-1 (its own branch up to itself).

Each row so sees exactly the keys it would see in a one-branch verify of its own branch,
at other slots; masked keys weigh zero. The tokens are those of two separate verifies
and the features agree to rounding (the matmuls run over another number of rows).

When B wins with n drafts, :meth:`TwoBranchVerify.keep_lookup` copies the whole spare
region into slots p+1..p+T-1 of every layer: a fixed shape, and the slots past p+n hold
nothing visible and are overwritten before they could be. Both the verify and the copy
are functions of fixed tensors (the position on the device), each recorded as its own
CUDA graph by :class:`~dflash.decoding.static.Captured`; the one-branch verify stays for
the cycles that have one draft. The eager path (any target) has no spare slots to lay a
branch in and keeps the one-draft choice of :class:`~dflash.decoding.cycle.Drafting`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from dflash.decoding.static import Captured, StaticTarget


class TwoBranchVerify:
    """The drafter's block and prompt lookup's draft in one forward of ``verifier``'s
    target, on its cache; ``verifier`` must have ``block - 1`` spare slots."""

    def __init__(self, verifier: StaticTarget, graphs: bool) -> None:
        t = verifier.block
        top = verifier.slots
        if verifier.cache.slots - top < t - 1:
            raise ValueError(f"the lookup branch needs {t - 1} spare slots past the cache's "
                             f"{top}, it has {verifier.cache.slots - top}")
        device = verifier.target.device
        self.verifier, self.block = verifier, t
        steps = torch.arange(t, device=device)
        self.offsets_N = torch.cat([steps, steps[1:]])
        """Each row's position minus the anchor's."""
        self.limit_N = torch.cat([steps, torch.zeros_like(steps[1:])])
        """Each row's last visible text slot minus the anchor's: B rows stop at it."""
        self.spare = top + steps[:-1]
        self.dest = steps[1:]
        """Where the spare region goes when B wins, minus the anchor's slot."""
        slot_ids = verifier.slot_ids
        own_NK = torch.zeros(2 * t - 1, slot_ids.shape[0], dtype=torch.bool, device=device)
        own_NK[t:] = (slot_ids[None, :] >= top) & (slot_ids[None, :] < top + steps[1:, None])
        self.own_NK = own_NK
        """B row j's own branch: spare slots S..S+j-1 (no A row sees a spare slot)."""
        self.lookup_rows = torch.cat([steps[:1], steps[1:] + t - 1])
        """The rows of branch B: the anchor, then B_1..B_{T-1}."""
        self.ids_1N = torch.zeros(1, 2 * t - 1, dtype=torch.long, device=device)
        self.start = torch.zeros((), dtype=torch.long, device=device)
        self.step = Captured(lambda: self.forward(self.ids_1N, self.start), graphs)
        self.move = Captured(lambda: self.promote(self.start), graphs)

    def forward(self, ids_1N: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
        """The greedy token after each of the 2T-1 rows [2T-1] and their tapped features
        [1, 2T-1, k*H], the anchor at position ``start``."""
        t = self.block
        pos_N = start + self.offsets_N
        where_N = torch.cat([pos_N[:t], self.spare])
        seen_NK = (self.verifier.slot_ids[None, :] <= (start + self.limit_N)[:, None]) \
            | self.own_NK
        return self.verifier.rows(ids_1N, pos_N, where_N, seen_NK)

    def promote(self, start: Tensor) -> tuple[Tensor, ...]:
        """Branch B's K/V from the spare slots to slots start+1..start+T-1, every layer."""
        cache = self.verifier.cache
        top, dest = self.verifier.slots, start + self.dest
        for store in (*cache.keys, *cache.values):
            store.index_copy_(2, dest, store[:, :, top:top + self.block - 1].clone())
        return ()

    @torch.no_grad()
    def verify(self, block_1M: Tensor, lookup: Sequence[int], start: int
               ) -> tuple[Tensor, Tensor, Tensor]:
        """``block_1M`` (the anchor and the drafter's M-1 <= T-1 drafts, on the device) and
        ``lookup`` (1..T-1 drafts after the same anchor) at ``start``: the greedy token
        after each row of branch A [M], after each row of branch B (the anchor, then the
        L drafts) [L+1], and the features of all 2T-1 rows [1, 2T-1, k*H] (A's rows first,
        then B's from row T; rows of padding included). The features are the captured
        output: use them before the next call."""
        m, n_look, t = block_1M.shape[1], len(lookup), self.block
        if start + t > self.verifier.slots:
            raise ValueError(f"a block at {start} runs past the cache's "
                             f"{self.verifier.slots} slots")
        if not 1 <= n_look <= t - 1 or m > t:
            raise ValueError(f"a two-branch verify of block {t} takes at most {t - 1} drafts "
                             f"a branch and at least one lookup draft, got {m - 1} and {n_look}")
        self.ids_1N[:, :m].copy_(block_1M)
        # Pinned and asynchronous: a plain host copy would wait for the drafter's queued
        # block; the caching host allocator keeps the buffer until the copy has run.
        staged = torch.tensor(list(lookup), dtype=torch.long,
                              pin_memory=self.ids_1N.is_cuda)
        self.ids_1N[0, t:t + n_look].copy_(staged, non_blocking=True)
        self.start.fill_(start)
        truth_N, feats_1NF = self.step.run()
        return truth_N[:m], truth_N[self.lookup_rows[:n_look + 1]], feats_1NF

    @torch.no_grad()
    def keep_lookup(self, start: int) -> None:
        """After branch B won at ``start``: its K/V where a B-only verify would have left
        them (slots start+1..), so the next cycle reads the accepted text there."""
        self.start.fill_(start)
        self.move.run()

    def accepted_rows(self, feats_1NF: Tensor, n: int, lookup_won: bool) -> Tensor:
        """The features of the accepted positions, anchor first: the drafter's next
        context."""
        if not lookup_won:
            return feats_1NF[:, :n + 1]
        return torch.cat([feats_1NF[:, :1], feats_1NF[:, self.block:self.block + n]], dim=1)
