"""The requests the scheduler holds: the queue of those waiting for a slot and the table of those
holding one.

Design: one owner for both, used by the scheduler (which submits, finishes, cancels and times
out requests) and by admission (which moves requests from the queue to a slot and preempts
them back). A request is in at most one of the two: `enqueue` puts it in the queue (phase
QUEUED), `assign` moves it from the queue to a slot, `release` takes the slot back (and
`remove_queued` drops a queued one that finished). The queue is kept in (-priority, admission
order); admission may re-sort it by prefill order (`sort_queue`, stable).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, ValuesView
from typing import Any

from .request import SlotState, SlotView
from .sequence import Phase, Sequence
from .slot_table import SlotTable


class RequestTable:
    def __init__(self, slots: SlotTable) -> None:
        self._slots = slots
        self._queue: list[Sequence] = []  # waiting, by (-priority, order) or by prefill order
        self._running: dict[int, Sequence] = {}  # slot -> request holding it

    # -- reading ---------------------------------------------------------------------------
    @property
    def queue(self) -> list[Sequence]:
        """The waiting requests in admission order. Read it; change it only through this class."""
        return self._queue

    def running(self) -> ValuesView[Sequence]:
        """The requests holding a slot (a live view)."""
        return self._running.values()

    def lookup(self, slot: int) -> Sequence | None:
        """The request holding `slot`, or None if it is free."""
        return self._running.get(slot)

    def all(self) -> list[Sequence]:
        """Every request held: queued first, then running."""
        return [*self._queue, *self._running.values()]

    def __iter__(self) -> Iterator[Sequence]:
        yield from self._queue
        yield from self._running.values()

    @property
    def num_queued(self) -> int:
        return len(self._queue)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def is_empty(self) -> bool:
        return not self._queue and not self._running

    @property
    def all_slots_held(self) -> bool:
        return len(self._running) == self._slots.num_slots

    def slot_state(self, slot: int) -> SlotState:
        seq = self._running.get(slot)
        if seq is not None:
            return SlotState.DECODE if seq.phase is Phase.DECODE else SlotState.PREFILL
        return SlotState.IDLE if self._slots.lens[slot] else SlotState.EMPTY

    def slot_views(self, now: float) -> list[SlotView]:
        """Every slot as the gateway shows it (`/slots`)."""
        slots = self._slots
        out = []
        for s in range(slots.num_slots):
            seq = self._running.get(s)
            out.append(
                SlotView(
                    slot=s,
                    state=self.slot_state(s),
                    num_tokens=slots.lens[s],
                    idle_s=None if seq is not None else now - slots.last_used[s],
                    request_id=seq.request_id if seq is not None else None,
                    num_reuse_hits=slots.num_reuse_hits[s],
                    num_reused_tokens=slots.num_reused_tokens[s],
                    last_divergence=slots.last_divergence[s],
                )
            )
        return out

    # -- moving requests -------------------------------------------------------------------
    def enqueue(self, seq: Sequence) -> None:
        """Put `seq` in the queue behind every request of its priority or higher admitted earlier."""
        seq.phase = Phase.QUEUED
        key = (-seq.priority, seq.order)
        q = self._queue
        i = 0
        while i < len(q) and (-q[i].priority, q[i].order) < key:
            i += 1
        q.insert(i, seq)

    def sort_queue(self, key: Callable[[Sequence], Any]) -> None:
        """Re-sort the queue by `key` (stable: equal keys keep their order)."""
        self._queue.sort(key=key)

    def assign(self, seq: Sequence, slot: int) -> None:
        """Move queued `seq` to free `slot` (the caller sets its phase and counters)."""
        assert slot not in self._running, f"slot {slot} is held"
        self._remove(seq)
        self._running[slot] = seq
        seq.slot = slot

    def release(self, seq: Sequence, now: float) -> bool:
        """Take back the slot `seq` holds (the slot's idle time starts at `now`) and drop its
        pending token. True if it held one."""
        seq.pending_token = None
        if seq.slot is not None and self._running.get(seq.slot) is seq:
            del self._running[seq.slot]
            self._slots.last_used[seq.slot] = now
            return True
        return False

    def remove_queued(self, seq: Sequence) -> None:
        """Drop `seq` from the queue if it is there (a queued request that finished)."""
        if seq.phase is Phase.QUEUED:
            self._remove(seq)

    def _remove(self, seq: Sequence) -> None:
        for i, q in enumerate(self._queue):
            if q is seq:
                del self._queue[i]
                return

    def check_integrity(self) -> None:
        """Assert every running request's slot is its key and every queued one is QUEUED."""
        assert all(self._running[s].slot == s for s in self._running)
        assert all(q.phase is Phase.QUEUED for q in self._queue)
