"""The engine as the scheduler sees it: a pool of KV slots.

Design: the scheduler never imports engine_ext. Anything with this shape can serve: the
C engine's `slotserve.engine_ext.SlotPool` in production, `scheduler.fake_engine.FakeSlotPool`
in fast tests. All methods are called from one worker thread at a time (the scheduler
serialises them); heavy ones release the GIL inside the engine.

A slot holds a *record*: the token ids whose KV rows it holds, in order. Position p of a
slot's KV corresponds to record[p]. The record is owned by the pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One slot's share of a forward step.

    slot: which slot. tokens: int32 [n >= 1] ids to feed. start_pos: absolute position of
    tokens[0]; must equal the slot's current length (rewind first with `truncate`).
    want_logits: return the logits of the last token of this item.
    """

    slot: int
    tokens: np.ndarray  # int32 [n]
    start_pos: int
    want_logits: bool


@runtime_checkable
class SlotPool(Protocol):
    num_slots: int  # slots allocated at construction
    ctx_len: int  # tokens of KV per slot
    n_vocab: int  # logits row width
    kv_bytes: int  # total KV memory allocated, bytes
    fingerprint: str  # model + KV layout identity; snapshots carry it
    can_truncate: bool
    can_copy: bool
    can_snapshot: bool

    def slot_len(self, slot: int) -> int:
        """Number of tokens whose KV rows `slot` holds (== len(record(slot)))."""

    def record(self, slot: int) -> np.ndarray:
        """A read-only int32 [slot_len] view or copy of the token ids held by `slot`."""

    def forward(self, batch: Sequence[BatchItem]) -> np.ndarray:
        """Feed every item's tokens (prefill chunks and decode tokens mixed, at most one item per
        slot), append them to the records, and return float32 [k, n_vocab]: one row per item
        with want_logits, in batch order (k may be 0).

        Raises ValueError for a bad call (unknown slot, start_pos != slot_len, position past
        ctx_len, token id outside the vocabulary, empty batch or empty item, slot twice); then
        nothing has changed. Any other exception means compute failed: the slots of that batch
        that the pool could not vouch for have been emptied (record length 0, "tainted");
        slots not in the batch are intact.
        """

    def truncate(self, slot: int, n: int) -> None:
        """Keep the first n tokens of `slot` (0 <= n <= slot_len)."""

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Make dst hold exactly src's first n tokens (KV rows and record); src unchanged."""

    def snapshot(self, slot: int, n: int) -> bytes:
        """A self-describing copy of the first n tokens of `slot` (header with fingerprint, n,
        KV dtype, layout version; the token ids; the KV rows). Bytes-like (buffer protocol)."""

    def restore(self, slot: int, snap: bytes) -> int:
        """Load a snapshot into `slot` (replacing its contents); returns the token count.
        Raises ValueError for a snapshot of another model/layout or a damaged one; then the
        slot is unchanged."""
