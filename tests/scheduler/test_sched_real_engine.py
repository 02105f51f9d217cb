"""The scheduler on the real C engine with the tiny fixture model: warm == cold token for token,
with the reuse source/count and the tokens the engine computed asserted."""

from __future__ import annotations

import pytest
from real_sched_support import (
    checkpoint_restore_and_abort_resend,
    cold_run,
    multi_turn_and_identical_repeat,
    pool_opener,
    real_scheduler,
    shared_system_prompt_is_copied,
)
from real_sched_support import random_ids as ids
from sched_support import collect, make_request
from slotserve.scheduler.request import FinishReason, ReuseSource, TokenEvent
from slotserve.scheduler.scheduler import Scheduler


@pytest.fixture
def open_pool(tiny_model_path):
    return pool_opener(tiny_model_path)


def sched_for(pool, tok, **kw) -> Scheduler:
    kw.setdefault("segment_tokens", 32)  # shorter segments than the fake-engine tests
    return real_scheduler(pool, tok, **kw)


async def cold(open_pool, prompt, max_tokens) -> list[int]:
    return (await cold_run(open_pool, sched_for, prompt, max_tokens)).tokens


async def test_multi_turn_and_identical_repeat_on_the_real_engine(open_pool):
    await multi_turn_and_identical_repeat(open_pool, sched_for, cold)


async def test_shared_system_prompt_is_copied_on_the_real_engine(open_pool):
    await shared_system_prompt_is_copied(open_pool, sched_for, cold)


async def test_checkpoint_restore_and_abort_resend_on_the_real_engine(open_pool):
    await checkpoint_restore_and_abort_resend(open_pool, sched_for, cold)


async def test_engine_fault_on_the_real_engine_fails_the_request_and_the_slot_recovers(open_pool):
    pool, tok = open_pool(1)
    prompt = ids(6, 60)
    async with sched_for(pool, tok) as sched:
        h = sched.submit(make_request(prompt, 30))
        async for ev in h:
            if isinstance(ev, TokenEvent):
                pool._inject_fault(0)
                break
        out = await collect(h)
        assert out.finish.reason is FinishReason.ERROR
        assert sched.slots()[0].num_tokens == 0
        await sched.check_integrity()
        retry = await collect(sched.submit(make_request(prompt, 6)))
    assert retry.finish.reuse.reused_tokens == 0
    assert retry.tokens == await cold(open_pool, prompt, 6)


async def test_a_fault_in_one_slot_fails_only_its_request(open_pool):
    """Two requests decode in the same steps; a compute fault in one slot fails that request
    only: the other one's slot keeps its rows and its tokens equal a cold run."""
    pool, tok = open_pool(2)
    a, b = ids(7, 40), ids(8, 50)
    async with sched_for(pool, tok) as sched:
        ha = sched.submit(make_request(a, 30))
        hb = sched.submit(make_request(b, 12))
        async for ev in ha:
            if isinstance(ev, TokenEvent) and pool.slot_len(1) > 0 and pool.slot_len(0) > 0:
                pool._inject_fault(next(v.slot for v in sched.slots() if v.request_id == ha.request_id))
                break
        out_a, out_b = await collect(ha), await collect(hb)
        await sched.check_integrity()
    assert out_a.finish.reason is FinishReason.ERROR
    assert out_b.finish.reason is FinishReason.LENGTH
    assert out_b.tokens == await cold(open_pool, b, 12)


async def test_returning_conversations_restore_whole_records_from_distinct_checkpoints(open_pool):
    """3 conversations with hinted system prompts on 2 slots, a budget of one record each (not
    a hint and a record each): every return restores its whole previous record, exactly."""
    pool, tok = open_pool(2)
    convs = [ids(40 + c, 100) + ids(50 + c, 20) for c in range(3)]
    budget = 3 * pool.snapshot_nbytes(130)
    assert budget < 3 * (pool.snapshot_nbytes(100) + pool.snapshot_nbytes(125))
    async with sched_for(pool, tok, checkpoint_memory_mb=budget / 2**20) as sched:
        firsts = [await collect(sched.submit(make_request(p, 6, prefix_hint=100))) for p in convs]
        seconds = [c + f.tokens + ids(60 + i, 10) for i, (c, f) in enumerate(zip(convs, firsts))]
        outs = [await collect(sched.submit(make_request(p, 6, prefix_hint=100))) for p in seconds]
        assert sched.stats().checkpoint_memory_bytes <= budget
        await sched.check_integrity()
    for o in outs:
        assert o.finish.reuse.source is ReuseSource.CHECKPOINT_MEMORY
        assert o.finish.reuse.reused_tokens == 125  # prompt + 5 fed reply tokens
    for p, o in zip(seconds, outs):
        assert o.tokens == await cold(open_pool, p, 6)
