"""Gauges under vLLM's names, read by cache-aware routers that know only vLLM's metrics.

Design: the Kubernetes Gateway API Inference Extension endpoint picker and the llm-d router
scrape each model server's /metrics and read three gauges by name. slotserve exports them beside
its own `slotserve_*` series, computed from the same `SchedulerStats` snapshot:

    vllm:num_requests_waiting   requests admitted and waiting for a slot    == slotserve_queue_depth
    vllm:num_requests_running   requests holding a slot                     == slotserve_running_requests
    vllm:kv_cache_usage_perc    live KV tokens / (slots x ctx_len), 0 to 1  (sum of slotserve_slot_tokens
                                                                             / slots / slot capacity)

NOTE: the colon names and the `_perc` suffix on a 0-1 ratio break slotserve's own naming rules on
purpose: they are a compatibility contract with routers, not metrics to build dashboards on. Use
the `slotserve_*` series for that. Each family carries one series labelled `model_name`, as vLLM's do.

Two ways to plug in: `router_compat_maker(model_name)` returns a family maker for
`metrics.levels.LevelCollector(extra=[...])` (one `stats()` call per scrape serves both), and
`RouterCompatCollector(source, model_name)` is a standalone prometheus-client collector.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from slotserve.scheduler.stats import SchedulerStats

log = logging.getLogger(__name__)

NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
ROUTER_METRIC_NAMES = (NUM_REQUESTS_WAITING, NUM_REQUESTS_RUNNING, KV_CACHE_USAGE)


def kv_cache_usage(s: SchedulerStats) -> float:
    """Fraction of all KV rows that hold a token: sum(slot tokens) / (num slots * ctx_len), in [0, 1]."""
    capacity = len(s.slots) * s.ctx_len
    if capacity <= 0:
        return 0.0
    live = sum(slot.num_tokens for slot in s.slots)
    return min(1.0, max(0.0, live / capacity))


def router_compat_families(s: SchedulerStats, model_name: str) -> Iterator[Metric]:
    """The three router-facing gauges of one snapshot, each with one `model_name` series."""
    specs = (
        (
            NUM_REQUESTS_WAITING,
            "Router compatibility (vLLM name): requests waiting for a slot.",
            s.queue_depth,
        ),
        (NUM_REQUESTS_RUNNING, "Router compatibility (vLLM name): requests holding a slot.", s.num_running),
        (
            KV_CACHE_USAGE,
            "Router compatibility (vLLM name): live KV tokens / (slots x ctx_len), 0 to 1.",
            kv_cache_usage(s),
        ),
    )
    for name, help_text, value in specs:
        family = GaugeMetricFamily(name, help_text, labels=["model_name"])
        family.add_metric([model_name], float(value))
        yield family


def router_compat_maker(model_name: str) -> Callable[[SchedulerStats], Iterator[Metric]]:
    """A family maker for `LevelCollector(extra=[router_compat_maker(name)])`."""

    def make(s: SchedulerStats) -> Iterator[Metric]:
        return router_compat_families(s, model_name)

    return make


class RouterCompatCollector(Collector):
    """Standalone collector: calls `source()` (normally `sched.stats`) once per scrape.

    When `source` is None or raises, the families are absent from that scrape (never stale).
    """

    def __init__(self, source: Callable[[], SchedulerStats] | None, model_name: str):
        self._source = source
        self._model_name = model_name

    def bind(self, source: Callable[[], SchedulerStats] | None) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []  # do not call the scheduler at registration time

    def collect(self) -> Iterator[Metric]:
        source = self._source
        if source is None:
            return
        try:
            snapshot = source()
        except Exception:  # a scrape must still answer; the cause goes to the log
            log.exception("scheduler stats() failed during a router-compat scrape")
            return
        yield from router_compat_families(snapshot, self._model_name)
