"""The vllm:-named gauges routers read: names, values, and that they track the scheduler's stats."""

from __future__ import annotations

import asyncio
import threading

import pytest
from gateway_support import MODEL, chat_body, make_runtime, running_app, serve_config
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from slotserve.gateway.app import create_app
from slotserve.gateway.server import server_metrics
from slotserve.metrics.router_compat import (
    KV_CACHE_USAGE,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    ROUTER_METRIC_NAMES,
    RouterCompatCollector,
    kv_cache_usage,
    router_compat_maker,
)
from slotserve.scheduler.stats import SchedulerStats, SlotLevel, SlotState


def make_stats(
    queue_depth: int = 0, num_running: int = 0, tokens: tuple[int, ...] = (0, 0), ctx_len: int = 100
):
    states = tuple(
        SlotState.DECODE if i < num_running else (SlotState.IDLE if n else SlotState.EMPTY)
        for i, n in enumerate(tokens)
    )
    return SchedulerStats(
        queue_depth=queue_depth,
        max_queue=64,
        num_running=num_running,
        slots=tuple(SlotLevel(i, states[i], n) for i, n in enumerate(tokens)),
        ctx_len=ctx_len,
        checkpoint_memory_bytes=0,
        checkpoint_disk_bytes=0,
        num_preemptions=0,
        draining=False,
    )


def scrape(registry: CollectorRegistry) -> tuple[str, dict[str, tuple[dict[str, str], float]]]:
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = (sample.labels, sample.value)
    return text, out


def test_gauges_carry_vllm_names_and_values():
    stats = {"s": make_stats(queue_depth=3, num_running=2, tokens=(50, 25, 0, 5), ctx_len=100)}
    registry = CollectorRegistry()
    registry.register(RouterCompatCollector(lambda: stats["s"], "smol"))
    text, samples = scrape(registry)
    assert f'\n{NUM_REQUESTS_WAITING}{{model_name="smol"}} 3.0' in "\n" + text
    assert samples[NUM_REQUESTS_WAITING] == ({"model_name": "smol"}, 3.0)
    assert samples[NUM_REQUESTS_RUNNING] == ({"model_name": "smol"}, 2.0)
    assert samples[KV_CACHE_USAGE][1] == pytest.approx(80 / 400)
    # read at scrape time: a later snapshot shows at the next scrape
    stats["s"] = make_stats(queue_depth=0, num_running=1, tokens=(100, 100, 100, 100), ctx_len=100)
    _, samples = scrape(registry)
    assert samples[NUM_REQUESTS_WAITING][1] == 0.0
    assert samples[NUM_REQUESTS_RUNNING][1] == 1.0
    assert samples[KV_CACHE_USAGE][1] == 1.0


def test_usage_is_a_fraction():
    assert kv_cache_usage(make_stats(tokens=(), ctx_len=100)) == 0.0
    assert kv_cache_usage(make_stats(tokens=(0, 0), ctx_len=100)) == 0.0
    assert kv_cache_usage(make_stats(tokens=(100, 50), ctx_len=100)) == pytest.approx(0.75)


def test_absent_when_unbound_or_failing():
    registry = CollectorRegistry()
    collector = RouterCompatCollector(None, "m")
    registry.register(collector)
    assert not any(name in scrape(registry)[1] for name in ROUTER_METRIC_NAMES)

    def broken():
        raise RuntimeError("scheduler gone")

    collector.bind(broken)
    assert not any(name in scrape(registry)[1] for name in ROUTER_METRIC_NAMES)
    collector.bind(lambda: make_stats(queue_depth=7))
    assert scrape(registry)[1][NUM_REQUESTS_WAITING][1] == 7.0


def test_plugs_into_the_level_collector():
    from slotserve.metrics.levels import LevelCollector

    registry = CollectorRegistry()
    levels = LevelCollector(extra=[router_compat_maker("smol")])
    registry.register(levels)
    levels.bind(lambda: make_stats(queue_depth=4, num_running=1, tokens=(10, 0), ctx_len=20))
    _, samples = scrape(registry)
    # the same snapshot feeds both: the compat gauges equal slotserve's own
    assert samples[NUM_REQUESTS_WAITING][1] == samples["slotserve_queue_depth"][1] == 4.0
    assert samples[NUM_REQUESTS_RUNNING][1] == samples["slotserve_running_requests"][1] == 1.0
    assert samples[KV_CACHE_USAGE][1] == pytest.approx(0.25)


async def test_server_metrics_read_one_snapshot_per_scrape():
    """GET /metrics of the served app: the vllm: gauges appear, agree with slotserve's own, and
    the scrape calls the scheduler's stats() once (not once more for the router gauges)."""
    metrics = server_metrics(MODEL)
    runtime, pool = make_runtime(num_slots=1, max_queue=4, metrics=metrics)
    entered, release = threading.Event(), threading.Event()

    def hold(batch):
        entered.set()
        release.wait(timeout=30)

    pool.forward_hook = hold
    sched = runtime.scheduler
    calls = []
    real_stats = sched.stats
    sched.stats = lambda: calls.append(1) or real_stats()
    body = chat_body([{"role": "user", "content": "hi"}], max_tokens=2)
    async with running_app(create_app(runtime, serve_config(), metrics=metrics)) as client:
        first = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        second = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        while not (entered.is_set() and real_stats().queue_depth == 1):  # one holds the slot, one waits
            await asyncio.sleep(0.01)
        calls.clear()
        r = await client.get("/metrics")
        num_calls = len(calls)
        release.set()
        assert (await first).status_code == 200 and (await second).status_code == 200
    assert num_calls == 1
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            samples[sample.name] = (sample.labels, sample.value)
    assert samples[NUM_REQUESTS_WAITING] == ({"model_name": MODEL}, samples["slotserve_queue_depth"][1])
    assert samples[NUM_REQUESTS_WAITING][1] == 1.0
    assert samples[NUM_REQUESTS_RUNNING] == ({"model_name": MODEL}, samples["slotserve_running_requests"][1])
    assert samples[NUM_REQUESTS_RUNNING][1] == 1.0
    held = samples["slotserve_slot_tokens"][1]  # the one slot's tokens
    assert held > 0
    assert samples[KV_CACHE_USAGE][1] == pytest.approx(held / samples["slotserve_slot_capacity_tokens"][1])
