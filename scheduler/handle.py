"""The gateway's handle on one submitted request."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from .request import FinishEvent, PrefillProgress, TokenEvent
from .sequence import Phase, Sequence

# the scheduler's cancel of one sequence: True once it finished as cancelled (acknowledged)
CancelFn = Callable[[Sequence], Awaitable[bool]]


class RequestHandle:
    """`async for ev in handle` yields TokenEvents then exactly one FinishEvent; `batches()`
    yields the same events as lists (what has queued up behind the next one).

    `await handle.cancel()` is idempotent: it returns True once the request is finished as
    cancelled (after the scheduler acknowledged it and released its slot), False if it had
    already finished for another reason. The cancel is the scheduler's, given at construction
    (the handle knows nothing else of the scheduler).
    """

    def __init__(self, seq: Sequence, cancel: CancelFn) -> None:
        self._seq = seq
        self._cancel = cancel

    @property
    def request_id(self) -> str:
        return self._seq.request_id

    @property
    def finish(self) -> FinishEvent | None:
        """The FinishEvent once the request finished, else None."""
        return self._seq.finish

    def __aiter__(self) -> AsyncIterator[TokenEvent | FinishEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[TokenEvent | FinishEvent]:
        while True:
            ev = await self._seq.events.get()
            yield ev
            if isinstance(ev, FinishEvent):
                return

    async def batches(self) -> AsyncIterator[list[TokenEvent | FinishEvent]]:
        """The events of iterating the handle, as lists: each is the next event plus every event
        already queued behind it, so a consumer that fell behind catches up in one go. The last
        list ends with the FinishEvent. Use either this or iteration, not both."""
        events = self._seq.events
        while True:
            batch = [await events.get()]
            while not isinstance(batch[-1], FinishEvent) and not events.empty():
                batch.append(events.get_nowait())
            yield batch
            if isinstance(batch[-1], FinishEvent):
                return

    async def cancel(self) -> bool:
        return await self._cancel(self._seq)

    def progress(self) -> PrefillProgress:
        """How far the prompt's prefill is now (a snapshot of the scheduler's counters)."""
        seq = self._seq
        total = seq.prompt_len
        if seq.phase is Phase.QUEUED:
            return PrefillProgress(total, 0, 0)
        cached = seq.reuse.reused_tokens if seq.reuse is not None else 0
        processed = total if seq.phase is not Phase.PREFILL else min(seq.num_computed, total)
        return PrefillProgress(total, processed, min(cached, processed))
