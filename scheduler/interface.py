"""The engine as the scheduler sees it: a pool of KV slots.

Design: the scheduler never imports engine_ext. Anything with this shape can serve: the
C engine's `slotserve.engine_ext.SlotPool` in production, `scheduler.fake_engine.FakeSlotPool`
in fast tests. All methods are called from one worker thread at a time (the scheduler
serialises them); heavy ones release the GIL inside the engine.

A slot holds a *record*: the token ids whose KV rows it holds, in order. Position p of a
slot's KV corresponds to record[p]. The record is owned by the pool.

Rewind reach: a pool may keep its sliding-window layers in a ring of the window plus what one
step appends, instead of a row per position (`kv_window` is then the window). Once the ring has
wrapped, the rows a deep rewind needs are overwritten, so each slot says how far back it can be
cut with its state exact: `min_truncate_len(slot)`. Every length in
min_truncate_len(slot)..slot_len(slot) is reachable by truncate, copy_prefix and snapshot; a
shorter one is refused with ValueError (nothing changes), except truncate(slot, 0), which empties
the slot. A full-KV pool answers 0 everywhere (`kv_window` None). A snapshot carries exactly the
rows its length needs (the ring rows of the last window, not the whole ring), so a slot restored
from a snapshot of n tokens can be cut back to `restored_min_truncate_len(n)`, a pure function of
n that routing uses to tell which checkpoints can serve a shorter prefix.

Recurrent state (hybrid models: Gated DeltaNet, short convolutions, SSM): a recurrent layer
keeps one state per slot that summarises every position seen, with no row per position, so it
can only move forward or be replaced by a snapshot. For a slot of such a pool:
- `min_truncate_len(slot) == slot_len(slot)`: extend only; truncate(slot, 0) still empties it.
  An optional rollback ring of the last k states (k small, off by default; `rollback` says k)
  lowers it by at most k: every length from min_truncate_len up is reachable, exactly as for a
  ring. A forward of t tokens from length L keeps the states of lengths max(L, L + t - k) and
  up: a step of one token and a draft of at most k - 1 tokens can be cut back to its start, so
  a rejected draft (and a whole step a decode chain ran past its request) is taken back exactly;
  the scheduler drafts on such a pool only within that reach.
- `restored_min_truncate_len(n) == n` for every n >= 1 (a snapshot holds one state, the one at
  its end), which is also how the scheduler tells such a pool from a ring (a ring answers 0 for
  n within its window). A slot restored or copied into starts with no rollback history.
- snapshot / restore carry the recurrent state with the attention KV; restore refuses a
  snapshot of another layout (another model, recurrent vs not, another ring); `snapshot_nbytes`
  is exact (KV rows of n tokens plus the fixed bytes of the state).
- copy_prefix accepts the lengths truncate does, so a whole slot (n == slot_len) can always be
  copied: that is how n > 1 forks a prompt.
So routing can reuse a recurrent slot only when its record is a prefix of the prompt (an exact
extension), and a checkpoint only when it ends at or below the point where the prompt diverges.
(lfm2's short convolutions are not recurrent here: the engine keeps their inputs per position,
so such a pool answers like full KV, min_truncate_len 0; engine_ext/pool.py.)
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
    want_logits: return the logits of this item's last `want_logits` tokens (0..n; True is 1,
    the last token's; a verified draft asks for every row).
    """

    slot: int
    tokens: np.ndarray  # int32 [n]
    start_pos: int
    want_logits: int


@runtime_checkable
class SlotPool(Protocol):
    num_slots: int  # slots allocated at construction
    ctx_len: int  # tokens of KV per slot
    n_vocab: int  # logits row width
    kv_bytes: int  # total KV memory allocated, bytes
    fingerprint: str  # model + KV layout identity (ring or full rows included); snapshots carry it
    kv_window: int | None  # widest sliding window kept as a ring; None: every position rewindable
    rollback: int  # recurrent state: the earlier states each slot keeps (0: extend only); 0 without
    can_copy: bool
    can_snapshot: bool

    def slot_len(self, slot: int) -> int:
        """Number of tokens whose KV rows `slot` holds (== len(record(slot)))."""

    def record(self, slot: int) -> np.ndarray:
        """A read-only int32 [slot_len] view or copy of the token ids held by `slot`."""

    def forward(self, batch: Sequence[BatchItem]) -> np.ndarray:
        """Feed every item's tokens (prefill chunks and decode tokens mixed, at most one item per
        slot), append them to the records, and return float32 [k, n_vocab]: the logits of each
        item's last want_logits tokens, in batch order and then position order (k, the sum of
        want_logits, may be 0).

        Raises ValueError for a bad call (unknown slot, start_pos != slot_len, position past
        ctx_len, token id outside the vocabulary, empty batch or empty item, slot twice,
        want_logits outside 0..n); then
        nothing has changed. Any other exception means compute failed: the slots of that batch
        that the pool could not vouch for have been emptied (record length 0, "tainted");
        slots not in the batch are intact.
        """

    def min_truncate_len(self, slot: int) -> int:
        """The shortest length `slot` can be cut back to with its state exact (0 <= it <=
        slot_len). 0 for full KV and for a ring that has not wrapped; for a wrapped ring,
        slot_len minus the positions the ring holds beyond the window (a rewind of at most one
        step's tokens). For recurrent state slot_len, or slot_len minus the states its rollback
        ring still holds (module docstring)."""

    def restored_min_truncate_len(self, n: int) -> int:
        """min_truncate_len of a slot right after restoring a snapshot of n tokens: 0 for full
        KV or n within the window, else n (the snapshot restores only its own length); n for
        recurrent state, whatever n. Pure: may be called from any thread (routing calls it on the
        event loop)."""

    def truncate(self, slot: int, n: int) -> None:
        """Keep the first n tokens of `slot`: n == 0 (empty it) or
        min_truncate_len(slot) <= n <= slot_len. Raises ValueError otherwise; then nothing
        changed."""

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Make dst hold exactly src's first n tokens (KV rows and record); src unchanged.
        Needs can_copy and min_truncate_len(src) <= n <= slot_len(src) (n == 0 empties dst);
        raises ValueError otherwise, and then nothing changed."""

    def snapshot(self, slot: int, n: int) -> bytes:
        """A self-describing copy of the first n tokens of `slot` (header with fingerprint, n,
        KV dtype, layout version; the token ids; the KV rows, for ring layers the window's rows
        before n). Bytes-like (buffer protocol). Needs 0 < n and
        min_truncate_len(slot) <= n <= slot_len; raises ValueError otherwise."""

    def snapshot_nbytes(self, n: int) -> int:
        """Size in bytes of a snapshot of n tokens (for checkpoint budgets). Pure, any thread."""

    def restore(self, slot: int, snap: bytes) -> int:
        """Load a snapshot into `slot` (replacing its contents); returns the token count.
        Raises ValueError for a snapshot of another model/layout (a ring snapshot into a
        full-KV pool or the other way round, another window) or a damaged one; then the slot
        is unchanged."""
