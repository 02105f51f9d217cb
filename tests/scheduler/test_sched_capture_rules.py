"""Checkpoint capture rules (hint, common prefix, prompt end, evict) end to end on the fake
engine: what is captured, and that restoring it is exact."""

from __future__ import annotations

import asyncio

from sched_support import (
    RecordingSink,
    assert_warm_run,
    cold_tokens,
    collect,
    make_config,
    make_pool,
    make_request,
    make_scheduler,
    prompt_of,
    run_one,
)
from slotserve.scheduler.request import ReuseSource


def captures(sink, rule):
    return [e.num_tokens for e in sink.checkpoints if e.kind == "capture" and e.rule == rule]


async def test_hint_capture_right_after_a_copy_snapshots_the_copied_rows():
    pool = make_pool(2, 1024)
    sink = RecordingSink()
    system = prompt_of(1, 100)
    config = make_config(checkpoint_memory_mb=4, capture_prompt_end=False)
    async with make_scheduler(pool, config, stats_sink=sink) as sched:
        await run_one(sched, prompt_of(2, 150), 2)  # occupies a slot with other content
        busy = sched.submit(make_request(system + prompt_of(3, 30), 200))
        async for _ in busy:
            break  # decoding: its slot is a copy source, not a destination
        hinted = system + prompt_of(4, 20)
        out = await run_one(sched, hinted, 4, prefix_hint=100)
        assert out.finish.reuse.source is ReuseSource.COPY
        assert captures(sink, "hint") == [100]
        await busy.cancel()
        # overwrite both slots, then come back for the system prompt: restored from the hint
        await asyncio.gather(*(run_one(sched, prompt_of(10 + i, 120), 2) for i in range(2)))
        later = system + prompt_of(5, 25)
        back = await run_one(sched, later, 5)
        await sched.check_integrity()
    await assert_warm_run(back, later, 5, ReuseSource.CHECKPOINT_MEMORY, reused_tokens=100)
    assert out.tokens == await cold_tokens(hinted, 4)


async def test_common_prefix_of_two_unmatched_prompts_is_captured_and_restored():
    pool = make_pool(2, 1024, can_copy=False)  # the second prompt cannot use the busy first
    sink = RecordingSink()
    system = prompt_of(20, 100)
    config = make_config(checkpoint_memory_mb=0.012, capture_prompt_end=False)
    async with make_scheduler(pool, config, stats_sink=sink) as sched:
        first = sched.submit(make_request(system + prompt_of(21, 200), 3))
        second = sched.submit(make_request(system + prompt_of(22, 200), 3))
        outs = await asyncio.gather(collect(first), collect(second))
        assert [o.finish.reuse.source for o in outs] == [ReuseSource.NONE] * 2
        assert captures(sink, "common_prefix") == [100]
        # evict-captures of the 300-token records do not fit the budget and cannot displace it
        await asyncio.gather(*(run_one(sched, prompt_of(30 + i, 50), 2) for i in range(2)))
        assert captures(sink, "evict") == []
        prompt = system + prompt_of(23, 40)
        out = await run_one(sched, prompt, 5)
        await sched.check_integrity()
    await assert_warm_run(out, prompt, 5, ReuseSource.CHECKPOINT_MEMORY, reused_tokens=100)


async def test_prompt_end_capture_serves_a_regenerated_reply_after_eviction():
    pool = make_pool(1, 1024)
    sink = RecordingSink()
    prompt = prompt_of(40, 200)
    config = make_config(checkpoint_memory_mb=4)
    async with make_scheduler(pool, config, stats_sink=sink) as sched:
        await run_one(sched, prompt, 3)
        assert captures(sink, "prompt_end") == [200]
        await run_one(sched, prompt_of(41, 50), 2)  # overwrites the only slot
        before = pool.num_computed_tokens
        out = await run_one(sched, prompt, 6)
    assert pool.num_computed_tokens - before == 1 + 5
    await assert_warm_run(out, prompt, 6, ReuseSource.CHECKPOINT_MEMORY, reused_tokens=199)


async def test_returning_conversations_restore_their_whole_record_from_a_budget_of_distinct_rows():
    """Issue 16 in small: 4 conversations with their own hinted system prompts take turns on 2
    slots. The budget fits one checkpoint per conversation, not a hint, a prompt-end copy and an
    evicted record of each: each conversation keeps exactly one entry (the longest), so every
    returning turn restores its whole previous record."""
    pool = make_pool(2, 1024, row_bytes=64)
    sink = RecordingSink()
    convs = [prompt_of(60 + c, 100) + prompt_of(70 + c, 20) for c in range(4)]
    budget = 4 * pool.snapshot_nbytes(200)  # < 4 hints + 4 records (>= 4 * (100 + 125) rows)
    config = make_config(checkpoint_memory_mb=budget / 2**20)
    record_len = [[] for _ in range(4)]  # per conversation: its record after each turn
    async with make_scheduler(pool, config, stats_sink=sink) as sched:
        for turn in range(3):
            for c in range(4):
                out = await run_one(sched, convs[c], 6, prefix_hint=100)
                r = out.finish.reuse
                if turn > 0:
                    assert r.source is ReuseSource.CHECKPOINT_MEMORY
                    assert r.reused_tokens == record_len[c][-1]  # previous prompt + 5 fed
                assert out.tokens == await cold_tokens(convs[c], 6)
                record_len[c].append(len(convs[c]) + 5)
                convs[c] = convs[c] + out.tokens + prompt_of(80 + 10 * c + turn, 20)
                assert sched.stats().checkpoint_memory_bytes <= budget
        await sched.check_integrity()
        held = sched.stats().checkpoint_memory_bytes
        records = [list(pool.record(s)) for s in range(2)]
        live = [c for c in range(4) if convs[c][: record_len[c][-1]] in records]
    assert pool.num_restores == 8
    assert captures(sink, "hint") == [100] * 4  # never again: the conversation's entry holds it
    # one entry per conversation: its last record, or the one it restored from if still live
    want = sorted(record_len[c][-2] if c in live else record_len[c][-1] for c in range(4))
    assert len(live) == 2
    stored = sorted(e.num_tokens for e in sink.checkpoints if e.kind == "capture")
    for e in sink.checkpoints:
        if e.kind == "evict":
            stored.remove(e.num_tokens)
    assert stored == want
    assert held == sum(pool.snapshot_nbytes(n) for n in want)
