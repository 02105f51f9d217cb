"""StatsRecorder: the StatsSink that turns scheduler events into Prometheus counters/histograms.

Design: the scheduler calls these methods from its step loop or its engine worker thread.
prometheus-client guards every value with its own lock, so the recorder needs no lock of its
own and never blocks for long. It never raises into the scheduler: an event whose fields break
the contract in `scheduler/stats.py` is dropped, logged once per kind and counted in
`slotserve_stats_dropped_total{kind}`. With `strict=True` (tests) it raises ValueError instead.
"""

from __future__ import annotations

import logging

from slotserve.scheduler.stats import (
    CancelStats,
    CheckpointEvent,
    CheckpointTier,
    Phase,
    PrefillClass,
    RequestStats,
    ReuseSource,
    RouteStats,
    StepStats,
)

from .definitions import PushedMetrics, StatsKind

log = logging.getLogger(__name__)

_RESTORE_TIER = {
    ReuseSource.CHECKPOINT_MEMORY: CheckpointTier.MEMORY,
    ReuseSource.CHECKPOINT_DISK: CheckpointTier.DISK,
}


class StatsRecorder:
    """Implements `scheduler.stats.StatsSink` on top of `PushedMetrics`."""

    def __init__(self, metrics: PushedMetrics, *, strict: bool = False):
        self._m = metrics
        self._strict = strict
        self._warned: set[str] = set()  # kinds already logged once

    # ------------------------------------------------------------ StatsSink

    def on_step(self, s: StepStats) -> None:
        """One engine forward call: duration, tokens by phase, batch size."""
        if s.num_tokens < 0 or s.num_prefill_tokens < 0 or s.num_decode_tokens < 0 or s.batch_size < 0:
            self._drop(StatsKind.STEP, f"negative count in {s!r}")
            return
        m = self._m
        m.step_seconds.observe(s.duration_s)
        m.step_tokens.observe(s.num_tokens)
        m.step_batch.observe(s.batch_size)
        m.engine_tokens[Phase.PREFILL].inc(s.num_prefill_tokens)
        m.engine_tokens[Phase.DECODE].inc(s.num_decode_tokens)
        if s.chained:
            m.chained_steps.inc()
        if s.num_discarded_tokens:
            m.discarded_tokens.inc(s.num_discarded_tokens)
        if s.num_drafted_tokens:
            m.spec_drafted_tokens.inc(s.num_drafted_tokens)
            m.spec_accepted_tokens.inc(s.num_accepted_tokens)

    def on_request(self, s: RequestStats) -> None:
        """One finished request (any outcome).

        A request "reached a slot" when it computed or reused at least one prompt token; only
        those count in the reuse counters, so queued cancels and rejections do not dilute the
        hit rate or the reuse ratio.
        """
        m = self._m
        counter = m.requests.get(s.outcome)
        if counter is None:
            self._drop(StatsKind.REQUEST, f"outcome {s.outcome!r} is not an Outcome")
            return
        try:
            source = ReuseSource(s.reuse_source)
        except ValueError:
            self._drop(StatsKind.REQUEST, f"reuse_source {s.reuse_source!r} is not a ReuseSource")
            return
        if min(s.prompt_tokens, s.reused_tokens, s.prefilled_tokens, s.completion_tokens) < 0:
            self._drop(StatsKind.REQUEST, f"negative token count in {s!r}")
            return
        if s.reused_tokens > 0 and source is ReuseSource.NONE:
            self._drop(StatsKind.REQUEST, f"{s.reused_tokens} reused tokens with reuse_source none")
            return
        counter.inc()
        if s.reused_tokens > 0 or s.prefilled_tokens > 0:
            m.reuse_requests[source if s.reused_tokens > 0 else ReuseSource.NONE].inc()
            m.prompt_tokens.inc(s.prompt_tokens)
            if s.reused_tokens > 0:
                m.reused_tokens[source].inc(s.reused_tokens)
            m.prefilled_tokens.inc(s.prefilled_tokens)
        m.generated_tokens.inc(s.completion_tokens)
        if s.queue_s is not None:
            m.queue_wait.observe(s.queue_s)
        if s.ttft_s is not None:
            m.ttft.observe(s.ttft_s)
            m.ttft_by_class[PrefillClass.of(s.prompt_tokens, s.reused_tokens)].observe(s.ttft_s)
        if s.e2e_s is not None:
            m.e2e.observe(s.e2e_s)
        for gap in s.itl_s:
            m.itl.observe(gap)

    def on_checkpoint(self, e: CheckpointEvent) -> None:
        """A checkpoint captured, restored, evicted or dropped, with its size.

        A rule of None (the scheduler does not know which rule captured a dropped file or a disk
        restore) is labelled rule="unknown".
        """
        key = (e.kind, e.tier, e.rule)
        counter = self._m.checkpoints.get(key)
        if counter is None or e.num_bytes < 0:
            self._drop(StatsKind.CHECKPOINT, f"unknown kind/tier/rule or negative size in {e!r}")
            return
        counter.inc()
        self._m.checkpoint_bytes[key].inc(e.num_bytes)

    def on_route(self, r: RouteStats) -> None:
        """One routed request: what the sliding-window rings cost it, why it restored."""
        tier = _RESTORE_TIER.get(r.reuse_source)
        if r.window_recomputed_tokens < 0 or r.reused_tokens < 0:
            self._drop(StatsKind.ROUTE, f"negative token count in {r!r}")
            return
        restore = None
        if tier is not None and r.restore_reason is not None:
            restore = self._m.restores.get((tier, r.restore_reason))
        if (tier is None) != (r.restore_reason is None) or (tier is not None and restore is None):
            why = f"restore reason {r.restore_reason!r} does not fit source {r.reuse_source!r}"
            self._drop(StatsKind.ROUTE, why)
            return
        if r.window_refused:
            self._m.window_refused.inc()
        self._m.window_recomputed.inc(r.window_recomputed_tokens)
        if restore is not None:
            restore.inc()

    def on_cancel(self, c: CancelStats) -> None:
        """An acknowledged cancel and how long the acknowledgement took."""
        counter = self._m.cancels.get(c.phase)
        if counter is None or c.ack_s < 0:
            self._drop(StatsKind.CANCEL, f"unknown phase or negative ack time in {c!r}")
            return
        counter.inc()
        self._m.cancel_ack[c.phase].observe(c.ack_s)

    def on_preemption(self) -> None:
        """A running prefill paused for a higher-priority request."""
        self._m.preemptions.inc()

    # ------------------------------------------------------------ contract breaches

    def _drop(self, kind: StatsKind, why: str) -> None:
        if self._strict:
            raise ValueError(f"stats event breaks the contract in scheduler/stats.py: {why}")
        self._m.dropped[kind].inc()
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning("dropping %s stats event (further drops counted, not logged): %s", kind.value, why)
