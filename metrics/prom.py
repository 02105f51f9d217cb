"""ServerMetrics: the one object the gateway holds for Prometheus.

    metrics = ServerMetrics()                    # its own CollectorRegistry
    sched = Scheduler(pool, cfg, ..., stats_sink=metrics.sink)
    metrics.bind(sched.stats)                    # levels are read at scrape time
    body, content_type = metrics.render()        # GET /metrics

Design: two halves share one registry. Events the scheduler pushes (`sink`, a StatsSink) feed
counters and histograms (`definitions.py`, `recorder.py`); levels (queue depth, slots, stored
checkpoint bytes) are read from `sched.stats()` by a custom collector at each scrape
(`levels.py`), so no gauge is ever stale. Extra families computed from the same snapshot plug in
through `LevelCollector(extra=...)`; router-compatible gauges belong there.
"""

from __future__ import annotations

from importlib import metadata

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from slotserve.scheduler.stats import StatsSink

from .definitions import PushedMetrics
from .levels import LevelCollector, StatsSource
from .recorder import StatsRecorder


def _version() -> str:
    try:
        return metadata.version("slotserve")
    except metadata.PackageNotFoundError:
        return "unknown"


class ServerMetrics:
    """Owns a CollectorRegistry with every slotserve metric.

    registry: where to register (default: a fresh one, so several servers or tests in one
    process never collide; pass `prometheus_client.REGISTRY` to share the global one).
    strict: raise ValueError on a stats event that breaks the contract instead of dropping it.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, strict: bool = False):
        # NOTE: process-wide switch: without it every counter also exports a `*_created` gauge,
        # doubling the series for no use in the text format Prometheus scrapes.
        disable_created_metrics()
        self.registry = CollectorRegistry() if registry is None else registry
        self.pushed = PushedMetrics(self.registry)
        self._sink = StatsRecorder(self.pushed, strict=strict)
        self._levels = LevelCollector()
        self.registry.register(self._levels)
        info = Gauge("slotserve_build_info", "Always 1; labels carry the slotserve version.", ["version"],
                     registry=self.registry)
        info.labels(_version()).set(1)
        ProcessCollector(namespace="slotserve", registry=self.registry)  # slotserve_process_* (Linux)

    @property
    def sink(self) -> StatsSink:
        """The StatsSink to hand the scheduler; safe to call from any thread."""
        return self._sink

    def bind(self, source: StatsSource | None) -> None:
        """Read levels from `source()` (normally `sched.stats`) at each scrape; None unbinds."""
        self._levels.bind(source)

    def render(self) -> tuple[bytes, str]:
        """(body, content type) of the Prometheus text exposition for GET /metrics."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
