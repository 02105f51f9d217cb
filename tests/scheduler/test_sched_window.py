"""Sliding-window rings on the fake engine: the pool's rewind reach (min_truncate_len), and the
scheduler's routing around it, warm == cold token for token.

Each scheduler test asserts the reuse source, the reused count and the tokens the engine
computed, so a path that silently fell back to a cold prefill fails. The windowed fake keeps
window rows for the last window + step positions only and mixes the window into its logits, so
a restore or copy that lost ring rows would change the tokens (`reference_greedy` is the
stateless reference of the same windowed model).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_support import (
    N_VOCAB,
    RecordingSink,
    StepGate,
    collect,
    make_config,
    make_request,
    make_scheduler,
    prompt_of,
    reference_greedy,
    run_one,
)
from slotserve.scheduler.fake_engine import FakeSlotPool
from slotserve.scheduler.interface import BatchItem
from slotserve.scheduler.prefill_order import PrefillOrder
from slotserve.scheduler.prefix import common_prefix_len
from slotserve.scheduler.request import ReuseSource

W, STEP = 32, 16  # window, ring rows beyond it (the ring holds W + STEP positions)


def ring_pool(num_slots: int = 2, ctx_len: int = 1024, window: int = W, step: int = STEP) -> FakeSlotPool:
    return FakeSlotPool(num_slots, ctx_len, N_VOCAB, window=window, step_tokens=step)


def feed(pool: FakeSlotPool, slot: int, tokens) -> np.ndarray:
    toks = np.asarray(tokens, dtype=np.int32)
    return pool.forward([BatchItem(slot, toks, pool.slot_len(slot), True)])[0]


# ---------------------------------------------------------------- the pool's contract


def test_ring_reach_follows_the_window_and_refused_cuts_change_nothing():
    pool = ring_pool()
    feed(pool, 0, prompt_of(1, W + STEP))
    assert pool.min_truncate_len(0) == 0  # the ring has not wrapped: any cut is exact
    feed(pool, 0, prompt_of(2, 100))
    held = pool.slot_len(0)
    floor = pool.min_truncate_len(0)
    assert floor == held - STEP - 1  # lowest row held (held - W - STEP) + the W - 1 rows before a cut
    rec = pool.record(0).copy()
    for bad in (1, floor - 1):
        with pytest.raises(ValueError, match="cut back"):
            pool.truncate(0, bad)
        with pytest.raises(ValueError, match="cut back"):
            pool.copy_prefix(0, 1, bad)
        with pytest.raises(ValueError, match="cut back"):
            pool.snapshot(0, bad)
    assert np.array_equal(pool.record(0), rec) and pool.min_truncate_len(0) == floor
    assert pool.slot_len(1) == 0
    pool.truncate(0, floor)  # the deepest exact cut, then the same logits as a cold run
    assert np.array_equal(feed(pool, 0, [5]), pool.reference_logits(list(rec[:floor]) + [5]))
    pool.truncate(0, 0)
    assert pool.min_truncate_len(0) == 0 and pool.slot_len(0) == 0


def test_full_kv_pool_can_cut_anywhere():
    pool = FakeSlotPool(1, 512, N_VOCAB)
    feed(pool, 0, prompt_of(1, 300))
    assert pool.kv_window is None and pool.min_truncate_len(0) == 0
    assert pool.restored_min_truncate_len(300) == 0
    pool.truncate(0, 1)
    assert pool.slot_len(0) == 1


def test_snapshot_carries_the_ring_and_restores_only_its_own_length():
    pool = ring_pool()
    prompt = prompt_of(3, 200)
    feed(pool, 0, prompt)
    n = pool.slot_len(0) - 4
    snap = pool.snapshot(0, n)
    assert len(snap) == pool.snapshot_nbytes(n)
    assert pool.snapshot_nbytes(n) < FakeSlotPool(1, 1024, N_VOCAB).snapshot_nbytes(n) + W * pool.row_bytes
    assert pool.restore(1, snap) == n
    assert pool.min_truncate_len(1) == pool.restored_min_truncate_len(n) == n
    with pytest.raises(ValueError, match="cut back"):
        pool.truncate(1, n - 1)
    assert np.array_equal(feed(pool, 1, [7]), pool.reference_logits(prompt[:n] + [7]))
    # a snapshot within the window restores with every row: any cut is exact
    assert pool.restored_min_truncate_len(W - 1) == 0 and pool.restored_min_truncate_len(W) == W
    # mismatching layouts are refused and leave the slot unchanged
    full = FakeSlotPool(2, 1024, N_VOCAB)
    other = ring_pool(window=W * 2)
    for p in (full, other):
        with pytest.raises(ValueError, match="another"):
            p.restore(0, snap)
        assert p.slot_len(0) == 0
    with pytest.raises(ValueError, match="another"):
        pool.restore(0, full_snapshot(full, prompt))


def full_snapshot(pool: FakeSlotPool, prompt) -> bytes:
    feed(pool, 1, prompt)
    return pool.snapshot(1, len(prompt))


@settings(max_examples=60, deadline=None)
@given(
    window=st.integers(2, 24),
    step=st.integers(1, 24),
    ops=st.lists(
        st.tuples(st.sampled_from(["feed", "cut", "copy", "snap"]), st.integers(0, 60)), max_size=25
    ),
)
def test_every_accepted_operation_keeps_the_state_exact(window, step, ops):
    """Random feeds, cuts, copies and snapshot round trips: what the pool accepts is exact (next
    logits equal the stateless reference of the record), what it refuses changes nothing."""
    pool = FakeSlotPool(2, 512, N_VOCAB, window=window, step_tokens=step)
    rng = np.random.default_rng(window * 100 + step)
    for op, arg in ops:
        slot = arg % 2
        held = pool.slot_len(slot)
        before = (pool.record(0).copy(), pool.record(1).copy())
        try:
            if op == "feed" and held + arg + 1 <= pool.ctx_len:
                toks = [int(t) for t in rng.integers(4, N_VOCAB, size=arg + 1)]
                logits = feed(pool, slot, toks)
                assert np.array_equal(logits, pool.reference_logits(list(pool.record(slot))))
            elif op == "cut" and held:
                pool.truncate(slot, held - arg % (held + 1))
            elif op == "copy" and held:
                pool.copy_prefix(slot, 1 - slot, held - arg % (held + 1))
            elif op == "snap" and held:
                n = held - arg % held
                pool.restore(1 - slot, pool.snapshot(slot, n))
        except ValueError:
            assert np.array_equal(pool.record(0), before[0]) and np.array_equal(pool.record(1), before[1])
        for s in (0, 1):
            assert 0 <= pool.min_truncate_len(s) <= pool.slot_len(s)
            if pool.slot_len(s):
                probe = feed(pool, s, [9])
                assert np.array_equal(probe, pool.reference_logits(list(pool.record(s))))
                pool.truncate(s, pool.slot_len(s) - 1)


# ---------------------------------------------------------------- the scheduler around it


def ring_config(**kw):
    kw.setdefault("segment_tokens", STEP)
    kw.setdefault("step_token_budget", STEP)
    kw.setdefault("checkpoint_memory_mb", 8)
    kw.setdefault("checkpoint_interval_tokens", 64)
    return make_config(**kw)


async def test_multi_turn_past_the_window_extends_the_live_ring():
    pool = ring_pool(2)
    sink = RecordingSink()
    turn1 = prompt_of(10, 150)
    async with make_scheduler(pool, ring_config(), stats_sink=sink) as sched:
        a = await run_one(sched, turn1, 8)
        turn2 = turn1 + a.tokens + prompt_of(11, 90)
        before = pool.num_computed_tokens
        b = await run_one(sched, turn2, 8)
        turn3 = turn2 + b.tokens + prompt_of(12, 70)
        c = await run_one(sched, turn3, 8)
        await sched.check_integrity()
    assert a.tokens == reference_greedy(pool, turn1, 8)
    assert (b.finish.reuse.source, b.finish.reuse.reused_tokens) == (ReuseSource.REWIND, 157)
    assert b.tokens == reference_greedy(pool, turn2, 8)
    assert (c.finish.reuse.source, c.finish.reuse.reused_tokens) == (ReuseSource.REWIND, len(turn2) + 7)
    assert c.tokens == reference_greedy(pool, turn3, 8)
    assert pool.num_computed_tokens - before == (len(turn2) - 157 + 7) + (len(turn3) - len(turn2) - 7 + 7)
    assert not any(r.window_refused for r in sink.routes)


async def test_abort_and_resend_during_a_prefill_past_the_window():
    pool = ring_pool(1)
    prompt = prompt_of(20, 400)
    gate = StepGate(pool, pause_at=8)  # 7 segments of 16 tokens done, the 8th in flight
    async with make_scheduler(pool, ring_config(checkpoint_memory_mb=0)) as sched:
        h = sched.submit(make_request(prompt, 6))
        await gate.wait_reached()
        cancel = asyncio.ensure_future(h.cancel())
        gate.release.set()
        assert await cancel
        held = pool.slot_len(0)
        assert held == 8 * STEP and held > W + STEP  # past the window: the ring has wrapped
        before = pool.num_computed_tokens
        out = await run_one(sched, prompt, 6)
        await sched.check_integrity()
    assert (out.finish.reuse.source, out.finish.reuse.reused_tokens) == (ReuseSource.REWIND, held)
    assert pool.num_computed_tokens - before == (400 - held) + 5
    assert out.tokens == reference_greedy(pool, prompt, 6)


async def test_resend_after_a_reply_rewinds_within_the_ring():
    pool = ring_pool(1)
    prompt = prompt_of(21, 300)
    async with make_scheduler(pool, ring_config(checkpoint_memory_mb=0)) as sched:
        await run_one(sched, prompt, 6)  # the slot holds prompt + 5 reply rows
        before = pool.num_computed_tokens
        out = await run_one(sched, prompt, 6)  # regenerate: cut 6 rows back, within the ring
    assert (out.finish.reuse.source, out.finish.reuse.reused_tokens) == (ReuseSource.REWIND, 299)
    assert pool.num_computed_tokens - before == 1 + 5
    assert out.tokens == reference_greedy(pool, prompt, 6)


async def edit_early_turn(interval: int) -> tuple:
    pool = ring_pool(1)
    sink = RecordingSink()
    turns = [prompt_of(30 + i, 60) for i in range(5)]
    async with make_scheduler(
        pool, ring_config(checkpoint_interval_tokens=interval), stats_sink=sink
    ) as sched:
        conv: list[int] = []
        for t in turns:
            conv = conv + t
            out = await run_one(sched, conv, 4)
            conv = conv + out.tokens
        edited = conv[:100] + prompt_of(99, 50)  # diverges at 100, far behind the end (319)
        before = pool.num_computed_tokens
        out = await run_one(sched, edited, 5)
        await sched.check_integrity()
    return pool, sink, edited, out, pool.num_computed_tokens - before


async def test_edit_of_an_early_turn_restores_the_checkpoint_below_the_divergence():
    pool, sink, edited, out, computed = await edit_early_turn(64)
    # the live slot shares 100 tokens but its ring reaches back one step only: a window refusal;
    # the interval checkpoint at 64 is the best at or below the divergence
    assert (out.finish.reuse.source, out.finish.reuse.reused_tokens) == (ReuseSource.CHECKPOINT_MEMORY, 64)
    assert computed == len(edited) - 64 + 4
    assert out.tokens == reference_greedy(pool, edited, 5)
    last = sink.routes[-1]
    assert last.window_refused and last.restore_reason == "window"
    assert last.window_recomputed_tokens == 100 - 64
    assert [e.num_tokens for e in sink.checkpoints if e.kind == "capture" and e.rule == "interval"][:2] == [
        64,
        128,
    ]


async def test_edit_of_an_early_turn_without_interval_checkpoints_goes_cold():
    pool, sink, edited, out, computed = await edit_early_turn(0)
    # the prompt-end checkpoint of turn 1 (60 tokens) is the only one at or below 100
    assert (out.finish.reuse.source, out.finish.reuse.reused_tokens) == (ReuseSource.CHECKPOINT_MEMORY, 60)
    assert computed == len(edited) - 60 + 4
    assert sink.routes[-1].window_recomputed_tokens == 40
    assert not [e for e in sink.checkpoints if e.rule == "interval"]
    assert out.tokens == reference_greedy(pool, edited, 5)


async def test_a_system_prompt_shared_by_several_slots_is_restored_not_copied_past_the_ring():
    pool = ring_pool(3)
    sink = RecordingSink()
    system = prompt_of(40, 100)
    prompts = [system + prompt_of(41 + i, 80) for i in range(3)]
    async with make_scheduler(pool, ring_config(capture_prompt_end=False), stats_sink=sink) as sched:
        first = await run_one(sched, prompts[0], 4, prefix_hint=100)
        busy = sched.submit(make_request(prompts[1], 200, prefix_hint=100))
        async for _ in busy:
            break  # decoding: its ring is far past the system prompt
        third = await run_one(sched, prompts[2], 4, prefix_hint=100)
        await busy.cancel()
        await sched.check_integrity()
    assert first.finish.reuse.source is ReuseSource.NONE
    assert first.tokens == reference_greedy(pool, prompts[0], 4)
    for out, p in ((third, prompts[2]),):
        assert (out.finish.reuse.source, out.finish.reuse.reused_tokens) == (
            ReuseSource.CHECKPOINT_MEMORY,
            100,
        )
        assert out.finish.reuse.prefilled_tokens == len(p) - 100
        assert out.tokens == reference_greedy(pool, p, 4)
    assert [r.restore_reason for r in sink.routes[1:]] == ["window", "window"]
    assert [e.num_tokens for e in sink.checkpoints if e.kind == "capture" and e.rule == "hint"] == [100]


async def test_an_evicted_conversation_is_restored_from_disk_after_a_restart(tmp_path):
    conv = prompt_of(50, 200)
    config = ring_config(kv_disk_dir=str(tmp_path), kv_disk_space_mb=64, capture_prompt_end=False)
    pool = ring_pool(1)
    async with make_scheduler(pool, config) as sched:
        a = await run_one(sched, conv, 6)
        await run_one(sched, prompt_of(51, 120), 2)  # overwrites the only slot: captured on evict
    held = len(conv) + 5
    follow = conv + a.tokens + prompt_of(52, 30)
    restarted = ring_pool(1)
    sink = RecordingSink()
    async with make_scheduler(restarted, config, stats_sink=sink) as sched:
        await sched.wait_ready()
        out = await run_one(sched, follow, 6)
        await sched.check_integrity()
    assert (out.finish.reuse.source, out.finish.reuse.reused_tokens) == (ReuseSource.CHECKPOINT_DISK, held)
    assert restarted.num_computed_tokens == len(follow) - held + 5
    assert out.tokens == reference_greedy(restarted, follow, 6)
    assert sink.routes[-1].restore_reason == "evicted"


# ---------------------------------------------------------------- properties


def expected_reuse(pool: FakeSlotPool, record, floor: int, checkpoints, prompt, least: int) -> int:
    """Brute force over the sources a one-slot windowed scheduler has for `prompt`: the live
    slot (cut back to `floor` at the shortest) and checkpoints of first-prompt prefixes that
    supply at least `least` (min_checkpoint_tokens) tokens."""
    L = len(prompt)
    best = 0
    c = common_prefix_len(np.asarray(prompt, np.int32), np.asarray(record, np.int32))
    u = min(c, L - 1)
    if u >= len(record) or u >= floor:
        best = u
    for toks in checkpoints:
        c = common_prefix_len(np.asarray(prompt, np.int32), np.asarray(toks, np.int32))
        u = min(c, L - 1)
        if u >= least and (u >= len(toks) or u >= pool.restored_min_truncate_len(len(toks))):
            best = max(best, u)
    return best


@settings(max_examples=40, deadline=None)
@given(
    window=st.integers(2, 40),
    segment=st.integers(1, 48),
    first_len=st.integers(20, 220),
    diverge=st.integers(0, 240),
    interval=st.sampled_from([0, 24, 50]),
)
def test_routing_around_the_ring_reuses_what_the_oracle_says_and_stays_exact(
    window, segment, first_len, diverge, interval
):
    first = prompt_of(60, first_len)
    diverge = min(diverge, first_len + 3)
    second = (first + prompt_of(61, 8))[:diverge] + prompt_of(62, 40)

    async def run() -> tuple:
        pool = ring_pool(1, window=window, step=segment)
        sink = RecordingSink()
        config = ring_config(
            segment_tokens=segment, step_token_budget=segment, checkpoint_interval_tokens=interval
        )
        async with make_scheduler(pool, config, stats_sink=sink) as sched:
            a = await run_one(sched, first, 4)
            record, floor = pool.record(0).copy(), pool.min_truncate_len(0)
            stored = [e.tokens.copy() for e in sched._ckpt.memory.entries()]
            before = pool.num_computed_tokens
            b = await run_one(sched, second, 4)
            await sched.check_integrity()
        return pool, a, b, record, floor, stored, pool.num_computed_tokens - before

    pool, a, b, record, floor, stored, computed = asyncio.run(run())
    want = expected_reuse(pool, record, floor, stored, second, ring_config().min_checkpoint_tokens)
    assert b.finish.reuse.reused_tokens == want
    assert computed == len(second) - want + 3
    assert a.tokens == reference_greedy(pool, first, 4)
    assert b.tokens == reference_greedy(pool, second, 4)


async def test_a_shared_prefix_still_being_prefilled_is_captured_for_its_waiter():
    """Two prompts with one system prompt arrive together. The second waits for the first's
    prefill (WAIT_SHARED); with a ring of 4 rows beyond the window and 64-token segments, the
    leader's ring would be past the shared 100 tokens before the waiter could copy them, so the
    leader gets a capture point there and the waiter reuses all 100. (FIFO: by cost the short
    second prompt would lead and the first would wait for it.)"""
    pool = ring_pool(2, step=4)
    sink = RecordingSink()
    system = prompt_of(70, 100)
    a, b = system + prompt_of(71, 300), system + prompt_of(72, 40)
    shared = common_prefix_len(np.asarray(a, np.int32), np.asarray(b, np.int32))
    assert shared >= 100
    config = ring_config(
        segment_tokens=64, step_token_budget=64, capture_prompt_end=False, prefill_order=PrefillOrder.FIFO
    )
    async with make_scheduler(pool, config, stats_sink=sink) as sched:
        first = sched.submit(make_request(a, 4))
        second = sched.submit(make_request(b, 4))
        outs = await asyncio.gather(collect(first), collect(second))
        await sched.check_integrity()
    assert outs[0].finish.reuse.reused_tokens == 0
    assert outs[1].finish.reuse.source in (ReuseSource.COPY, ReuseSource.CHECKPOINT_MEMORY)
    assert outs[1].finish.reuse.reused_tokens == shared
    assert outs[1].finish.reuse.prefilled_tokens == len(b) - shared
    assert [e.num_tokens for e in sink.checkpoints if e.kind == "capture" and e.rule == "common_prefix"] == [
        shared
    ]
    assert outs[0].tokens == reference_greedy(pool, a, 4)
    assert outs[1].tokens == reference_greedy(pool, b, 4)
