"""The scheduler as the gateway sees it: the protocols `Scheduler` and `RequestHandle` satisfy.

The gateway types its `Runtime.scheduler` with `SchedulerAPI` rather than the concrete class, so
test doubles that script replies (tests/gateway_support.py) are checked against the same
contract; scheduler/request.py documents the behaviour behind each method.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from .request import FinishEvent, GenerationRequest, PrefillProgress, SlotView, TokenEvent
from .stats import SchedulerStats


class HandleAPI(Protocol):
    """One submitted request: its events, then an acknowledged cancel."""

    def __aiter__(self) -> AsyncIterator[TokenEvent | FinishEvent]: ...

    def batches(self) -> AsyncIterator[list[TokenEvent | FinishEvent]]:
        """The same events as lists: the next one and every one already queued behind it."""
        ...

    async def cancel(self) -> bool: ...

    def progress(self) -> PrefillProgress:
        """How far the prompt's prefill is (streams report it on request: docs/api.md)."""
        ...


class SchedulerAPI(Protocol):
    """submit/stats/slots/drain, entered as an async context (starts and stops the step loop)."""

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: object) -> None: ...

    def submit(self, req: GenerationRequest) -> HandleAPI: ...

    def stats(self) -> SchedulerStats: ...

    def slots(self) -> list[SlotView]: ...

    async def drain(self, grace_s: float) -> None: ...
