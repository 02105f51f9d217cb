"""ServerMetrics: the one object the gateway holds for Prometheus.

    metrics = ServerMetrics()                    # its own CollectorRegistry
    sched = Scheduler(pool, cfg, ..., stats_sink=metrics.sink)
    metrics.bind(sched.stats)                    # levels are read at scrape time
    body, content_type = metrics.render()        # GET /metrics
    # or, without bind: metrics.render(sched.stats()) reads levels from the snapshot given

Design: two halves share one registry. Events the scheduler pushes (`sink`, a StatsSink) feed
counters and histograms (`definitions.py`, `recorder.py`); levels (queue depth, slots, stored
checkpoint bytes) are read from `sched.stats()` by a custom collector at each scrape
(`levels.py`), so no gauge is ever stale. Extra families computed from the same snapshot plug in
through `LevelCollector(extra=...)`; router-compatible gauges belong there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from slotserve.scheduler.stats import Outcome, SchedulerStats, StatsSink

from slotserve import __version__

from .definitions import PushedMetrics
from .levels import FamilyMaker, LevelCollector, StatsSource
from .recorder import StatsRecorder


class ServerMetrics:
    """Owns a CollectorRegistry with every slotserve metric.

    registry: where to register (default: a fresh one, so several servers or tests in one
    process never collide; pass `prometheus_client.REGISTRY` to share the global one).
    strict: raise ValueError on a stats event that breaks the contract instead of dropping it.
    extra_levels: more family makers fed each scrape's snapshot (e.g. router-compat gauges,
    `metrics.router_compat.router_compat_maker(model_name)`).
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        strict: bool = False,
        extra_levels: Iterable[FamilyMaker] = (),
    ):
        # NOTE: process-wide switch: without it every counter also exports a `*_created` gauge,
        # doubling the series for no use in the text format Prometheus scrapes.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry() if registry is None else registry
        self.pushed = PushedMetrics(self.registry)
        self._sink = StatsRecorder(self.pushed, strict=strict)
        self._levels = LevelCollector(extra=extra_levels)
        self._render_lock = threading.Lock()
        self.registry.register(self._levels)
        info = Gauge(
            "slotserve_build_info",
            "Always 1; labels carry the slotserve version.",
            ["version"],
            registry=self.registry,
        )
        info.labels(__version__).set(1)
        ProcessCollector(namespace="slotserve", registry=self.registry)  # slotserve_process_* (Linux)

    @property
    def sink(self) -> StatsSink:
        """The StatsSink to hand the scheduler; safe to call from any thread."""
        return self._sink

    def on_gateway_request(self, outcome: Outcome) -> None:
        """Count a request that ended in the gateway before reaching the scheduler;
        `outcome` is one of `definitions.GATEWAY_OUTCOMES` (ValueError otherwise)."""
        counter = self.pushed.gateway_requests.get(outcome)
        if counter is None:
            raise ValueError(
                f"gateway outcome {outcome!r} is not one of {list(self.pushed.gateway_requests)}"
            )
        counter.inc()

    def on_prefix_divergence(self, part: str, reason: str) -> None:
        """Count a request whose prompt diverged in rendered `part` for `reason` (the gateway
        knows the parts; gateway/prompt_parts.py)."""
        counter = self.pushed.prefix_divergence.get((part, reason))
        if counter is None:
            raise ValueError(f"prefix divergence ({part!r}, {reason!r}) is not a known part and reason")
        counter.inc()

    def bind(self, source: StatsSource | None) -> None:
        """Read levels from `source()` (normally `sched.stats`) at each scrape; None unbinds."""
        self._levels.bind(source)

    def render(self, snapshot: SchedulerStats | None = None) -> tuple[bytes, str]:
        """(body, content type) of the Prometheus text exposition for GET /metrics.

        snapshot: levels for this scrape (normally `sched.stats()` taken by the caller);
        None reads them from the bound source, if any.
        """
        if snapshot is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        with self._render_lock, self._levels.pinned(snapshot):
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
