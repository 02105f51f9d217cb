"""Levels read at scrape time: queue, slots, checkpoint stores, draining.

Design: a prometheus-client custom collector that calls the scheduler's `stats()` once per
scrape and turns the `SchedulerStats` snapshot into gauges. Nothing is cached between scrapes,
so a gauge can never be stale; when no source is bound (scheduler not started yet) or the source
raises, the level families are simply absent from that scrape and `slotserve_stats_up` reads 0.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from slotserve.scheduler.stats import CheckpointTier, SchedulerStats, SlotState

log = logging.getLogger(__name__)


StatsSource = Callable[[], SchedulerStats]
FamilyMaker = Callable[[SchedulerStats], Iterable[Metric]]


def level_families(s: SchedulerStats) -> Iterator[Metric]:
    """The gauges of one snapshot."""
    yield GaugeMetricFamily(
        "slotserve_queue_depth", "Requests admitted and waiting for a slot.", value=s.queue_depth
    )
    yield GaugeMetricFamily(
        "slotserve_queue_capacity",
        "Largest queue depth before requests are rejected (--max-queue).",
        value=s.max_queue,
    )
    yield GaugeMetricFamily("slotserve_running_requests", "Requests holding a slot.", value=s.num_running)

    by_state = dict.fromkeys(SlotState, 0)  # busy = prefill + decode
    for slot in s.slots:
        by_state[slot.state] += 1
    slots = GaugeMetricFamily(
        "slotserve_slots",
        "KV slots by state (empty, idle, prefill, decode); busy = prefill + decode.",
        labels=["state"],
    )
    for state, n in by_state.items():
        slots.add_metric([state.value], n)
    yield slots

    held = GaugeMetricFamily("slotserve_slot_tokens", "Tokens of KV held by each slot.", labels=["slot"])
    for slot in s.slots:
        held.add_metric([str(slot.slot)], slot.num_tokens)
    yield held
    yield GaugeMetricFamily(
        "slotserve_slot_capacity_tokens", "Tokens of KV each slot can hold (--ctx-size).", value=s.ctx_len
    )

    stored = GaugeMetricFamily(
        "slotserve_checkpoint_stored_bytes",
        "Bytes of KV checkpoints currently stored, by tier.",
        labels=["tier"],
    )
    stored.add_metric([CheckpointTier.MEMORY.value], s.checkpoint_memory_bytes)
    stored.add_metric([CheckpointTier.DISK.value], s.checkpoint_disk_bytes)
    yield stored
    yield GaugeMetricFamily(
        "slotserve_draining", "1 while the server drains (admits nothing new).", value=int(s.draining)
    )


class LevelCollector(Collector):
    """Collects `level_families` (plus any `extra` families) from `source()` at each scrape.

    `extra`: more family makers fed the same snapshot (router-compat gauges are added there).
    """

    def __init__(self, extra: Iterable[FamilyMaker] = ()):
        self._source: StatsSource | None = None
        self._pinned: SchedulerStats | None = None  # set only inside `pinned()`
        self._makers: tuple[FamilyMaker, ...] = (level_families, *extra)

    def bind(self, source: StatsSource | None) -> None:
        """Read levels from `source` from the next scrape on (None: stop reading)."""
        self._source = source

    @contextmanager
    def pinned(self, snapshot: SchedulerStats) -> Iterator[None]:
        """Collect from `snapshot` instead of the source while inside; the caller serialises."""
        self._pinned = snapshot
        try:
            yield
        finally:
            self._pinned = None

    def describe(self) -> list[Metric]:
        # NOTE: returning [] tells the registry not to call collect() at registration time
        # (it would reach into a scheduler that may not exist yet).
        return []

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "slotserve_stats_up", "1 when this scrape read a scheduler stats snapshot, else 0."
        )
        source = self._source
        snapshot = self._pinned
        if snapshot is None and source is not None:
            try:
                snapshot = source()
            except Exception:  # a scrape must still answer; the cause goes to the log
                log.exception("scheduler stats() failed during a scrape")
        up.add_metric([], 1 if snapshot is not None else 0)
        yield up
        if snapshot is not None:
            for make in self._makers:
                yield from make(snapshot)
