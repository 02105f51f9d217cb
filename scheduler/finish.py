"""Ending requests: `Finisher`, the one place a request becomes DONE, and the records of a
finished (or rejected) request (pure functions).

Design: a request ends exactly once (stop, length, cancel, timeout, error), from whichever part
of the scheduler noticed it: `Finisher.finish` takes it out of the `RequestTable` (queue or
slot), puts its FinishEvent on its event stream, resolves a waiting cancel, hands its stats to
the sink and sets `changed` (what `drain` waits on). `release` takes a request's slot back (also
without ending it: preempted or rerouted requests) and tells the scheduler through
`on_release(slot, held)`, which ends a decode chain's use of the slot and wakes the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .request import FinishEvent, FinishReason, GenerationRequest, ReuseSource
from .request_table import RequestTable
from .sequence import Phase, Sequence
from .stats import CancelStats, GuardedSink, Outcome, RequestStats

_OUTCOME = {
    FinishReason.STOP: Outcome.OK,
    FinishReason.LENGTH: Outcome.OK,
    FinishReason.CANCELLED: Outcome.CANCELLED,
    FinishReason.TIMEOUT: Outcome.TIMEOUT,
    FinishReason.ERROR: Outcome.ERROR,
}


def rejected_stats(req: GenerationRequest) -> RequestStats:
    return RequestStats(
        Outcome.REJECTED, None, len(req.prompt_ids), 0, ReuseSource.NONE, 0, 0, None, None, None, ()
    )


def finish_records(
    seq: Sequence, reason: FinishReason, text: str, now: float, error: str | None
) -> tuple[FinishEvent, RequestStats]:
    """The FinishEvent the gateway receives and the RequestStats the metrics receive."""
    timings = {"e2e_s": now - seq.admitted_at, "prefill_s": seq.prefill_s}
    queue_s = seq.assigned_at - seq.admitted_at if seq.assigned_at is not None else None
    ttft_s = seq.first_token_at - seq.admitted_at if seq.first_token_at is not None else None
    if queue_s is not None:
        timings["queue_s"] = queue_s
    if ttft_s is not None:
        timings["ttft_s"] = ttft_s
    stop = seq.detok.matched_stop if reason is FinishReason.STOP else None
    drafted, accepted = (seq.spec.num_drafted, seq.spec.num_accepted) if seq.spec is not None else (0, 0)
    ev = FinishEvent(
        reason, text, seq.prompt_len, seq.num_generated, seq.reuse, error, timings, stop, drafted, accepted
    )
    reuse = seq.reuse
    stats = RequestStats(
        outcome=_OUTCOME[reason],
        finish_reason=reason,
        prompt_tokens=seq.prompt_len,
        reused_tokens=reuse.reused_tokens if reuse else 0,
        reuse_source=reuse.source if reuse else ReuseSource.NONE,
        prefilled_tokens=seq.num_prefilled,
        completion_tokens=seq.num_generated,
        queue_s=queue_s,
        ttft_s=ttft_s,
        e2e_s=now - seq.admitted_at,
        itl_s=tuple(seq.itl_s),
    )
    return ev, stats


class Finisher:
    def __init__(
        self, table: RequestTable, sink: GuardedSink, on_release: Callable[[int | None, bool], None]
    ) -> None:
        self._table = table
        self._sink = sink
        self._on_release = on_release  # (slot the request had, whether it held it)
        self.changed = asyncio.Event()  # set whenever a request finishes

    def release(self, seq: Sequence, now: float) -> None:
        """Take back the slot `seq` holds, if any (see RequestTable.release)."""
        slot = seq.slot
        held = self._table.release(seq, now)
        self._on_release(slot, held)

    def finish(
        self,
        seq: Sequence,
        reason: FinishReason,
        now: float,
        *,
        error: str | None = None,
        cancel_phase: Phase | None = None,
        cancel_at: float | None = None,
    ) -> None:
        """End `seq` for `reason` (no-op if it has ended). A cancel's stats count from
        `cancel_at`, else from its first cancel() call, in `cancel_phase` (default DECODE)."""
        if seq.phase is Phase.DONE:
            return
        self._table.remove_queued(seq)
        self.release(seq, now)
        seq.phase = Phase.DONE
        ev, stats = finish_records(seq, reason, seq.detok.flush(), now, error)
        seq.finish = ev
        seq.events.put_nowait(ev)
        if seq.ack is not None and not seq.ack.done():
            seq.ack.set_result(reason is FinishReason.CANCELLED)
        self._sink.on_request(stats)
        if reason is FinishReason.CANCELLED:
            started = cancel_at if cancel_at is not None else (seq.cancel_at or now)
            self._sink.on_cancel(CancelStats(cancel_phase or Phase.DECODE, now - started))
        self.changed.set()
