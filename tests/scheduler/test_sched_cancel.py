"""Cancel in the queue, during prefill and during decode: acknowledged, idempotent, and the
slot serves the next request correctly."""

from __future__ import annotations

import asyncio
import random

from sched_support import (
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
    run_one,
    wait_tokens,
)
from slotserve.scheduler.request import FinishEvent, FinishReason, ReuseSource, TokenEvent


async def test_cancel_queued_request_removes_it_at_once():
    pool = make_pool(1, 1024)
    sink = RecordingSink()
    gate = StepGate(pool, pause_at=1)
    async with make_scheduler(pool, stats_sink=sink) as sched:
        first = sched.submit(make_request(prompt_of(1, 50), 4))
        await gate.wait_reached()  # the only slot is busy
        queued = sched.submit(make_request(prompt_of(2, 50), 4))
        assert sched.stats().queue_depth == 1
        assert await queued.cancel() is True  # no step needed: the gate still holds the engine
        assert sched.stats().queue_depth == 0
        assert queued.finish.reason is FinishReason.CANCELLED and queued.finish.reuse is None
        events = [ev async for ev in queued]
        assert len(events) == 1 and isinstance(events[0], FinishEvent)
        gate.release.set()
        out = await collect(first)
    assert out.finish.reason is FinishReason.LENGTH
    assert pool.num_computed_tokens == 50 + 3  # the cancelled request never reached the engine
    assert [c.phase for c in sink.cancels] == ["queued"]


async def test_cancel_during_prefill_is_acknowledged_after_the_segment_in_flight():
    pool = make_pool(2, 2048)
    sink = RecordingSink()
    gate = StepGate(pool, pause_at=3)
    prompt = prompt_of(3, 1000)
    config = make_config(segment_tokens=100, step_token_budget=100)
    async with make_scheduler(pool, config, stats_sink=sink) as sched:
        handle = sched.submit(make_request(prompt, 4))
        await gate.wait_reached()
        cancel = asyncio.create_task(handle.cancel())
        await asyncio.sleep(0.01)
        assert not cancel.done()
        gate.release.set()
        assert await cancel is True
        # acknowledged right after the in-flight segment: no further step ran
        assert pool.num_forward_calls == 3
        assert pool.num_computed_tokens == 300
        assert sched.stats().num_running == 0
        assert await handle.cancel() is True  # idempotent
        # the slot serves the next, unrelated request correctly
        other = prompt_of(4, 120)
        out = await run_one(sched, other, 6)
        await sched.check_integrity()
    assert out.tokens == await cold_tokens(other, 6)
    assert out.finish.reuse.reused_tokens == 0
    assert [c.phase for c in sink.cancels] == ["prefill"]


async def test_cancel_during_decode_releases_the_slot_and_keeps_the_record():
    pool = make_pool(1, 1024)
    prompt = prompt_of(5, 80)
    async with make_scheduler(pool) as sched:
        handle = sched.submit(make_request(prompt, 500))
        got = 0
        async for ev in handle:
            if isinstance(ev, TokenEvent):
                got += 1
            if got == 3:
                break
        assert await handle.cancel() is True
        assert handle.finish.reason is FinishReason.CANCELLED
        assert handle.finish.completion_tokens >= 3
        view = sched.slots()[0]
        assert view.state == "idle" and view.request_id is None
        assert view.num_tokens == 80 + handle.finish.completion_tokens - 1
        out = await run_one(sched, prompt, 5)
        await sched.check_integrity()
    await assert_warm_run(out, prompt, 5, ReuseSource.REWIND, reused_tokens=79)


async def test_cancel_after_finish_returns_false():
    pool = make_pool(1, 512)
    async with make_scheduler(pool) as sched:
        handle = sched.submit(make_request(prompt_of(6, 10), 3))
        out = await collect(handle)
        assert out.finish.reason is FinishReason.LENGTH
        assert await handle.cancel() is False
        assert await handle.cancel() is False


async def test_no_slot_leaked_after_a_thousand_random_cancels():
    pool = make_pool(4, 1024)
    rng = random.Random(1234)
    config = make_config(max_queue=2000, segment_tokens=16, step_token_budget=48)
    system = prompt_of(7, 24)

    async def client(i: int) -> FinishReason:
        prompt = system + prompt_of(1000 + i, rng.randint(1, 60))
        handle = sched.submit(make_request(prompt, rng.randint(1, 12)))
        stop_after = rng.randint(0, 4)
        seen = 0
        try:
            if stop_after == 0:
                for _ in range(rng.randint(0, 3)):
                    await asyncio.sleep(0)
                return FinishReason.CANCELLED if await handle.cancel() else handle.finish.reason
            async for _ev in handle:
                seen += 1
                if seen >= stop_after:
                    break
        finally:
            await handle.cancel()  # the gateway's finally: idempotent
        return handle.finish.reason

    async with make_scheduler(pool, config) as sched:
        reasons = await asyncio.gather(*(client(i) for i in range(1000)))
        stats = sched.stats()
        assert stats.queue_depth == 0 and stats.num_running == 0
        assert all(v.request_id is None for v in sched.slots())
        await sched.check_integrity()
        assert sum(r is FinishReason.CANCELLED for r in reasons) > 300
        prompt = system + prompt_of(5000, 30)
        out = await run_one(sched, prompt, 6)
    assert out.tokens == await cold_tokens(prompt, 6)
    assert out.finish.reuse.reused_tokens >= 24  # the shared system prompt is still live
    assert pool.num_concurrent_calls == 0 and len(pool.caller_threads) == 1


async def test_cancel_during_a_failed_slot_preparation_is_acknowledged_in_that_step():
    import threading

    pool = make_pool(2, 2048)
    sink = RecordingSink()
    shared = prompt_of(30, 100)
    reached, release = threading.Event(), threading.Event()
    real_truncate = pool.truncate

    def failing_truncate(slot, n):  # the rewind prepare: hold the step, then fail
        reached.set()
        assert release.wait(10), "never released"
        raise RuntimeError("prepare failed")

    async with make_scheduler(pool, stats_sink=sink) as sched:
        await run_one(sched, shared, 2)  # one slot holds `shared`; the other stays empty
        busy = sched.submit(make_request(prompt_of(31, 20), 400))  # takes the empty slot
        await wait_tokens(busy, 2)
        pool.truncate = failing_truncate
        victim = sched.submit(make_request(shared[:80] + prompt_of(32, 30), 5))  # rewinds
        assert await asyncio.to_thread(reached.wait, 10)
        cancel = asyncio.create_task(victim.cancel())
        urgent = sched.submit(make_request(prompt_of(33, 20), 400, priority=1))
        await asyncio.sleep(0.01)
        pool.truncate = real_truncate
        release.set()
        assert await asyncio.wait_for(cancel, 10) is True
        # acknowledged at the end of the failed step, not after a slot frees up again
        assert busy.finish is None and urgent.finish is None
        assert victim.finish.reason is FinishReason.CANCELLED
        await busy.cancel()
        await urgent.cancel()
        await sched.check_integrity()
        assert sched.stats().num_running == 0
    assert [c.phase for c in sink.cancels][0] == "prefill"
