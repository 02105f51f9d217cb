"""`KVEventPool`: a SlotPool wrapper that mirrors slots as chained virtual blocks and emits the
differences as events (see the package docstring)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...scheduler.interface import BatchItem, SlotPool
from .publisher import KVEventsConfig, ZmqPublisher
from .wire import DEFAULT_BLOCK_SIZE, AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, chain_hashes


class KVEventPool:
    """A SlotPool that reports its slots' live prefixes as KV events; everything else delegates.

    Only blocks a request could reuse are reported: block i of a slot (tokens up to (i+1)*B)
    when (i+1)*B >= min_truncate_len(slot), the shortest length the slot can be cut back to. A
    full-KV slot reports every full block; a sliding-window slot only those its ring still
    covers; a recurrent slot (extend only) only its last block, when its record ends on a
    block boundary (a rollback ring of k states: the blocks ending in its last k tokens). A
    prompt that shares the earlier blocks and then diverges reuses nothing of such a slot, so a
    router must not count them. The chain hashes of the earlier blocks are still computed (a
    later block's hash chains over them) and are the reported blocks' parents.

    `publish` receives a list of events after each call that changed the live block set (from
    the thread calling the pool). When `resync` is set, the next mutating call first publishes
    AllBlocksCleared and every live block, then clears it. Attributes not in the SlotPool
    protocol are read from the wrapped pool unchanged.
    """

    def __init__(
        self,
        pool: SlotPool,
        publish: Callable[[list[KVEvent]], None],
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        medium: str | None = None,
        resync: threading.Event | None = None,
    ):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self._pool = pool
        self._publish = publish
        self._resync = resync
        self.block_size = block_size
        self.medium = medium
        self._blocks: list[list[int]] = [[] for _ in range(pool.num_slots)]  # [slot][block] hash
        self._first: list[int] = [0] * pool.num_slots  # [slot] first reported block
        self._refs: dict[int, int] = {}  # reported hash -> number of slots reporting it
        for slot in range(pool.num_slots):  # a pool may start non-empty (tests, restored state)
            if pool.slot_len(slot):
                self._sync(slot, 0)

    # protocol attributes
    num_slots = property(lambda self: self._pool.num_slots)
    ctx_len = property(lambda self: self._pool.ctx_len)
    n_vocab = property(lambda self: self._pool.n_vocab)
    kv_bytes = property(lambda self: self._pool.kv_bytes)
    fingerprint = property(lambda self: self._pool.fingerprint)
    kv_window = property(lambda self: self._pool.kv_window)
    rollback = property(lambda self: self._pool.rollback)
    can_copy = property(lambda self: self._pool.can_copy)
    can_snapshot = property(lambda self: self._pool.can_snapshot)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    @property
    def wrapped(self) -> SlotPool:
        return self._pool

    def slot_len(self, slot: int) -> int:
        return self._pool.slot_len(slot)

    def record(self, slot: int) -> np.ndarray:
        return self._pool.record(slot)

    def min_truncate_len(self, slot: int) -> int:
        return self._pool.min_truncate_len(slot)

    def restored_min_truncate_len(self, n: int) -> int:
        return self._pool.restored_min_truncate_len(n)

    def snapshot(self, slot: int, n: int) -> bytes:
        return self._pool.snapshot(slot, n)

    def snapshot_nbytes(self, n: int) -> int:
        return self._pool.snapshot_nbytes(n)

    def forward(self, batch: Sequence[BatchItem]) -> np.ndarray:
        self._maybe_resync()
        try:
            return self._pool.forward(batch)
        finally:
            # On success every item only appended; on a compute failure some slots were emptied.
            # Either way the full blocks below min(old blocks, new length) are unchanged.
            self._emit([ev for item in batch for ev in self._sync(item.slot, None)])

    def truncate(self, slot: int, n: int) -> None:
        self._maybe_resync()
        try:
            self._pool.truncate(slot, n)
        finally:
            self._emit(self._sync(slot, None))

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        self._maybe_resync()
        try:
            self._pool.copy_prefix(src, dst, n)
        except BaseException:
            self._emit(self._sync(dst, None))  # unchanged (ValueError) or emptied (compute failure)
            raise
        self._emit(self._replace(dst, self._blocks[src][: n // self.block_size], self._first_reported(dst)))

    def restore(self, slot: int, snap: bytes) -> int:
        self._maybe_resync()
        try:
            n = self._pool.restore(slot, snap)
        except BaseException:
            self._emit(self._sync(slot, None))
            raise
        self._emit(self._sync(slot, 0))
        return n

    # mirror maintenance (caller: the thread that called the pool)

    def live_hashes(self) -> set[int]:
        """Hashes of every reported block live in some slot (what a subscriber should hold)."""
        return set(self._refs)

    def slot_hashes(self, slot: int) -> list[int]:
        """The chain hashes of every full block of `slot` (reported or not)."""
        return list(self._blocks[slot])

    def reported_hashes(self, slot: int) -> list[int]:
        """The hashes `slot` reports: its blocks from the first one a request could reuse."""
        return self._blocks[slot][self._first[slot] :]

    def check_integrity(self) -> None:
        """Recompute every slot's hashes from its record and compare with the mirror."""
        refs: dict[int, int] = {}
        for slot in range(self._pool.num_slots):
            expect = chain_hashes(np.asarray(self._pool.record(slot)), self.block_size)
            assert self._blocks[slot] == expect, (
                f"slot {slot}: mirror has {len(self._blocks[slot])} blocks, record {len(expect)}"
            )
            assert self._first[slot] == self._first_reported(slot), f"slot {slot}: stale first block"
            for h in expect[self._first[slot] :]:
                refs[h] = refs.get(h, 0) + 1
        assert refs == self._refs, "refcounts disagree with the slots' blocks"

    def _first_reported(self, slot: int) -> int:
        """Index of the first block of `slot` a request could reuse (see the class docstring)."""
        m = self._pool.min_truncate_len(slot)
        return max(0, -(-m // self.block_size) - 1)

    def _sync(self, slot: int, keep: int | None) -> list[KVEvent]:
        """Bring slot's blocks up to date; the first `keep` (None: all that still fit) are valid."""
        old = self._blocks[slot]
        n = self._pool.slot_len(slot)
        nfull = n // self.block_size
        first = self._first_reported(slot)
        valid = min(len(old), nfull) if keep is None else min(keep, len(old), nfull)
        if valid == len(old) == nfull and first == self._first[slot]:
            return []
        new = old[:valid]
        if nfull > valid:
            rec = np.asarray(self._pool.record(slot))
            new += chain_hashes(
                rec[valid * self.block_size : nfull * self.block_size],
                self.block_size,
                new[-1] if new else None,
            )
        return self._replace(slot, new, first)

    def _replace(self, slot: int, new: list[int], first: int) -> list[KVEvent]:
        """Make `new` slot's block list, reported from block `first`; returns the events for
        hashes entering/leaving the union of reported blocks."""
        old = self._blocks[slot][self._first[slot] :]
        self._blocks[slot] = new
        self._first[slot] = first
        stored_idx: list[int] = []
        for i in range(first, len(new)):  # incref first so a block kept by this slot never flickers
            h = new[i]
            c = self._refs.get(h, 0)
            self._refs[h] = c + 1
            if c == 0:
                stored_idx.append(i)
        removed: list[int] = []
        for h in old:
            c = self._refs[h] - 1
            if c == 0:
                del self._refs[h]
                removed.append(h)
            else:
                self._refs[h] = c
        events: list[KVEvent] = []
        if removed:
            events.append(BlockRemoved(block_hashes=removed, medium=self.medium))
        if stored_idx:
            rec = np.asarray(self._pool.record(slot))
            bs = self.block_size
            run_start = stored_idx[0]
            for k, i in enumerate(stored_idx):  # one BlockStored per run of consecutive blocks
                last = k + 1 == len(stored_idx) or stored_idx[k + 1] != i + 1
                if last:
                    events.append(
                        BlockStored(
                            block_hashes=new[run_start : i + 1],
                            parent_block_hash=new[run_start - 1] if run_start > 0 else None,
                            token_ids=rec[run_start * bs : (i + 1) * bs].tolist(),
                            block_size=bs,
                            lora_id=None,
                            medium=self.medium,
                        )
                    )
                    if k + 1 < len(stored_idx):
                        run_start = stored_idx[k + 1]
        return events

    def full_state(self) -> list[KVEvent]:
        """AllBlocksCleared, then every reported block once (one BlockStored per slot's new suffix)."""
        events: list[KVEvent] = [AllBlocksCleared()]
        seen: set[int] = set()
        bs = self.block_size
        for slot, blocks in enumerate(self._blocks):
            # chains share prefixes: the blocks not yet sent form a suffix of this slot's chain
            start = self._first[slot]
            first = next((i for i in range(start, len(blocks)) if blocks[i] not in seen), len(blocks))
            if first == len(blocks):
                continue
            rec = np.asarray(self._pool.record(slot))
            events.append(
                BlockStored(
                    block_hashes=blocks[first:],
                    parent_block_hash=blocks[first - 1] if first > 0 else None,
                    token_ids=rec[first * bs : len(blocks) * bs].tolist(),
                    block_size=bs,
                    lora_id=None,
                    medium=self.medium,
                )
            )
            seen.update(blocks[first:])
        return events

    def _maybe_resync(self) -> None:
        if self._resync is not None and self._resync.is_set():
            self._resync.clear()
            self._publish(self.full_state())

    def _emit(self, events: list[KVEvent]) -> None:
        if events:
            self._publish(events)


def wrap_pool(pool: SlotPool, config: KVEventsConfig) -> tuple[KVEventPool, ZmqPublisher]:
    """Production wiring: a started publisher and the pool that feeds it. Close the publisher
    after the scheduler stops."""
    publisher = ZmqPublisher(config)
    publisher.start()
    wrapped = KVEventPool(
        pool,
        publisher.publish,
        block_size=config.block_size,
        medium=config.medium,
        resync=publisher.resync_requested,
    )
    return wrapped, publisher
