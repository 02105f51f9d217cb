"""Recurrent state on the fake engine (FakeSlotPool(recurrent=True)): routing that never
rewinds a recurrent slot, the captures that replace a rewind, warm == cold token for token.

A recurrent slot can only be extended and a checkpoint only restored at its own length
(interface.py), so each test asserts the reuse source, the reused count and the tokens the
engine computed: a path that fell back to a cold prefill, or reused a state it should not
have, fails. The recurrent fake mixes its state into the logits and scrambles every state it
no longer holds, so a wrong reuse changes the tokens against `reference_greedy` (the stateless
reference of the same model).
"""

from __future__ import annotations

import asyncio

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_support import (
    N_VOCAB,
    RecordingSink,
    StepGate,
    cancel_in_prefill_and_resend,
    collect,
    make_config,
    make_request,
    make_scheduler,
    prompt_of,
    reference_greedy,
    run_one,
)
from slotserve.scheduler.checkpoint_policy import auto_interval_tokens
from slotserve.scheduler.fake_engine import FakeSlotPool
from slotserve.scheduler.policy import CheckpointMatch, CheckpointTier, RouteAction, SlotCandidate, route
from slotserve.scheduler.prefix import common_prefix_len
from slotserve.scheduler.request import ReuseSource

SEG = 16  # prefill segment: captures land on segment ends, so it must not matter


def rec_pool(num_slots: int = 2, ctx_len: int = 1024, **kw) -> FakeSlotPool:
    return FakeSlotPool(num_slots, ctx_len, N_VOCAB, recurrent=True, **kw)


def rec_config(**kw):
    kw.setdefault("segment_tokens", SEG)
    kw.setdefault("step_token_budget", SEG)
    kw.setdefault("checkpoint_memory_mb", 8)
    kw.setdefault("checkpoint_interval_tokens", 0)
    return make_config(**kw)


def reuse(out) -> tuple[ReuseSource, int]:
    return out.finish.reuse.source, out.finish.reuse.reused_tokens


def captured(sink: RecordingSink, rule: str) -> list[int]:
    return [e.num_tokens for e in sink.checkpoints if e.kind == "capture" and e.rule == rule]


async def test_multi_turn_extends_the_live_recurrent_slot():
    pool = rec_pool(2)
    sink = RecordingSink()
    turn1 = prompt_of(10, 150)
    async with make_scheduler(pool, rec_config(), stats_sink=sink) as sched:
        a = await run_one(sched, turn1, 8)
        turn2 = turn1 + a.tokens + prompt_of(11, 90)
        before = pool.num_computed_tokens
        b = await run_one(sched, turn2, 8)
        turn3 = turn2 + b.tokens + prompt_of(12, 70)
        c = await run_one(sched, turn3, 8)
        await sched.check_integrity()
    assert a.tokens == reference_greedy(pool, turn1, 8)
    # the slot holds turn1 + 7 reply rows: a prefix of turn2, extended in place
    assert reuse(b) == (ReuseSource.REWIND, 157)
    assert b.tokens == reference_greedy(pool, turn2, 8)
    assert reuse(c) == (ReuseSource.REWIND, len(turn2) + 7)
    assert c.tokens == reference_greedy(pool, turn3, 8)
    assert pool.num_computed_tokens - before == (len(turn2) - 157 + 7) + (len(turn3) - len(turn2) - 7 + 7)
    assert not any(r.window_refused for r in sink.routes)
    # each prompt's end less one token is kept (a resend must refeed the last prompt token)
    assert captured(sink, "prompt_end") == [149, len(turn2) - 1, len(turn3) - 1]


async def test_a_resend_after_the_reply_restores_the_prompt_end_checkpoint():
    """Regenerate: the live slot holds the prompt and the reply and cannot drop the reply; the
    prompt_end capture at L - 1 serves the resend with one token to refeed."""
    pool = rec_pool(1)
    sink = RecordingSink()
    prompt = prompt_of(21, 300)
    async with make_scheduler(pool, rec_config(), stats_sink=sink) as sched:
        await run_one(sched, prompt, 6)
        before = pool.num_computed_tokens
        out = await run_one(sched, prompt, 6)
        await sched.check_integrity()
    assert reuse(out) == (ReuseSource.CHECKPOINT_MEMORY, 299)
    assert pool.num_computed_tokens - before == 1 + 5
    assert out.tokens == reference_greedy(pool, prompt, 6)
    last = sink.routes[-1]
    assert last.window_refused and last.restore_reason == "window" and last.window_recomputed_tokens == 0


async def test_a_resend_without_checkpoints_goes_cold_and_never_rewinds():
    pool = rec_pool(1)
    prompt = prompt_of(22, 120)
    async with make_scheduler(pool, rec_config(checkpoint_memory_mb=0)) as sched:
        await run_one(sched, prompt, 4)
        before = pool.num_computed_tokens
        out = await run_one(sched, prompt, 4)
        await sched.check_integrity()
    assert reuse(out) == (ReuseSource.NONE, 0)
    assert pool.num_computed_tokens - before == 120 + 3
    assert out.tokens == reference_greedy(pool, prompt, 4)


async def test_abort_and_resend_during_prefill_extends_what_was_computed():
    pool = rec_pool(1)
    prompt = prompt_of(20, 400)
    gate = StepGate(pool, pause_at=8)  # 7 segments of 16 tokens done, the 8th in flight
    held = 8 * SEG
    async with make_scheduler(pool, rec_config(checkpoint_memory_mb=0)) as sched:
        out, computed = await cancel_in_prefill_and_resend(sched, pool, gate, prompt, 6, held)
    assert reuse(out) == (ReuseSource.REWIND, held)
    assert computed == (400 - held) + 5
    assert out.tokens == reference_greedy(pool, prompt, 6)


async def edit_early_turn(*, with_turns: bool) -> tuple:
    """Five turns of 60 prompt tokens and 4 reply tokens; each request says where its last user
    message starts and where each assistant turn starts, as the gateway does. Then turn 2's user
    message (from 64) is edited at 100."""
    pool = rec_pool(1)
    sink = RecordingSink()
    async with make_scheduler(pool, rec_config(), stats_sink=sink) as sched:
        conv: list[int] = []
        assistant: list[int] = []
        for i in range(5):
            user = len(conv)
            conv = conv + prompt_of(30 + i, 60)
            turns = tuple(t for t in (*assistant, user) if t > 0) if with_turns else ()
            out = await run_one(sched, conv, 4, turn_offsets=turns)
            assistant.append(len(conv))
            conv = conv + out.tokens
        edited = conv[:100] + prompt_of(99, 50)
        before = pool.num_computed_tokens
        out = await run_one(sched, edited, 5)
        await sched.check_integrity()
    return pool, sink, edited, out, pool.num_computed_tokens - before


async def test_edit_of_an_early_turn_restores_the_turn_start_below_the_divergence():
    pool, sink, edited, out, computed = await edit_early_turn(with_turns=True)
    # the live slot shares 100 tokens and can supply none; the turn capture at the start of
    # turn 2's user message (64) is the best at or below the divergence
    assert reuse(out) == (ReuseSource.CHECKPOINT_MEMORY, 64)
    assert computed == len(edited) - 64 + 4
    assert out.tokens == reference_greedy(pool, edited, 5)
    last = sink.routes[-1]
    assert last.window_refused and last.restore_reason == "window"
    assert last.window_recomputed_tokens == 100 - 64
    assert captured(sink, "turn") == [64, 128, 192, 256]  # each request's last user message
    assert captured(sink, "prompt_end") == [59, 123, 187, 251, 315, 149]  # the last: the edit


async def test_turn_checkpoints_spill_to_disk_and_serve_an_edit_after_a_restart(tmp_path):
    """Turn captures are not written through, but when memory evicts one it goes to the disk
    tier: with room for a few small checkpoints, turn 2's start (64) is evicted by later ones,
    and after a restart the edit at 100 restores it from disk."""
    config = rec_config(checkpoint_memory_mb=0.03, kv_disk_dir=str(tmp_path), kv_disk_space_mb=64)
    pool = rec_pool(1)
    sink = RecordingSink()
    async with make_scheduler(pool, config, stats_sink=sink) as sched:
        conv: list[int] = []
        assistant: list[int] = []
        for i in range(5):
            user = len(conv)
            conv = conv + prompt_of(30 + i, 60)
            turns = tuple(t for t in (*assistant, user) if t > 0)
            out = await run_one(sched, conv, 4, turn_offsets=turns)
            assistant.append(len(conv))
            conv = conv + out.tokens
        await sched.check_integrity()

    def turns_in(tier: str) -> list[int]:
        return [
            e.num_tokens for e in sink.checkpoints if (e.kind, e.rule, e.tier) == ("capture", "turn", tier)
        ]

    assert turns_in("memory") == [64, 128, 192, 256]
    assert turns_in("disk") == [64, 128]  # evicted from memory, so spilled; the others were not
    edited = conv[:100] + prompt_of(99, 50)
    restarted = rec_pool(1)
    async with make_scheduler(restarted, config) as sched:
        await sched.wait_ready()
        out = await run_one(sched, edited, 5)
        await sched.check_integrity()
    assert reuse(out) == (ReuseSource.CHECKPOINT_DISK, 64)
    assert restarted.num_computed_tokens == len(edited) - 64 + 4
    assert out.tokens == reference_greedy(restarted, edited, 5)


async def test_edit_of_an_early_turn_without_turn_offsets_falls_back_to_the_prompt_end():
    pool, sink, edited, out, computed = await edit_early_turn(with_turns=False)
    assert reuse(out) == (ReuseSource.CHECKPOINT_MEMORY, 59)  # turn 1's prompt end less one
    assert computed == len(edited) - 59 + 4
    assert captured(sink, "turn") == []
    assert out.tokens == reference_greedy(pool, edited, 5)


async def test_a_system_prompt_shared_by_several_slots_is_restored_never_copied_from_a_longer_slot():
    pool = rec_pool(3)
    sink = RecordingSink()
    system = prompt_of(40, 100)
    prompts = [system + prompt_of(41 + i, 80) for i in range(3)]
    async with make_scheduler(pool, rec_config(capture_prompt_end=False), stats_sink=sink) as sched:
        first = await run_one(sched, prompts[0], 4, prefix_hint=100)
        busy = sched.submit(make_request(prompts[1], 200, prefix_hint=100))
        async for _ in busy:
            break  # decoding: its state is far past the system prompt
        third = await run_one(sched, prompts[2], 4, prefix_hint=100)
        await busy.cancel()
        await sched.check_integrity()
    assert reuse(first) == (ReuseSource.NONE, 0)
    assert first.tokens == reference_greedy(pool, prompts[0], 4)
    assert reuse(third) == (ReuseSource.CHECKPOINT_MEMORY, 100)
    assert third.finish.reuse.prefilled_tokens == len(prompts[2]) - 100
    assert third.tokens == reference_greedy(pool, prompts[2], 4)
    assert [r.restore_reason for r in sink.routes[1:]] == ["window", "window"]
    assert captured(sink, "hint") == [100]


async def test_a_shared_prefix_is_learned_from_two_prompts_and_restored_for_the_third():
    """No hint: the second prompt finds no live slot that can supply its system prompt (the first
    slot is past it), so the common prefix of the two is captured (rule common_prefix) and the
    third restores it."""
    pool = rec_pool(3)
    sink = RecordingSink()
    system = prompt_of(45, 120)
    prompts = [system + prompt_of(46 + i, 60) for i in range(3)]
    shared = common_prefix_len(np.asarray(prompts[0], np.int32), np.asarray(prompts[1], np.int32))
    async with make_scheduler(pool, rec_config(capture_prompt_end=False), stats_sink=sink) as sched:
        outs = [await run_one(sched, p, 4) for p in prompts]
        await sched.check_integrity()
    assert [reuse(o) for o in outs] == [
        (ReuseSource.NONE, 0),
        (ReuseSource.NONE, 0),
        (ReuseSource.CHECKPOINT_MEMORY, shared),
    ]
    assert captured(sink, "common_prefix") == [shared]
    for p, o in zip(prompts, outs):
        assert o.tokens == reference_greedy(pool, p, 4)


async def test_a_rollback_ring_lets_a_resend_rewind_the_live_slot():
    """With the states of the last 8 lengths kept, a regenerate after a 6-token reply (5 rows
    fed) cuts the live slot back to L - 1 instead of restoring a checkpoint."""
    pool = rec_pool(1, rollback=8)
    prompt = prompt_of(23, 200)
    async with make_scheduler(pool, rec_config(checkpoint_memory_mb=0)) as sched:
        await run_one(sched, prompt, 6)
        assert pool.min_truncate_len(0) == 205 - 8
        before = pool.num_computed_tokens
        out = await run_one(sched, prompt, 6)
        await sched.check_integrity()
    assert reuse(out) == (ReuseSource.REWIND, 199)
    assert pool.num_computed_tokens - before == 1 + 5
    assert out.tokens == reference_greedy(pool, prompt, 6)


async def test_an_evicted_conversation_is_restored_from_disk_after_a_restart(tmp_path):
    conv = prompt_of(50, 200)
    config = rec_config(kv_disk_dir=str(tmp_path), kv_disk_space_mb=64, capture_prompt_end=False)
    pool = rec_pool(1)
    async with make_scheduler(pool, config) as sched:
        a = await run_one(sched, conv, 6)
        await run_one(sched, prompt_of(51, 120), 2)  # overwrites the only slot: captured on evict
    held = len(conv) + 5
    follow = conv + a.tokens + prompt_of(52, 30)
    restarted = rec_pool(1)
    sink = RecordingSink()
    async with make_scheduler(restarted, config, stats_sink=sink) as sched:
        await sched.wait_ready()
        out = await run_one(sched, follow, 6)
        await sched.check_integrity()
    assert reuse(out) == (ReuseSource.CHECKPOINT_DISK, held)
    assert restarted.num_computed_tokens == len(follow) - held + 5
    assert out.tokens == reference_greedy(restarted, follow, 6)
    assert sink.routes[-1].restore_reason == "evicted"


async def test_n_choices_fork_the_prompt_once():
    """n = 3 of one prompt (the gateway's choice_requests): one prefill; the others take the
    leader's whole slot (or its checkpoint) at L - 1 and refeed one token each."""
    pool = rec_pool(3)
    prompt = prompt_of(60, 200)
    async with make_scheduler(pool, rec_config()) as sched:
        handles = [sched.submit(make_request(prompt, 6)) for _ in range(3)]
        outs = await asyncio.gather(*(collect(h) for h in handles))
        await sched.check_integrity()
    want = reference_greedy(pool, prompt, 6)
    assert [o.tokens for o in outs] == [want] * 3
    assert sorted(o.finish.reuse.reused_tokens for o in outs) == [0, 199, 199]
    assert {o.finish.reuse.source for o in outs if o.finish.reuse.reused_tokens} <= {
        ReuseSource.COPY,
        ReuseSource.CHECKPOINT_MEMORY,
    }
    assert pool.num_computed_tokens == 200 + 2 * 1 + 3 * 5


def test_auto_interval_is_on_for_recurrent_state_and_sized_by_the_snapshot():
    def k_for(pool: FakeSlotPool, budget: int) -> int:
        return auto_interval_tokens(
            kv_window=pool.kv_window,
            num_slots=pool.num_slots,
            ctx_len=pool.ctx_len,
            budget_bytes=budget,
            snapshot_nbytes=pool.snapshot_nbytes,
            min_tokens=8,
            restored_floor=pool.restored_min_truncate_len,
        )

    full = FakeSlotPool(4, 4096, N_VOCAB)
    assert k_for(full, 1 << 30) == 0  # full KV rewinds anywhere: no grid
    small, big = rec_pool(4, 4096, state_bytes=4096), rec_pool(4, 4096, state_bytes=32 << 20)
    ks, kb = k_for(small, 256 << 20), k_for(big, 256 << 20)
    assert 8 <= ks < kb  # a state of tens of MiB leaves room for far fewer checkpoints
    # the grid fits in half the budget: slots * ctx / K checkpoints of ctx / 2 tokens
    assert 4 * (4096 / kb) * big.snapshot_nbytes(2048) <= (256 << 20) / 2
    assert k_for(big, 512 << 20) < kb


def test_auto_interval_figures_for_a_qwen35_0_8b_checkpoint_as_docs_state():
    """docs/scheduler.md's figures: a Qwen3.5-0.8B checkpoint of n tokens is n x 12 KiB of KV
    plus 18 DeltaNet states of (3 x 6,144 + 16 x 128 x 128) f32."""
    state = 18 * (3 * 6144 + 16 * 128 * 128) * 4
    assert round(state / (1 << 20), 1) == 19.3

    def k(budget_mb: int) -> int:
        return auto_interval_tokens(
            kv_window=None,
            num_slots=4,
            ctx_len=8192,
            budget_bytes=budget_mb << 20,
            snapshot_nbytes=lambda n: n * 12288 + state,
            min_tokens=64,
            restored_floor=lambda n: n,
        )

    assert (k(1024), k(2048)) == (4305, 2153)
    assert k(256) > 8192 and k(512) > 8192  # no grid fits
    assert [(mb << 20) // (n * 12288 + state) for mb in (256, 1024) for n in (1000, 2000)] == [8, 5, 33, 23]


def test_routing_counts_only_an_exact_extension_or_a_checkpoint_at_or_below_the_divergence():
    """Pure routing over recurrent sources (floor == length): a slot sharing more than a rival
    but not wholly a prefix supplies nothing; a checkpoint longer than the common prefix neither."""
    prompt = np.asarray(prompt_of(70, 150), np.int32)
    other = np.asarray(prompt_of(71, 150), np.int32)
    ext = prompt[:50]  # wholly a prefix: an exact extension
    past = np.concatenate([prompt[:80], other[:40]])  # shares 80, holds 120: cannot be cut back
    slots = [
        SlotCandidate(0, ext, is_free=True, idle_s=0.0, min_truncate_len=50),
        SlotCandidate(1, past, is_free=True, idle_s=0.0, min_truncate_len=120),
        SlotCandidate(2, np.zeros(0, np.int32), is_free=True, idle_s=0.0),
    ]
    ck_short = CheckpointMatch(CheckpointTier.MEMORY, "a", 60, 60, min_truncate_len=60)
    ck_long = CheckpointMatch(CheckpointTier.DISK, "b", 100, 80, min_truncate_len=100)
    d = route(prompt, slots, [ck_long, ck_short])
    assert (d.action, d.reuse_len, d.checkpoint) == (RouteAction.RESTORE_MEMORY, 60, ck_short)
    assert d.window_refused and d.window_lost_tokens == 80 - 60
    d = route(prompt, slots, [ck_long])  # without it the extension is the best
    assert (d.action, d.dest, d.reuse_len) == (RouteAction.REWIND, 0, 50)
    busy = [SlotCandidate(0, ext, is_free=False, idle_s=0.0, min_truncate_len=50), *slots[1:]]
    d = route(prompt, busy, [])  # a busy slot's whole record is copied (a fork)
    assert (d.action, d.src_slot, d.reuse_len, d.dest) == (RouteAction.COPY, 0, 50, 2)
    same = [SlotCandidate(0, prompt, is_free=True, idle_s=0.0, min_truncate_len=150)]
    assert route(prompt, same, []).action is RouteAction.COLD  # a resend cannot refeed its last token


# ---------------------------------------------------------------- property


def expected_reuse(record, checkpoints, prompt, least: int) -> int:
    """Brute force over the sources a one-slot recurrent scheduler has for `prompt`: the live
    slot only as an exact extension, and each checkpoint only at its own length."""
    p = np.asarray(prompt, np.int32)
    L = len(prompt)
    best = 0
    u = min(common_prefix_len(p, np.asarray(record, np.int32)), L - 1)
    if u >= len(record):
        best = u
    for toks in checkpoints:
        u = min(common_prefix_len(p, np.asarray(toks, np.int32)), L - 1)
        if u >= least and u >= len(toks):
            best = max(best, u)
    return best


@settings(max_examples=40, deadline=None)
@given(
    segment=st.integers(1, 48),
    first_len=st.integers(20, 220),
    diverge=st.integers(0, 240),
    interval=st.sampled_from([0, 24, 50]),
    turn=st.integers(1, 219),
)
def test_routing_reuses_what_the_oracle_says_and_stays_exact(segment, first_len, diverge, interval, turn):
    """Two prompts on one recurrent slot; the second diverges from the first prompt + its reply
    at `diverge`. The checkpoints the oracle expects follow from the capture rules alone (turn
    offset, prompt end less one, every `interval` tokens), not from what the store holds."""
    first = prompt_of(60, first_len)
    least = rec_config().min_checkpoint_tokens

    async def run() -> tuple:
        pool = rec_pool(1)
        sink = RecordingSink()
        config = rec_config(
            segment_tokens=segment, step_token_budget=segment, checkpoint_interval_tokens=interval
        )
        turns = (turn,) if turn < first_len else ()
        async with make_scheduler(pool, config, stats_sink=sink) as sched:
            a = await run_one(sched, first, 4, turn_offsets=turns)
            record = pool.record(0).copy()
            second = (first + a.tokens + prompt_of(61, 8))[: min(diverge, first_len + 6)] + prompt_of(62, 40)
            before = pool.num_computed_tokens
            b = await run_one(sched, second, 4)
            await sched.check_integrity()
        return pool, a, b, second, record, turns, pool.num_computed_tokens - before

    pool, a, b, second, record, turns, computed = asyncio.run(run())
    points = {*(t for t in turns if t >= least), first_len - 1}
    if interval:
        points |= set(range(interval * -(-least // interval), first_len + 1, interval))
    want = expected_reuse(record, [first[:n] for n in points], second, least)
    assert b.finish.reuse.reused_tokens == want
    assert computed == len(second) - want + 3
    assert a.tokens == reference_greedy(pool, first, 4)
    assert b.tokens == reference_greedy(pool, second, 4)
