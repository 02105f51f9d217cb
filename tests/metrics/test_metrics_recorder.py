"""ServerMetrics fed scheduler events: exact counter and histogram values, contract breaches."""

from __future__ import annotations

import threading

import pytest
from slotserve.metrics import ServerMetrics
from slotserve.scheduler.request import FinishReason, ReuseSource
from slotserve.scheduler.stats import (
    CancelStats,
    CaptureRule,
    CheckpointEvent,
    CheckpointEventKind,
    CheckpointTier,
    Outcome,
    Phase,
    RequestStats,
    RestoreReason,
    RouteStats,
    StepStats,
)


def make_request(
    outcome: Outcome = Outcome.OK,
    prompt: int = 100,
    reused: int = 0,
    source: ReuseSource = ReuseSource.NONE,
    prefilled: int | None = None,
    completion: int = 4,
    queue_s: float | None = 0.002,
    ttft_s: float | None = 0.3,
    e2e_s: float | None = 0.5,
    itl_s: tuple[float, ...] = (0.03, 0.04, 0.05),
) -> RequestStats:
    return RequestStats(
        outcome=outcome,
        finish_reason=FinishReason.STOP if outcome is Outcome.OK else None,
        prompt_tokens=prompt,
        reused_tokens=reused,
        reuse_source=source,
        prefilled_tokens=prompt - reused if prefilled is None else prefilled,
        completion_tokens=completion,
        queue_s=queue_s,
        ttft_s=ttft_s,
        e2e_s=e2e_s,
        itl_s=itl_s,
    )


def value(m: ServerMetrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, labels)
    assert v is not None, f"no sample {name}{labels}"
    return v


def test_multi_turn_reuse_counts():
    m = ServerMetrics(strict=True)
    m.sink.on_request(make_request(prompt=100))  # turn 1: cold
    m.sink.on_request(make_request(prompt=150, reused=104, source=ReuseSource.REWIND))
    m.sink.on_request(make_request(prompt=200, reused=96, source=ReuseSource.CHECKPOINT_MEMORY))
    m.sink.on_request(make_request(prompt=220, reused=150, source=ReuseSource.COPY))

    assert value(m, "slotserve_requests_total", outcome="ok", stage="scheduler") == 4
    assert value(m, "slotserve_reuse_requests_total", source="none") == 1
    assert value(m, "slotserve_reuse_requests_total", source="rewind") == 1
    assert value(m, "slotserve_reuse_requests_total", source="checkpoint_memory") == 1
    assert value(m, "slotserve_reuse_requests_total", source="copy") == 1
    assert value(m, "slotserve_reuse_requests_total", source="checkpoint_disk") == 0
    assert value(m, "slotserve_prompt_tokens_total") == 670
    assert value(m, "slotserve_reused_tokens_total", source="rewind") == 104
    assert value(m, "slotserve_reused_tokens_total", source="checkpoint_memory") == 96
    assert value(m, "slotserve_reused_tokens_total", source="copy") == 150
    assert value(m, "slotserve_prefilled_tokens_total") == 670 - 104 - 96 - 150
    assert value(m, "slotserve_generated_tokens_total") == 16


def test_latency_histograms_bucket_each_observation():
    m = ServerMetrics(strict=True)
    m.sink.on_request(make_request(ttft_s=0.3, e2e_s=0.5, queue_s=0.002, itl_s=(0.03, 0.04, 0.2)))
    m.sink.on_request(make_request(ttft_s=7.0, e2e_s=None, queue_s=None, itl_s=()))

    assert value(m, "slotserve_time_to_first_token_seconds_count") == 2
    assert value(m, "slotserve_time_to_first_token_seconds_bucket", le="0.5") == 1
    assert value(m, "slotserve_time_to_first_token_seconds_bucket", le="10.0") == 2
    assert value(m, "slotserve_time_to_first_token_seconds_sum") == pytest.approx(7.3)
    assert value(m, "slotserve_e2e_request_latency_seconds_count") == 1  # None is not observed
    assert value(m, "slotserve_queue_wait_seconds_count") == 1
    assert value(m, "slotserve_inter_token_latency_seconds_count") == 3
    assert value(m, "slotserve_inter_token_latency_seconds_bucket", le="0.035") == 1
    assert value(m, "slotserve_inter_token_latency_seconds_bucket", le="0.05") == 2


def test_requests_without_a_slot_do_not_dilute_reuse():
    m = ServerMetrics(strict=True)
    m.sink.on_request(make_request(prompt=80, reused=60, source=ReuseSource.REWIND))
    # cancelled while queued and rejected: no prompt token computed or reused
    m.sink.on_request(
        make_request(Outcome.CANCELLED, prompt=500, prefilled=0, completion=0, ttft_s=None, itl_s=())
    )
    m.sink.on_request(
        make_request(Outcome.REJECTED, prompt=900, prefilled=0, completion=0, queue_s=None, ttft_s=None)
    )

    assert value(m, "slotserve_requests_total", outcome="cancelled", stage="scheduler") == 1
    assert value(m, "slotserve_requests_total", outcome="rejected", stage="scheduler") == 1
    assert value(m, "slotserve_reuse_requests_total", source="none") == 0
    assert value(m, "slotserve_reuse_requests_total", source="rewind") == 1
    assert value(m, "slotserve_prompt_tokens_total") == 80


def test_zero_reused_tokens_counts_as_cold_whatever_the_source():
    m = ServerMetrics(strict=True)
    m.sink.on_request(make_request(prompt=50, reused=0, source=ReuseSource.REWIND))
    assert value(m, "slotserve_reuse_requests_total", source="none") == 1
    assert value(m, "slotserve_reuse_requests_total", source="rewind") == 0


def test_steps_cancels_preemptions_checkpoints():
    m = ServerMetrics(strict=True)
    m.sink.on_step(
        StepStats(duration_s=0.02, num_tokens=66, num_prefill_tokens=64, num_decode_tokens=2, batch_size=3)
    )
    m.sink.on_step(
        StepStats(duration_s=0.004, num_tokens=3, num_prefill_tokens=0, num_decode_tokens=3, batch_size=3)
    )
    m.sink.on_step(StepStats(0.004, 3, 0, 3, 3, chained=True, num_discarded_tokens=1))
    m.sink.on_step(StepStats(0.004, 2, 0, 2, 2, chained=True))
    m.sink.on_step(StepStats(0.005, 9, 0, 9, 2, num_drafted_tokens=7, num_accepted_tokens=4))
    m.sink.on_cancel(CancelStats(phase=Phase.DECODE, ack_s=0.003))
    m.sink.on_cancel(CancelStats(phase=Phase.QUEUED, ack_s=0.0001))
    m.sink.on_preemption()
    capture, memory, disk = CheckpointEventKind.CAPTURE, CheckpointTier.MEMORY, CheckpointTier.DISK
    m.sink.on_checkpoint(CheckpointEvent(capture, memory, CaptureRule.HINT, num_bytes=4096, num_tokens=10))
    m.sink.on_checkpoint(CheckpointEvent(capture, memory, CaptureRule.HINT, num_bytes=1024, num_tokens=3))
    evict = CheckpointEventKind.EVICT
    m.sink.on_checkpoint(CheckpointEvent(evict, disk, CaptureRule.PROMPT_END, num_bytes=777, num_tokens=2))

    assert value(m, "slotserve_engine_step_seconds_count") == 5
    assert value(m, "slotserve_engine_step_tokens_bucket", le="4.0") == 3
    assert value(m, "slotserve_engine_step_batch_size_bucket", le="3.0") == 5
    assert value(m, "slotserve_engine_tokens_total", phase="prefill") == 64
    assert value(m, "slotserve_engine_tokens_total", phase="decode") == 19
    assert value(m, "slotserve_spec_drafted_tokens_total") == 7
    assert value(m, "slotserve_spec_accepted_tokens_total") == 4
    assert value(m, "slotserve_engine_chained_steps_total") == 2
    assert value(m, "slotserve_engine_discarded_tokens_total") == 1
    assert value(m, "slotserve_cancels_total", phase="decode") == 1
    assert value(m, "slotserve_cancels_total", phase="queued") == 1
    assert value(m, "slotserve_cancels_total", phase="prefill") == 0
    assert value(m, "slotserve_cancel_ack_seconds_bucket", phase="decode", le="0.005") == 1
    assert value(m, "slotserve_cancel_ack_seconds_bucket", phase="decode", le="0.0025") == 0
    assert value(m, "slotserve_preemptions_total") == 1
    assert value(m, "slotserve_checkpoints_total", event="capture", tier="memory", rule="hint") == 2
    assert value(m, "slotserve_checkpoint_bytes_total", event="capture", tier="memory", rule="hint") == 5120
    assert value(m, "slotserve_checkpoints_total", event="evict", tier="disk", rule="prompt_end") == 1
    assert value(m, "slotserve_checkpoint_bytes_total", event="evict", tier="disk", rule="prompt_end") == 777
    assert value(m, "slotserve_checkpoints_total", event="restore", tier="disk", rule="hint") == 0
    m.sink.on_checkpoint(CheckpointEvent(CheckpointEventKind.DROP, disk, None, num_bytes=99, num_tokens=0))
    assert value(m, "slotserve_checkpoints_total", event="drop", tier="disk", rule="unknown") == 1
    assert value(m, "slotserve_checkpoint_bytes_total", event="drop", tier="disk", rule="unknown") == 99


def test_route_events_count_window_refusals_recomputed_tokens_and_restores_by_reason():
    m = ServerMetrics(strict=True)
    window, evicted = RestoreReason.WINDOW, RestoreReason.EVICTED
    m.sink.on_route(RouteStats(ReuseSource.REWIND, 300, False, 0, None))
    m.sink.on_route(RouteStats(ReuseSource.CHECKPOINT_MEMORY, 64, True, 36, window))
    m.sink.on_route(RouteStats(ReuseSource.NONE, 0, True, 90, None))
    m.sink.on_route(RouteStats(ReuseSource.CHECKPOINT_DISK, 200, False, 0, evicted))
    assert value(m, "slotserve_window_refused_rewinds_total") == 2
    assert value(m, "slotserve_window_recomputed_tokens_total") == 126
    assert value(m, "slotserve_checkpoint_restores_total", tier="memory", reason="window") == 1
    assert value(m, "slotserve_checkpoint_restores_total", tier="disk", reason="evicted") == 1
    assert value(m, "slotserve_checkpoint_restores_total", tier="disk", reason="window") == 0


# The events below break the contract's types on purpose (a sink must survive a buggy caller).
@pytest.mark.parametrize(
    "feed",
    [
        lambda s: s.on_route(RouteStats(ReuseSource.REWIND, 5, False, 0, RestoreReason.WINDOW)),
        lambda s: s.on_route(RouteStats(ReuseSource.CHECKPOINT_DISK, 5, False, 0, None)),
        lambda s: s.on_route(RouteStats(ReuseSource.NONE, 0, True, -1, None)),
        lambda s: s.on_request(make_request("finished")),  # type: ignore[arg-type]
        lambda s: s.on_request(make_request(prompt=10, reused=5, source=ReuseSource.NONE)),
        lambda s: s.on_request(make_request(prompt=10, prefilled=-1)),
        lambda s: s.on_request(make_request(source="mystery")),  # type: ignore[arg-type]
        lambda s: s.on_checkpoint(CheckpointEvent("capture", "gpu", "hint", 1, 1)),
        lambda s: s.on_checkpoint(CheckpointEvent("capture", "memory", "whim", 1, 1)),
        lambda s: s.on_cancel(CancelStats(phase="later", ack_s=0.1)),
        lambda s: s.on_step(StepStats(0.1, -1, 0, 0, 1)),
    ],
)
def test_contract_breach_raises_when_strict_and_is_counted_otherwise(feed, caplog):
    with pytest.raises(ValueError, match="contract"):
        feed(ServerMetrics(strict=True).sink)

    lenient = ServerMetrics()
    feed(lenient.sink)
    feed(lenient.sink)
    body = lenient.render()[0].decode()
    dropped = [line for line in body.splitlines() if line.startswith("slotserve_stats_dropped_total{")]
    assert sum(float(line.split()[-1]) for line in dropped) == 2
    assert value(lenient, "slotserve_requests_total", outcome="ok", stage="scheduler") == 0
    assert len([r for r in caplog.records if "dropping" in r.getMessage()]) == 1  # logged once


def test_sink_is_thread_safe():
    m = ServerMetrics(strict=True)
    per_thread = 2000

    def work() -> None:
        for _ in range(per_thread):
            m.sink.on_request(make_request(prompt=10, reused=4, source=ReuseSource.REWIND, itl_s=(0.01,)))
            m.sink.on_step(StepStats(0.001, 2, 1, 1, 2))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert value(m, "slotserve_requests_total", outcome="ok", stage="scheduler") == 4 * per_thread
    assert value(m, "slotserve_reused_tokens_total", source="rewind") == 4 * 4 * per_thread
    assert value(m, "slotserve_inter_token_latency_seconds_count") == 4 * per_thread
    assert value(m, "slotserve_engine_tokens_total", phase="decode") == 4 * per_thread


def test_ttft_by_class_splits_mostly_reused_prompts_from_cold_ones():
    m = ServerMetrics(strict=True)
    m.sink.on_request(make_request(prompt=100, ttft_s=2.0))  # cold
    m.sink.on_request(
        make_request(prompt=100, reused=50, source=ReuseSource.REWIND, ttft_s=1.5)
    )  # half: cold
    m.sink.on_request(make_request(prompt=100, reused=90, source=ReuseSource.REWIND, ttft_s=0.2))  # warm
    m.sink.on_request(make_request(prompt=100, ttft_s=None))  # no first token: not observed
    name = "slotserve_time_to_first_token_by_class_seconds"
    assert value(m, name + "_count", **{"class": "cold"}) == 2
    assert value(m, name + "_sum", **{"class": "cold"}) == 3.5
    assert value(m, name + "_count", **{"class": "warm"}) == 1
    assert value(m, name + "_sum", **{"class": "warm"}) == pytest.approx(0.2)
    assert value(m, "slotserve_time_to_first_token_seconds_count") == 3
