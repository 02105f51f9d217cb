"""The records of a finished (or rejected) request: pure functions, no scheduler state."""

from __future__ import annotations

from .request import FinishEvent, FinishReason, GenerationRequest, ReuseSource
from .sequence import Sequence
from .stats import Outcome, RequestStats

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
    ev = FinishEvent(reason, text, seq.prompt_len, seq.num_generated, seq.reuse, error, timings, stop)
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
