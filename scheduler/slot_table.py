"""The scheduler's mirror of every slot's record, plus per-slot bookkeeping.

Design: the pool owns the real records, but it may only be called from the engine worker
thread, while routing runs on the event loop. So the scheduler keeps this mirror, updated when
it plans each pool operation (the plan is then executed in exactly that order) and resynchronised
from the pool after a failure. `check_integrity(pool)` compares mirror and pool (tests call it
while no step is running).
"""

from __future__ import annotations

import numpy as np

from .divergence import Divergence
from .interface import SlotPool


class SlotTable:
    def __init__(self, num_slots: int, ctx_len: int) -> None:
        self.num_slots = num_slots
        self.ctx_len = ctx_len
        self.tokens = np.zeros((num_slots, ctx_len), dtype=np.int32)  # [slot, pos] records
        self.lens = [0] * num_slots  # record length per slot
        # shortest length each slot can be cut back to (pool.min_truncate_len): set by planned
        # truncates, copies and restores, and read back from the pool after every step
        self.floors = [0] * num_slots
        self.last_used = [0.0] * num_slots  # monotonic time a request last released the slot
        self.num_reuse_hits = [0] * num_slots
        self.num_reused_tokens = [0] * num_slots
        # where the last request routed here left what the server held (GET /slots)
        self.last_divergence: list[Divergence | None] = [None] * num_slots
        self.session_keys: list[str | None] = [None] * num_slots  # the last routed request's

    def record(self, slot: int) -> np.ndarray:
        """Read-only view of the slot's record: int32 [len]."""
        view = self.tokens[slot, : self.lens[slot]]
        view.flags.writeable = False
        return view

    def live_records(self) -> list[tuple[np.ndarray, int]]:
        """Every slot's record (read-only view) and the shortest length it can be cut back to."""
        return [(self.record(s), self.floors[s]) for s in range(self.num_slots)]

    def truncate(self, slot: int, n: int) -> None:
        assert n == 0 or self.floors[slot] <= n <= self.lens[slot], (slot, n, self.floors[slot])
        self.lens[slot] = n
        if n == 0:
            self.floors[slot] = 0

    def append(self, slot: int, toks: np.ndarray) -> None:
        n = self.lens[slot]
        assert n + toks.shape[0] <= self.ctx_len
        self.tokens[slot, n : n + toks.shape[0]] = toks
        self.lens[slot] = n + toks.shape[0]

    def assign(self, slot: int, toks: np.ndarray, floor: int) -> None:
        """Make the record exactly `toks`, cut back to `floor` at the shortest."""
        assert toks.shape[0] <= self.ctx_len and 0 <= floor <= toks.shape[0]
        self.tokens[slot, : toks.shape[0]] = toks
        self.lens[slot] = int(toks.shape[0])
        self.floors[slot] = floor

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        assert src != dst and self.floors[src] <= n <= self.lens[src]
        self.tokens[dst, :n] = self.tokens[src, :n]
        self.lens[dst] = n
        self.floors[dst] = self.floors[src]

    def check_integrity(self, pool: SlotPool) -> None:
        """Assert the mirror equals the pool's records (call only between steps)."""
        for s in range(self.num_slots):
            rec = np.asarray(pool.record(s))
            assert pool.slot_len(s) == self.lens[s] == rec.shape[0], (s, self.lens[s], rec.shape)
            assert np.array_equal(rec, self.tokens[s, : self.lens[s]]), f"slot {s} record differs"
            assert pool.min_truncate_len(s) == self.floors[s], (s, pool.min_truncate_len(s), self.floors[s])
