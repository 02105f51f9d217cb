"""Prefill order (scheduler/prefill_order.py): a request whose prompt is mostly reused overtakes
cold ones, for a free slot and for the step's prefill budget; aging bounds how long a cold one is
overtaken; FIFO keeps arrival order; tokens stay exact either way.

The scheduler runs on a ManualClock that never moves unless a test advances it, so virtual
deadlines (admission time + tokens left / aging rate) and hence every order are deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
from sched_support import (
    ForwardLog,
    ManualClock,
    RecordingSink,
    collect,
    make_config,
    make_pool,
    make_request,
    make_scheduler,
    prompt_of,
    reference_greedy,
    run_one,
    wait_tokens,
)
from slotserve.scheduler.config import SchedulerConfig
from slotserve.scheduler.policy import CheckpointMatch, CheckpointTier
from slotserve.scheduler.prefill_order import (
    AUTO_AGING_INITIAL,
    AUTO_AGING_SLOWDOWN,
    AgingRate,
    PrefillOrder,
    estimate_tokens_left,
    order_key,
)
from slotserve.scheduler.request import ReuseSource

SEGMENT = 64


def _config(order: PrefillOrder, **kw) -> SchedulerConfig:
    return make_config(segment_tokens=SEGMENT, step_token_budget=SEGMENT, prefill_order=order, **kw)


@pytest.mark.parametrize("order", list(PrefillOrder))
async def test_a_returning_turn_prefills_beside_a_cold_prompt_not_after_it(order):
    """A cold 448-token prompt (7 segments) and a returning turn (its slot holds all but 21
    tokens) are admitted in one step, the cold one first. By cost the returning turn's tail goes
    into the first step and its decode steps run beside the cold prefill's segments; FIFO feeds
    the cold prompt first and the returning turn waits for all 7 segments."""
    pool = make_pool(2, 1024)
    sink = RecordingSink()
    async with make_scheduler(pool, _config(order), stats_sink=sink, clock=ManualClock()) as sched:
        first_turn = prompt_of(1, 200)
        prev = await run_one(sched, first_turn, 4)
        returning = first_turn + prev.tokens + prompt_of(2, 20)
        cold = prompt_of(3, 7 * SEGMENT)
        log = ForwardLog(pool)
        h_cold = sched.submit(make_request(cold, 4))  # first in arrival order
        h_ret = sched.submit(make_request(returning, 4))
        out_cold, out_ret = await collect(h_cold), await collect(h_ret)
        await sched.check_integrity()
    assert out_ret.finish.reuse.source is ReuseSource.REWIND
    assert out_ret.finish.reuse.reused_tokens == len(first_turn) + 3  # the last reply token was never fed
    assert out_cold.finish.reuse.reused_tokens == 0
    ret_slot, cold_slot = out_ret.finish.reuse.slot, out_cold.finish.reuse.slot
    ret_done = log.prefill_done_at(ret_slot, len(returning))
    cold_done = log.prefill_done_at(cold_slot, len(cold))
    if order is PrefillOrder.COST:
        assert ret_done == 0
        assert log.calls[0] == [(ret_slot, len(returning) - 21, 21), (cold_slot, 0, SEGMENT - 21)]
        # the returning turn decodes in the steps that carry the cold prompt's segments
        assert (ret_slot, len(returning), 1) in log.calls[1] and (
            cold_slot,
            SEGMENT - 21,
            SEGMENT,
        ) in log.calls[1]
        assert cold_done > ret_done + 3  # it finished its 4 tokens while the cold prefill ran
    else:
        assert cold_done == 6 and ret_done == 7
        assert all(items == [(cold_slot, SEGMENT * i, SEGMENT)] for i, items in enumerate(log.calls[:7]))
    assert out_ret.tokens == reference_greedy(pool, returning, 4)
    assert out_cold.tokens == reference_greedy(pool, cold, 4)


@pytest.mark.parametrize("order", list(PrefillOrder))
async def test_a_returning_turn_takes_the_free_slot_ahead_of_a_cold_prompt(order):
    """Slot 1 decodes a long request; slot 0 holds a finished turn. A cold prompt and that
    conversation's next turn queue, the cold one first. By cost the returning turn gets slot 0
    (a rewind: 21 tokens to prefill) and the cold prompt waits; FIFO gives slot 0 to the cold
    prompt, which overwrites the finished turn, so the returning turn later prefills cold."""
    pool = make_pool(2, 1024)
    sink = RecordingSink()
    async with make_scheduler(pool, _config(order), stats_sink=sink, clock=ManualClock()) as sched:
        first_turn = prompt_of(11, 200)
        prev = await run_one(sched, first_turn, 4)
        assert prev.finish.reuse.slot == 0
        busy_prompt = prompt_of(12, 30)
        h_busy = sched.submit(make_request(busy_prompt, 40))
        await wait_tokens(h_busy, 1)  # slot 1 decodes from now on
        n_routes = len(sink.routes)
        returning = first_turn + prev.tokens + prompt_of(13, 20)
        cold = prompt_of(14, 300)
        h_cold = sched.submit(make_request(cold, 4))
        h_ret = sched.submit(make_request(returning, 4))
        out_cold, out_ret, out_busy = await collect(h_cold), await collect(h_ret), await collect(h_busy)
        await sched.check_integrity()
    routed = [r.reuse_source for r in sink.routes[n_routes:]]
    if order is PrefillOrder.COST:
        assert routed == [ReuseSource.REWIND, ReuseSource.NONE]
        assert out_ret.finish.reuse.reused_tokens == len(first_turn) + 3
    else:
        assert routed == [ReuseSource.NONE, ReuseSource.NONE]
        assert out_ret.finish.reuse.reused_tokens == 0
    assert out_cold.finish.reuse.reused_tokens == 0
    assert out_ret.tokens == reference_greedy(pool, returning, 4)
    assert out_cold.tokens == reference_greedy(pool, cold, 4)
    assert out_busy.tokens == reference_greedy(pool, busy_prompt, 40)[1:]  # wait_tokens took the first


@pytest.mark.parametrize(
    ("later_s", "expected"), [(1.0, ["short", "late", "cold"]), (5.0, ["short", "cold", "late"])]
)
async def test_aging_bounds_how_long_a_cold_prompt_is_overtaken(later_s, expected):
    """Aging at 100 tokens/s: a cold 400-token prompt's virtual deadline is 4 s after its
    admission, so a 21-token prompt admitted 1 s later still goes ahead of it, one admitted 5 s
    later no longer does. One slot, held by a decoding request while all three queue, so they
    are routed one after another in the order admission chose."""
    pool = make_pool(1, 1024)
    clock = ManualClock()
    config = _config(PrefillOrder.COST, prefill_aging_tokens_per_s=100.0)
    prompts = {"cold": prompt_of(21, 400), "short": prompt_of(22, 20), "late": prompt_of(23, 21)}
    first_segment = {min(len(p), SEGMENT): name for name, p in prompts.items()}  # 64, 20, 21
    async with make_scheduler(pool, config, clock=clock) as sched:
        h_busy = sched.submit(make_request(prompt_of(20, 30), 20))
        await wait_tokens(h_busy, 1)
        log = ForwardLog(pool)
        handles = {"cold": sched.submit(make_request(prompts["cold"], 2))}
        handles["short"] = sched.submit(make_request(prompts["short"], 2))
        clock.advance(later_s)
        handles["late"] = sched.submit(make_request(prompts["late"], 2))
        outs = {name: await collect(h) for name, h in handles.items()}
        await collect(h_busy)
        await sched.check_integrity()
    starts = [first_segment[n] for items in log.calls for _, p, n in items if p == 0]
    assert starts == expected
    for name, out in outs.items():
        assert out.finish.reuse.reused_tokens == 0
        assert out.tokens == reference_greedy(pool, prompts[name], 2)


def test_order_key_is_a_virtual_deadline_within_a_priority():
    def key(order, priority=0, at=0.0, n=0, left=0):
        return order_key(
            order,
            priority=priority,
            admitted_at=at,
            admission_order=n,
            tokens_left=left,
            aging_tokens_per_s=100.0,
        )

    cost, fifo = PrefillOrder.COST, PrefillOrder.FIFO
    assert key(cost, at=1.0, n=1, left=20) < key(cost, at=0.0, n=0, left=400)  # deadline 1.2 < 4.0
    assert key(cost, at=5.0, n=1, left=20) > key(cost, at=0.0, n=0, left=400)  # 5.2 > 4.0
    assert key(cost, n=0, left=20) < key(cost, n=1, left=20)  # equal deadlines: admission order
    assert key(cost, priority=1, left=4000) < key(cost, priority=0, left=1)  # priority first
    assert key(fifo, at=1.0, n=1, left=20) > key(fifo, at=0.0, n=0, left=400)


def test_estimate_counts_what_the_router_would_reuse():
    prompt = np.arange(100, dtype=np.int32)
    shares_60 = np.concatenate([prompt[:60], np.full(10, -1, np.int32)])
    holds_all = prompt.copy()
    assert estimate_tokens_left(prompt, [], []) == 100
    assert estimate_tokens_left(prompt, [(shares_60, 0)], []) == 40
    # an identical record supplies all but the last token (refed for its logits)
    assert estimate_tokens_left(prompt, [(shares_60, 0), (holds_all, 0)], []) == 1
    # a ring whose floor is past the common prefix cannot be cut back to it: supplies nothing
    assert estimate_tokens_left(prompt, [(shares_60, 65)], []) == 100
    ckpt = CheckpointMatch(CheckpointTier.MEMORY, "k", num_tokens=80, common=80)
    assert estimate_tokens_left(prompt, [(shares_60, 0)], [ckpt]) == 20


def test_auto_aging_rate_follows_the_measured_prefill_throughput():
    assert AgingRate(100.0).tokens_per_s == 100.0
    rate = AgingRate(None)
    assert rate.is_auto and rate.tokens_per_s == AUTO_AGING_INITIAL
    rate.observe(0, 0.5)  # a decode-only step says nothing about prefill
    assert rate.tokens_per_s == AUTO_AGING_INITIAL
    rate.observe(512, 1.0)
    assert rate.tokens_per_s == 512 / AUTO_AGING_SLOWDOWN
    rate.observe(1024, 1.0)  # earlier steps decay by 0.9 per step
    assert rate.tokens_per_s == pytest.approx((512 * 0.9 + 1024) / (0.9 + 1.0) / AUTO_AGING_SLOWDOWN)


async def test_the_scheduler_feeds_the_auto_rate_from_its_steps():
    pool = make_pool(1, 1024)
    async with make_scheduler(pool, _config(PrefillOrder.COST)) as sched:
        assert sched._aging.tokens_per_s == AUTO_AGING_INITIAL
        out = await run_one(sched, prompt_of(31, 100), 2)
        assert sched._aging.tokens_per_s != AUTO_AGING_INITIAL
    assert out.tokens == reference_greedy(pool, prompt_of(31, 100), 2)


def test_config_rejects_a_bad_order_or_rate():
    with pytest.raises(ValueError, match="prefill_aging_tokens_per_s"):
        SchedulerConfig(prefill_aging_tokens_per_s=0)
    with pytest.raises(ValueError, match="PrefillOrder"):
        SchedulerConfig(prefill_order="cost")  # type: ignore[arg-type]
