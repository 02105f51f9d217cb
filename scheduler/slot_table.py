"""The scheduler's mirror of every slot's record, plus per-slot bookkeeping.

Design: the pool owns the real records, but it may only be called from the engine worker
thread, while routing runs on the event loop. So the scheduler keeps this mirror, updated when
it plans each pool operation (the plan is then executed in exactly that order) and resynchronised
from the pool after a failure. `check_integrity(pool)` compares mirror and pool (tests call it
while no step is running).
"""

from __future__ import annotations

import numpy as np


class SlotTable:
    def __init__(self, num_slots: int, ctx_len: int) -> None:
        self.num_slots = num_slots
        self.ctx_len = ctx_len
        self.tokens = np.zeros((num_slots, ctx_len), dtype=np.int32)  # [slot, pos] records
        self.lens = [0] * num_slots  # record length per slot
        self.last_used = [0.0] * num_slots  # monotonic time a request last released the slot
        self.num_reuse_hits = [0] * num_slots
        self.num_reused_tokens = [0] * num_slots

    def record(self, slot: int) -> np.ndarray:
        """Read-only view of the slot's record: int32 [len]."""
        view = self.tokens[slot, : self.lens[slot]]
        view.flags.writeable = False
        return view

    def truncate(self, slot: int, n: int) -> None:
        assert 0 <= n <= self.lens[slot]
        self.lens[slot] = n

    def append(self, slot: int, toks: np.ndarray) -> None:
        n = self.lens[slot]
        assert n + toks.shape[0] <= self.ctx_len
        self.tokens[slot, n : n + toks.shape[0]] = toks
        self.lens[slot] = n + toks.shape[0]

    def assign(self, slot: int, toks: np.ndarray) -> None:
        """Make the record exactly `toks`."""
        assert toks.shape[0] <= self.ctx_len
        self.tokens[slot, : toks.shape[0]] = toks
        self.lens[slot] = int(toks.shape[0])

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        assert src != dst and n <= self.lens[src]
        self.tokens[dst, :n] = self.tokens[src, :n]
        self.lens[dst] = n

    def check_integrity(self, pool) -> None:
        """Assert the mirror equals the pool's records (call only between steps)."""
        for s in range(self.num_slots):
            rec = np.asarray(pool.record(s))
            assert pool.slot_len(s) == self.lens[s] == rec.shape[0], (s, self.lens[s], rec.shape)
            assert np.array_equal(rec, self.tokens[s, : self.lens[s]]), f"slot {s} record differs"
