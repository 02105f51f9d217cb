"""Continuous batching, segmented prefill, admission, timeouts, preemption, stop conditions,
stats and slot views, on the fake engine."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
from sched_support import (
    EOS,
    ForwardLog,
    ManualClock,
    RecordingSink,
    StepGate,
    assert_warm_run,
    cold_tokens,
    collect,
    make_config,
    make_pool,
    make_request,
    make_scheduler,
    prompt_of,
    reference_greedy,
    run_one,
)
from slotserve.scheduler.request import (
    Draining,
    FinishReason,
    GenerationRequest,
    PromptTooLong,
    QueueFull,
    ReuseSource,
    SamplingParams,
    TokenEvent,
)


async def test_long_prefill_does_not_stall_a_streaming_slot():
    pool = make_pool(2, 8192)
    log = ForwardLog(pool)
    config = make_config(segment_tokens=512, step_token_budget=512)
    async with make_scheduler(pool, config) as sched:
        stream = sched.submit(make_request(prompt_of(1, 20), 60))
        first = await stream.__aiter__().__anext__()
        assert isinstance(first, TokenEvent)
        long = sched.submit(make_request(prompt_of(2, 4000), 2))
        long_out, stream_out = await asyncio.gather(collect(long), collect(stream))
    long_slot = long_out.finish.reuse.slot
    prefill_steps = [b for b in log.calls if any(s == long_slot and n > 1 for s, _, n in b)]
    assert len(prefill_steps) == 8  # ceil(4000 / 512) segments, one per step
    assert [n for b in prefill_steps for s, _, n in b if s == long_slot] == [512] * 7 + [416]
    # every one of those steps also carried the stream's next token
    stream_slot = 1 - long_slot
    assert all(any(s == stream_slot and n == 1 for s, _, n in b) for b in prefill_steps)
    assert stream_out.finish.completion_tokens == 60
    assert len(stream_out.tokens) == 59  # the first token was read above
    assert pool.num_forward_calls == len(log.calls)


async def test_decoding_slots_share_one_forward_per_step():
    pool = make_pool(3, 512)
    log = ForwardLog(pool)
    async with make_scheduler(pool) as sched:
        handles = [sched.submit(make_request(prompt_of(10 + i, 30), 10)) for i in range(3)]
        outs = await asyncio.gather(*(collect(h) for h in handles))
    decode_steps = [b for b in log.calls if all(n == 1 for _, _, n in b)]
    assert max(len(b) for b in decode_steps) == 3
    assert pool.num_forward_calls < 3 * 10  # batched, not one call per request and token
    for i, o in enumerate(outs):
        assert o.tokens == await cold_tokens(prompt_of(10 + i, 30), 10)


async def test_step_budget_splits_prefill_between_requests():
    pool = make_pool(2, 1024)
    log = ForwardLog(pool)
    config = make_config(segment_tokens=64, step_token_budget=100)
    async with make_scheduler(pool, config) as sched:
        a = sched.submit(make_request(prompt_of(20, 200), 1))
        b = sched.submit(make_request(prompt_of(21, 200), 1))
        await asyncio.gather(collect(a), collect(b))
    assert all(sum(n for _, _, n in batch) <= 100 for batch in log.calls)
    assert [sum(n for _, _, n in batch) for batch in log.calls[:2]] == [100, 100]
    assert pool.num_computed_tokens == 400


async def test_admission_errors_are_raised_at_once():
    pool = make_pool(1, 256)
    sink = RecordingSink()
    gate = StepGate(pool, pause_at=1)
    async with make_scheduler(pool, make_config(max_queue=2), stats_sink=sink) as sched:
        with pytest.raises(PromptTooLong, match="shorten it to 255"):
            sched.submit(make_request(prompt_of(1, 256)))
        with pytest.raises(ValueError, match="outside the vocabulary"):
            sched.submit(make_request([5, 64]))
        with pytest.raises(ValueError, match="empty"):
            sched.submit(GenerationRequest(prompt_ids=[]))
        with pytest.raises(ValueError, match="top_p"):
            sched.submit(make_request([5], params=SamplingParams(top_p=0)))
        with pytest.raises(ValueError, match="prefix_hint"):
            sched.submit(make_request([5, 6], prefix_hint=3))
        for bad in ((3,), (0,), (2, 1), (1, 1)):
            with pytest.raises(ValueError, match="turn_offsets"):
                sched.submit(make_request([5, 6], turn_offsets=bad))
        running = sched.submit(make_request(prompt_of(2, 10), 2))
        await gate.wait_reached()
        queued = [sched.submit(make_request(prompt_of(3 + i, 10), 2)) for i in range(2)]
        with pytest.raises(QueueFull) as info:
            sched.submit(make_request(prompt_of(9, 10), 2))
        assert info.value.retry_after_s == 1.0
        gate.release.set()
        for h in [running, *queued]:
            assert (await collect(h)).finish.reason is FinishReason.LENGTH
        await sched.drain(1.0)
        with pytest.raises(Draining):
            sched.submit(make_request(prompt_of(1, 10)))
    assert [r.outcome for r in sink.requests].count("rejected") == 6 + 4  # 4 bad turn_offsets
    assert pool.num_computed_tokens == 3 * (10 + 1)


async def test_timeouts_finish_queued_and_running_requests():
    pool = make_pool(1, 512)
    gate = StepGate(pool, pause_at=2)
    clock = ManualClock()
    async with make_scheduler(pool, make_config(default_timeout_s=0.2), clock=clock) as sched:
        running = sched.submit(make_request(prompt_of(1, 10), 50, timeout_s=0.1))
        queued = sched.submit(make_request(prompt_of(2, 10), 5))
        await gate.wait_reached()
        clock.advance(0.3)  # past both deadlines while the second step computes
        gate.release.set()
        r = await collect(running)
        q = await collect(queued)
        assert r.finish.reason is FinishReason.TIMEOUT
        assert q.finish.reason is FinishReason.TIMEOUT and q.finish.reuse is None
        assert sched.stats().num_running == 0
        ok = await run_one(sched, prompt_of(1, 10), 3)
        await sched.check_integrity()
    assert ok.finish.reason is FinishReason.LENGTH


async def test_higher_priority_request_preempts_a_prefill_which_later_resumes():
    pool = make_pool(1, 4096)
    sink = RecordingSink()
    gate = StepGate(pool, pause_at=3)
    config = make_config(segment_tokens=100, step_token_budget=100, checkpoint_memory_mb=8)
    low_prompt = prompt_of(1, 1000)
    high_prompt = prompt_of(2, 150)
    async with make_scheduler(pool, config, stats_sink=sink) as sched:
        low = sched.submit(make_request(low_prompt, 3, priority=0))
        await gate.wait_reached()
        high = sched.submit(make_request(high_prompt, 3, priority=5))
        gate.release.set()
        high_out = await collect(high)
        low_out = await collect(low)
        stats = sched.stats()
        await sched.check_integrity()
    assert sink.preemptions == 1 and stats.num_preemptions == 1
    assert high_out.finish.timings["ttft_s"] < low_out.finish.timings["ttft_s"]
    # the 3 completed segments of the low request were captured before the slot was reused
    assert pool.num_computed_tokens == 1000 + 150 + 2 * 2
    await assert_warm_run(low_out, low_prompt, 3, ReuseSource.CHECKPOINT_MEMORY, reused_tokens=300)
    assert high_out.tokens == await cold_tokens(high_prompt, 3)


async def test_stop_conditions():
    pool = make_pool(1, 1024)
    prompt = prompt_of(30, 40)
    async with make_scheduler(pool) as sched:
        ref = await run_one(sched, prompt, 12)
        # a stop token id ends the stream without emitting it
        stop_id = ref.tokens[4]
        first = ref.tokens.index(stop_id)
        out = await collect(
            sched.submit(
                make_request(
                    prompt, params=SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop_id,))
                )
            )
        )
        assert out.finish.reason is FinishReason.STOP and out.finish.stop_sequence is None
        assert out.tokens == ref.tokens[:first]
        assert out.finish.completion_tokens == first + 1
        # a stop string spanning tokens is matched and never streamed
        stop = ref.text[5:8]
        out = await collect(
            sched.submit(
                make_request(prompt, params=SamplingParams(temperature=0, max_tokens=12, stop=(stop,)))
            )
        )
        assert out.finish.reason is FinishReason.STOP and out.finish.stop_sequence == stop
        assert out.text == ref.text[: ref.text.index(stop)]
        # eos ends the stream unless ignore_eos
        eos_prompt = next(
            p for p in (prompt_of(s, 8) for s in range(500)) if EOS in reference_greedy(pool, p, 20)
        )
        out = await collect(
            sched.submit(make_request(eos_prompt, params=SamplingParams(temperature=0, max_tokens=20)))
        )
        assert out.finish.reason is FinishReason.STOP and EOS not in out.tokens
        assert out.finish.stop_sequence is None
    # the context limit ends generation with "length"
    small = make_pool(1, 16)
    async with make_scheduler(small) as sched:
        out = await run_one(sched, prompt_of(31, 10), 100)
    assert out.finish.reason is FinishReason.LENGTH
    assert out.finish.completion_tokens == 7  # positions 10..15 fed, the 7th sampled last


async def test_seeded_sampling_is_reproducible_whatever_shares_the_batch():
    pool = make_pool(3, 1024)
    prompt = prompt_of(40, 30)
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=7, max_tokens=15, ignore_eos=True)
    async with make_scheduler(pool) as sched:
        alone = await collect(sched.submit(make_request(prompt, params=params)))
        noise = [sched.submit(make_request(prompt_of(41 + i, 50), 20)) for i in range(2)]
        shared = await collect(sched.submit(make_request(prompt, params=params)))
        await asyncio.gather(*(collect(h) for h in noise))
        other_seed = await collect(
            sched.submit(
                make_request(
                    prompt, params=SamplingParams(temperature=0.9, seed=8, max_tokens=15, ignore_eos=True)
                )
            )
        )
    assert alone.tokens == shared.tokens
    assert shared.finish.reuse.reused_tokens == 29
    assert other_seed.tokens != alone.tokens


async def test_stats_slot_views_and_reuse_log(caplog, monkeypatch):
    monkeypatch.setenv("SLOTSERVE_REUSE_LOG", "1")
    pool = make_pool(2, 1024)
    sink = RecordingSink()
    prompt = prompt_of(50, 100)
    with caplog.at_level(logging.INFO, logger="slotserve.reuse"):
        async with make_scheduler(pool, stats_sink=sink) as sched:
            await run_one(sched, prompt, 4)
            await run_one(sched, prompt, 4)
            views = sched.slots()
            stats = sched.stats()
    lines = [r.getMessage() for r in caplog.records if r.name == "slotserve.reuse"]
    assert lines[0].startswith("reuse slot=0 live=0 prompt=100 common=0 action=cold")
    assert lines[1].startswith("reuse slot=0 live=103 prompt=100 common=100 action=rewind")
    assert "reused=99 prefilled=1" in lines[1]
    assert [v.state for v in views] == ["idle", "empty"]
    assert views[0].num_tokens == 103 and views[0].num_reuse_hits == 1
    assert views[0].num_reused_tokens == 99 and views[0].request_id is None
    assert stats.queue_depth == 0 and stats.num_running == 0 and stats.ctx_len == 1024
    assert [lvl.state for lvl in stats.slots] == ["idle", "empty"]
    reqs = [r for r in sink.requests if r.outcome == "ok"]
    assert [(r.reused_tokens, r.prefilled_tokens) for r in reqs] == [(0, 100), (99, 1)]
    assert reqs[1].reuse_source is ReuseSource.REWIND and len(reqs[1].itl_s) == 3
    assert sum(s.num_tokens for s in sink.steps) == pool.num_computed_tokens


async def test_engine_runs_on_one_worker_thread_never_the_loop():
    pool = make_pool(2, 512)
    async with make_scheduler(pool) as sched:
        await asyncio.gather(*(run_one(sched, prompt_of(60 + i, 40), 5) for i in range(4)))
    assert len(pool.caller_threads) == 1
    assert threading.get_ident() not in pool.caller_threads
    assert pool.num_concurrent_calls == 0


async def test_drain_lets_requests_finish_within_grace_then_cancels_the_rest():
    pool = make_pool(2, 2048)
    pool.forward_hook = lambda batch: time.sleep(0.002)  # ~2 ms per step: 1000 tokens > grace
    async with make_scheduler(pool) as sched:
        short = sched.submit(make_request(prompt_of(70, 10), 3))
        endless = sched.submit(make_request(prompt_of(71, 10), 1000))
        await sched.drain(0.3)
        assert sched.stats().draining and sched.stats().num_running == 0
        s, e = await collect(short), await collect(endless)
    assert s.finish.reason is FinishReason.LENGTH
    assert e.finish.reason is FinishReason.CANCELLED
    assert 0 < e.finish.completion_tokens < 1000


async def test_prompt_ids_that_are_not_flat_integers_are_a_value_error():
    pool = make_pool(1, 256)
    async with make_scheduler(pool) as sched:
        for bad in ([5, 6.5], [5, 2**64], [[5, 6]], [[5], [6, 7]], [5, None], [5, "6"]):
            with pytest.raises(ValueError, match="prompt_ids"):
                sched.submit(GenerationRequest(prompt_ids=bad))
        assert sched.stats().queue_depth == 0
    assert pool.num_forward_calls == 0
