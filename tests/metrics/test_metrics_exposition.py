"""The /metrics exposition: levels read at scrape time, naming practice, parseable text."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families
from slotserve.metrics import ServerMetrics
from slotserve.scheduler.stats import SchedulerStats, SlotLevel, SlotState


def make_stats(**over) -> SchedulerStats:
    base = dict(
        queue_depth=3,
        max_queue=64,
        num_running=2,
        slots=(
            SlotLevel(0, SlotState.DECODE, 812),
            SlotLevel(1, SlotState.PREFILL, 40),
            SlotLevel(2, SlotState.IDLE, 300),
            SlotLevel(3, SlotState.EMPTY, 0),
        ),
        ctx_len=4096,
        checkpoint_memory_bytes=123_456,
        checkpoint_disk_bytes=7_000_000,
        num_preemptions=0,
        draining=False,
    )
    base.update(over)
    return SchedulerStats(**base)


def scrape(m: ServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, content_type = m.render()
    assert content_type.startswith("text/plain; version=")
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_levels_follow_the_snapshot_at_each_scrape():
    m = ServerMetrics()
    current = [make_stats()]
    m.bind(lambda: current[0])

    first = scrape(m)
    assert first[("slotserve_stats_up", ())] == 1
    assert first[("slotserve_queue_depth", ())] == 3
    assert first[("slotserve_queue_capacity", ())] == 64
    assert first[("slotserve_running_requests", ())] == 2
    assert first[("slotserve_slots", (("state", "decode"),))] == 1
    assert first[("slotserve_slots", (("state", "prefill"),))] == 1
    assert first[("slotserve_slots", (("state", "idle"),))] == 1
    assert first[("slotserve_slots", (("state", "empty"),))] == 1
    assert first[("slotserve_slot_tokens", (("slot", "0"),))] == 812
    assert first[("slotserve_slot_tokens", (("slot", "2"),))] == 300
    assert first[("slotserve_slot_capacity_tokens", ())] == 4096
    assert first[("slotserve_checkpoint_stored_bytes", (("tier", "memory"),))] == 123_456
    assert first[("slotserve_checkpoint_stored_bytes", (("tier", "disk"),))] == 7_000_000
    assert first[("slotserve_draining", ())] == 0

    current[0] = make_stats(
        queue_depth=0,
        num_running=0,
        draining=True,
        slots=(SlotLevel(0, SlotState.IDLE, 812), SlotLevel(1, SlotState.IDLE, 44)),
    )
    second = scrape(m)
    assert second[("slotserve_queue_depth", ())] == 0
    assert second[("slotserve_slots", (("state", "idle"),))] == 2
    assert second[("slotserve_slots", (("state", "decode"),))] == 0  # every state always present
    assert ("slotserve_slot_tokens", (("slot", "3"),)) not in second
    assert second[("slotserve_draining", ())] == 1


def test_unbound_or_failing_source_drops_levels_but_scrape_answers():
    m = ServerMetrics()
    samples = scrape(m)
    assert samples[("slotserve_stats_up", ())] == 0
    assert not any(name == "slotserve_queue_depth" for name, _ in samples)
    assert (
        samples[("slotserve_requests_total", (("outcome", "ok"), ("stage", "scheduler")))] == 0
    )  # pushed metrics still there

    def broken() -> SchedulerStats:
        raise RuntimeError("scheduler gone")

    m.bind(broken)
    samples = scrape(m)
    assert samples[("slotserve_stats_up", ())] == 0
    m.bind(make_stats)
    assert scrape(m)[("slotserve_stats_up", ())] == 1


def test_two_servers_in_one_process_do_not_collide():
    a, b = ServerMetrics(), ServerMetrics()
    a.sink.on_preemption()
    assert a.registry.get_sample_value("slotserve_preemptions_total") == 1
    assert b.registry.get_sample_value("slotserve_preemptions_total") == 0


def test_names_follow_prometheus_practice():
    m = ServerMetrics()
    m.bind(make_stats)
    families = list(text_string_to_metric_families(m.render()[0].decode()))
    assert len(families) >= 30
    for fam in families:
        name = fam.name
        assert name.startswith("slotserve_"), name
        assert re.fullmatch(r"[a-z][a-z0-9_]*", name), f"{name}: lower snake case, no colons"
        if fam.type == "counter":
            # the parser strips `_total` from counter family names; the samples must carry it
            assert all(s.name == name + "_total" for s in fam.samples), name
        else:
            assert not name.endswith("_total"), f"{name}: `_total` is for counters only"
        assert "_perc" not in name and "percent" not in name, f"{name}: expose ratios 0..1, unsuffixed"
        if fam.type == "histogram":
            assert name.endswith(("_seconds", "_tokens", "_size")), f"{name}: histogram without a unit"
        assert fam.documentation, f"{name}: no HELP"


def test_render_with_a_snapshot_pins_levels_for_that_scrape_only():
    m = ServerMetrics()
    m.bind(lambda: make_stats(queue_depth=1))
    body, _ = m.render(make_stats(queue_depth=9))
    assert "slotserve_queue_depth 9.0" in body.decode()
    assert "slotserve_queue_depth 1.0" in m.render()[0].decode()  # back to the bound source

    unbound = ServerMetrics()
    assert "slotserve_queue_depth 5.0" in unbound.render(make_stats(queue_depth=5))[0].decode()
    assert "slotserve_queue_depth" not in unbound.render()[0].decode()


def test_extra_level_families_read_the_same_snapshot():
    from prometheus_client.core import GaugeMetricFamily

    def busy_fraction(s: SchedulerStats):
        yield GaugeMetricFamily("slotserve_test_busy_slots", "test", value=s.num_running / len(s.slots))

    m = ServerMetrics(extra_levels=[busy_fraction])
    samples = scrape_after_bind(m, make_stats(num_running=3))
    assert samples[("slotserve_test_busy_slots", ())] == 0.75


def scrape_after_bind(m: ServerMetrics, stats: SchedulerStats):
    m.bind(lambda: stats)
    return scrape(m)
