"""Captures and routing around recurrent state on the real C engine with the tiny qwen35
fixture and the tiny granitehybrid one (Mamba2 state; the basic reuse paths:
test_sched_real_engine_recurrent.py): an edited early turn restores
the turn capture below the divergence, an evicted conversation comes back from disk after a
restart, a cancel mid-decode leaves the slot extendable, and a Hypothesis property checks the
reuse against a brute-force oracle of the capture rules; every warm answer equals a cold run
token for token, with the reuse source and count and the tokens the engine computed asserted."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from real_sched_support import (
    cold_run,
    evicted_conversation_restored_from_disk,
    pool_opener,
    real_scheduler,
)
from real_sched_support import random_ids as ids
from sched_support import collect, make_config, make_request
from slotserve.scheduler.prefix import common_prefix_len as _lcp
from slotserve.scheduler.request import ReuseSource, TokenEvent
from slotserve.scheduler.scheduler import Scheduler


@pytest.fixture(scope="module", params=["qwen35", "granitehybrid"])
def recurrent_path(request, qwen35_model_factory, granite_model_factory):
    """The tiny qwen35 or granitehybrid fixture."""
    if request.param == "granitehybrid":
        return granite_model_factory("Q8_0")
    return qwen35_model_factory("Q8_0")


@pytest.fixture
def open_pool(recurrent_path):
    # the recurrent layout is in use
    return pool_opener(recurrent_path, check=lambda pool: "/recurrent=" in pool.fingerprint)


def sched_for(pool, tok, **kw) -> Scheduler:
    kw.setdefault("segment_tokens", 32)
    kw.setdefault("checkpoint_memory_mb", 16)
    kw.setdefault("checkpoint_interval_tokens", 0)
    return real_scheduler(pool, tok, **kw)


def common_prefix_len(a, b) -> int:
    return _lcp(np.asarray(a, np.int32), np.asarray(b, np.int32))


def reuse(out) -> tuple[ReuseSource, int]:
    return out.finish.reuse.source, out.finish.reuse.reused_tokens


async def cold(open_pool, prompt, max_tokens) -> list[int]:
    return (await cold_run(open_pool, sched_for, prompt, max_tokens, checkpoint_memory_mb=0)).tokens


async def test_an_edited_early_turn_restores_the_turn_start(open_pool):
    pool, tok = open_pool(1)
    async with sched_for(pool, tok) as sched:
        conv: list[int] = []
        assistant: list[int] = []
        for i in range(4):
            user = len(conv)
            conv = conv + ids(30 + i, 70)
            turns = tuple(t for t in (*assistant, user) if t > 0)
            out = await collect(sched.submit(make_request(conv, 4, turn_offsets=turns)))
            assistant.append(len(conv))
            conv = conv + out.tokens
        edited = conv[:100] + ids(99, 40)  # diverges inside turn 2's user message (from 74)
        before = pool.num_computed_tokens
        out = await collect(sched.submit(make_request(edited, 5)))
        assert reuse(out) == (ReuseSource.CHECKPOINT_MEMORY, 74)
        assert pool.num_computed_tokens - before == len(edited) - 74 + 4
        await sched.check_integrity()
    assert out.tokens == await cold(open_pool, edited, 5)


async def test_an_evicted_conversation_is_restored_from_disk_after_a_restart(open_pool, tmp_path):
    await evicted_conversation_restored_from_disk(open_pool, sched_for, cold, tmp_path)


async def test_a_cancel_mid_decode_leaves_the_slot_extendable(open_pool):
    pool, tok = open_pool(1)
    prompt = ids(9, 80)
    async with sched_for(pool, tok, checkpoint_memory_mb=0) as sched:
        h = sched.submit(make_request(prompt, 50))
        got: list[int] = []
        async for ev in h:
            if isinstance(ev, TokenEvent):
                got.extend(ev.token_ids)
                if len(got) >= 3:
                    break
        assert await h.cancel() is True
        record = list(pool.record(0))
        follow = record + ids(10, 20)
        before = pool.num_computed_tokens
        out = await collect(sched.submit(make_request(follow, 4)))
        assert reuse(out) == (ReuseSource.REWIND, len(record))
        assert pool.num_computed_tokens - before == 20 + 3
        await sched.check_integrity()
    assert out.tokens == await cold(open_pool, follow, 4)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    segment=st.integers(1, 40),
    diverge=st.integers(0, 130),
    interval=st.sampled_from([0, 32]),
    turn=st.integers(1, 119),
)
def test_routing_reuses_what_the_oracle_says_and_stays_exact(open_pool, segment, diverge, interval, turn):
    """Two prompts on one slot of the real pool; the second diverges from the first prompt + its
    reply at `diverge`. The oracle: the live slot only as an exact extension, and the checkpoints
    the capture rules place (turn offset, prompt end less one, every `interval` tokens), each
    only at its own length; the answers equal the cold ones of the same prompts."""
    first = ids(60, 120)
    least = make_config().min_checkpoint_tokens

    async def run() -> tuple:
        pool, tok = open_pool(1)
        kw = {"segment_tokens": segment, "step_token_budget": segment, "checkpoint_interval_tokens": interval}
        async with sched_for(pool, tok, **kw) as sched:
            a = await collect(sched.submit(make_request(first, 4, turn_offsets=(turn,))))
            record = list(pool.record(0))
            second = (first + a.tokens + ids(61, 8))[: min(diverge, 126)] + ids(62, 30)
            before = pool.num_computed_tokens
            b = await collect(sched.submit(make_request(second, 4)))
            await sched.check_integrity()
        return a, b, second, record, pool.num_computed_tokens - before

    a, b, second, record, computed = asyncio.run(run())
    points = {*((turn,) if turn >= least else ()), len(first) - 1}
    if interval:
        points |= set(range(interval * -(-least // interval), len(first) + 1, interval))
    L = len(second)
    u_live = min(common_prefix_len(second, record), L - 1)
    want = u_live if u_live >= len(record) else 0
    for n in points:
        u = min(common_prefix_len(second, first[:n]), L - 1)
        if u >= least and u >= n:
            want = max(want, u)
    assert b.finish.reuse.reused_tokens == want
    assert computed == L - want + 3
    assert b.tokens == asyncio.run(cold(open_pool, second, 4))
    assert a.tokens == asyncio.run(cold(open_pool, first, 4))
