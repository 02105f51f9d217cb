"""Warm == cold, token for token, with the reuse (count and source) and the tokens the engine
computed asserted in the same test."""

from __future__ import annotations

import asyncio

from sched_support import (
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
from slotserve.scheduler.request import FinishReason, ReuseSource


async def test_cold_run_matches_reference_model():
    pool = make_pool(2, 512)
    prompt = prompt_of(1, 100)
    async with make_scheduler(pool) as sched:
        out = await run_one(sched, prompt, 8)
        await sched.check_integrity()
    assert out.tokens == reference_greedy(pool, prompt, 8)
    assert out.finish.reuse.source is ReuseSource.NONE
    assert out.finish.reuse.prefilled_tokens == 100
    assert pool.num_computed_tokens == 100 + 7  # the last sampled token is never fed


async def test_multi_turn_extension_rewinds_and_prefills_only_the_tail():
    pool = make_pool(2, 1024)
    turn1 = prompt_of(1, 200)
    async with make_scheduler(pool) as sched:
        a = await run_one(sched, turn1, 10)
        turn2 = turn1 + a.tokens + prompt_of(2, 30)
        before = pool.num_computed_tokens
        b = await run_one(sched, turn2, 10)
        await sched.check_integrity()
    # the slot held turn1 + 9 fed reply tokens; the 10th reply token is not in the record
    assert b.finish.reuse.prefilled_tokens == len(turn2) - 209
    assert pool.num_computed_tokens - before == (len(turn2) - 209) + 9
    await assert_warm_run(b, turn2, 10, ReuseSource.REWIND, reused_tokens=200 + 9)


async def test_identical_repeat_costs_one_token():
    pool = make_pool(2, 1024)
    prompt = prompt_of(3, 300)
    async with make_scheduler(pool) as sched:
        a = await run_one(sched, prompt, 6)
        before = pool.num_computed_tokens
        b = await run_one(sched, prompt, 6)
    assert b.finish.reuse.source is ReuseSource.REWIND
    assert (b.finish.reuse.reused_tokens, b.finish.reuse.prefilled_tokens) == (299, 1)
    assert pool.num_computed_tokens - before == 1 + 5
    assert a.tokens == b.tokens == await cold_tokens(prompt, 6)


async def test_divergent_prompt_reuses_the_common_part():
    pool = make_pool(1, 1024)
    base = prompt_of(4, 150)
    first = base + prompt_of(5, 40)
    second = base + prompt_of(6, 50)
    async with make_scheduler(pool) as sched:
        await run_one(sched, first, 4)
        before = pool.num_computed_tokens
        b = await run_one(sched, second, 4)
    assert pool.num_computed_tokens - before == 50 + 3
    await assert_warm_run(b, second, 4, ReuseSource.REWIND, reused_tokens=150)


async def test_abort_and_resend_rewinds_to_prompt_len_minus_one():
    pool = make_pool(2, 1024)
    prompt = prompt_of(7, 400)
    async with make_scheduler(pool) as sched:
        handle = sched.submit(make_request(prompt, 100))
        seen = 0
        async for ev in handle:
            seen += len(getattr(ev, "token_ids", ()))
            if seen >= 5:
                break
        assert await handle.cancel() is True
        assert handle.finish.reason is FinishReason.CANCELLED
        held = [v.num_tokens for v in sched.slots() if v.num_tokens]
        assert held and held[0] > 400  # prompt + part of the reply
        before = pool.num_computed_tokens
        b = await run_one(sched, prompt, 12)
        await sched.check_integrity()
    assert b.finish.reuse.source is ReuseSource.REWIND
    assert (b.finish.reuse.reused_tokens, b.finish.reuse.prefilled_tokens) == (399, 1)
    assert pool.num_computed_tokens - before == 1 + 11
    assert b.tokens == await cold_tokens(prompt, 12)


async def test_system_prompt_shared_by_concurrent_users_is_prefilled_once():
    pool = make_pool(4, 1024)
    system = prompt_of(8, 300)
    prompts = [system + prompt_of(100 + i, 20) for i in range(4)]
    async with make_scheduler(pool, make_config(segment_tokens=64, step_token_budget=64)) as sched:
        handles = [sched.submit(make_request(p, 5)) for p in prompts]
        outs = await asyncio.gather(*(collect(h) for h in handles))
        await sched.check_integrity()
    sources = [o.finish.reuse.source for o in outs]
    assert sources[0] is ReuseSource.NONE
    assert sources[1:] == [ReuseSource.COPY] * 3
    assert [o.finish.reuse.reused_tokens for o in outs] == [0, 300, 300, 300]
    # the 300 system tokens were computed once: 320 + 3 * 20 prompt tokens, 4 decodes each
    assert pool.num_computed_tokens == 320 + 3 * 20 + 4 * 4
    assert pool.num_copied_tokens == 3 * 300
    for p, o in zip(prompts, outs):
        assert o.tokens == await cold_tokens(p, 5)


async def test_a_waiter_whose_shared_prefill_is_cancelled_reuses_what_was_computed():
    """B waits for A's prefill of their common 300 tokens (WAIT_SHARED: never the same rows
    twice). A is cancelled after 3 segments of 64: B takes over A's slot, reuses the 192 rows
    computed so far and prefills the rest itself; nothing is computed twice, no deadlock."""
    pool = make_pool(2, 1024)
    system = prompt_of(30, 300)
    a, b = system + prompt_of(31, 20), system + prompt_of(32, 20)
    gate = StepGate(pool, pause_at=3)
    async with make_scheduler(pool, make_config(segment_tokens=64, step_token_budget=64)) as sched:
        leader = sched.submit(make_request(a, 4))
        waiter = sched.submit(make_request(b, 4))
        await gate.wait_reached()
        assert sched.stats().queue_depth == 1 and sched.stats().num_running == 1  # B waits
        cancel = asyncio.create_task(leader.cancel())
        gate.release.set()
        assert await cancel is True
        out = await collect(waiter)
        await sched.check_integrity()
    assert out.finish.reuse.source is ReuseSource.REWIND
    assert (out.finish.reuse.reused_tokens, out.finish.reuse.prefilled_tokens) == (192, 320 - 192)
    assert pool.num_computed_tokens == 320 + 3  # A's 192 rows, B's 128, B's 3 fed tokens
    assert out.tokens == await cold_tokens(b, 4)


async def test_more_conversations_than_slots_are_served_from_checkpoints():
    pool = make_pool(2, 1024, row_bytes=64)
    config = make_config(checkpoint_memory_mb=4)
    convs = [prompt_of(200 + c, 120) for c in range(4)]
    restored = 0
    async with make_scheduler(pool, config) as sched:
        for turn in range(3):
            for c in range(4):
                before = pool.num_computed_tokens
                out = await run_one(sched, convs[c], 6)
                r = out.finish.reuse
                computed = pool.num_computed_tokens - before
                assert computed == r.prefilled_tokens + 5
                if turn > 0:
                    # the whole previous record: previous prompt + 5 fed reply tokens
                    assert r.source is ReuseSource.CHECKPOINT_MEMORY
                    assert r.reused_tokens == len(convs[c]) - 20 - 1
                    restored += 1
                assert out.tokens == await cold_tokens(convs[c], 6)
                convs[c] = convs[c] + out.tokens + prompt_of(300 + 10 * c + turn, 20)
        await sched.check_integrity()
    assert restored == 8
    assert pool.num_restores == 8


async def test_prefill_cancelled_halfway_then_retried_pays_only_the_rest():
    pool = make_pool(2, 2048)
    prompt = prompt_of(9, 1000)
    gate = StepGate(pool, pause_at=6)
    async with make_scheduler(pool, make_config(segment_tokens=64, step_token_budget=64)) as sched:
        handle = sched.submit(make_request(prompt, 4))
        await gate.wait_reached()
        cancel = asyncio.create_task(handle.cancel())
        await asyncio.sleep(0.01)
        assert not cancel.done()  # the ack waits for the in-flight segment
        gate.release.set()
        assert await cancel is True
        assert pool.num_computed_tokens == 6 * 64
        assert sched.slots()[0].num_tokens == 6 * 64 or sched.slots()[1].num_tokens == 6 * 64
        b = await run_one(sched, prompt, 4)
        await sched.check_integrity()
    assert b.finish.reuse.prefilled_tokens == 1000 - 6 * 64
    assert pool.num_computed_tokens == 1000 + 3
    await assert_warm_run(b, prompt, 4, ReuseSource.REWIND, reused_tokens=6 * 64)


async def test_disk_checkpoint_serves_after_a_restart(tmp_path):
    system = prompt_of(10, 200)
    config = make_config(kv_disk_dir=str(tmp_path), kv_disk_space_mb=16, checkpoint_memory_mb=4)
    pool1 = make_pool(2, 1024)
    async with make_scheduler(pool1, config) as sched:
        await run_one(sched, system + prompt_of(11, 30), 4, prefix_hint=200)
    files = list(tmp_path.rglob("*.kvc"))
    assert len(files) == 1  # the hinted system prefix (prompt-end captures stay in memory)

    pool2 = make_pool(2, 1024)  # a restarted server: empty slots, empty memory store
    prompt = system + prompt_of(12, 40)
    async with make_scheduler(pool2, config) as sched:
        await sched.wait_ready()
        out = await run_one(sched, prompt, 6)
        again = await run_one(sched, system + prompt_of(13, 10), 3)
        await sched.check_integrity()
    assert pool2.num_restores == 1
    assert pool2.num_computed_tokens == 40 + 5 + (again.finish.reuse.prefilled_tokens + 2)
    await assert_warm_run(out, prompt, 6, ReuseSource.CHECKPOINT_DISK, reused_tokens=200)
    assert again.finish.reuse.reused_tokens == 200  # served from the live slot now
    assert list(tmp_path.rglob("*.kvc")) == files  # a restored checkpoint stays on disk
