"""The scheduler on the real C engine with the tiny recurrent fixtures, each test on both: qwen35
(Gated DeltaNet layers beside gated attention, gguf_fixtures.write_tiny_qwen35) and granitehybrid
(Mamba2 layers beside llama attention, gguf_fixtures_granite.write_tiny_granite). A recurrent
slot can only be extended, so
reuse is an exact extension of a live slot, a checkpoint restored at its own length, or a whole
slot forked; every warm answer equals a cold run token for token, and the reuse source and
count and the tokens the engine computed are asserted (the fake engine's tests of the same
rules: tests/scheduler/test_sched_recurrent.py)."""

from __future__ import annotations

import pytest
from real_sched_support import (
    cold_run,
    multi_turn_and_identical_repeat,
    n_choices_fork_the_prompt_once,
    real_scheduler,
)
from real_sched_support import random_ids as ids
from sched_support import CountingPool, StepGate, cancel_in_prefill_and_resend, collect, make_request
from slotserve.scheduler.request import ReuseSource
from slotserve.scheduler.scheduler import Scheduler

SEG = 16


@pytest.fixture(scope="module", params=["qwen35", "granitehybrid"])
def recurrent_path(request):
    factory = "qwen35_model_factory" if request.param == "qwen35" else "granite_model_factory"
    return request.param, request.getfixturevalue(factory)("Q8_0")


@pytest.fixture
def open_pool(recurrent_path):
    arch, path = recurrent_path
    from slotserve.engine_ext import SlotPool
    from slotserve.engine_ext.loader import open_model

    def make(num_slots: int, ctx_len: int = 512, rollback: int = 0):
        bundle = open_model(path, num_slots=num_slots, ctx_len=ctx_len, threads=1)
        pool = bundle.pool
        if rollback:
            pool = SlotPool(pool._model, num_slots, ctx_len, threads=1, rollback=rollback)
        assert pool.recurrent and "/recurrent=" in pool.fingerprint  # the recurrent layout is in use
        assert pool._model.config.arch == arch
        return CountingPool(pool), bundle.tokenizer

    make.model_path = path  # type: ignore[attr-defined]  # cold()'s cache key: one per fixture
    return make


def sched_for(pool, tok, **kw) -> Scheduler:
    kw.setdefault("segment_tokens", SEG)
    kw.setdefault("step_token_budget", SEG)
    kw.setdefault("checkpoint_memory_mb", 8)
    kw.setdefault("checkpoint_interval_tokens", 0)
    return real_scheduler(pool, tok, **kw)


def reuse(out) -> tuple[ReuseSource, int]:
    return out.finish.reuse.source, out.finish.reuse.reused_tokens


_COLD: dict[tuple, list[int]] = {}


async def cold(open_pool, prompt, max_tokens) -> list[int]:
    key = (open_pool.model_path, tuple(prompt), max_tokens)
    if key not in _COLD:
        out = await cold_run(open_pool, sched_for, prompt, max_tokens, checkpoint_memory_mb=0)
        assert reuse(out) == (ReuseSource.NONE, 0) and len(out.tokens) == max_tokens
        _COLD[key] = out.tokens
    return _COLD[key]


async def test_multi_turn_extends_the_live_slot_and_a_resend_restores_the_prompt_end(open_pool):
    await multi_turn_and_identical_repeat(open_pool, sched_for, cold, ReuseSource.CHECKPOINT_MEMORY)


async def test_abort_during_prefill_then_resend_extends_what_was_computed(open_pool):
    pool, tok = open_pool(1)
    prompt = ids(20, 200)
    gate = StepGate(pool, pause_at=6)  # 5 segments of 16 tokens done, the 6th in flight
    held = 6 * SEG
    async with sched_for(pool, tok, checkpoint_memory_mb=0) as sched:
        out, computed = await cancel_in_prefill_and_resend(sched, pool, gate, prompt, 6, held)
    assert reuse(out) == (ReuseSource.REWIND, held)
    assert computed == (200 - held) + 5
    assert out.tokens == await cold(open_pool, prompt, 6)


async def test_n_choices_fork_the_prompt_once(open_pool):
    await n_choices_fork_the_prompt_once(open_pool, sched_for, cold)


async def test_a_system_prompt_shared_by_slots_is_restored_from_its_hint_capture(open_pool):
    pool, tok = open_pool(3)
    system = ids(40, 100)
    prompts = [system + ids(41 + i, 30) for i in range(3)]
    async with sched_for(pool, tok, capture_prompt_end=False) as sched:
        outs = [await collect(sched.submit(make_request(p, 4, prefix_hint=100))) for p in prompts]
        await sched.check_integrity()
    assert reuse(outs[0]) == (ReuseSource.NONE, 0)
    for o in outs[1:]:
        assert reuse(o) == (ReuseSource.CHECKPOINT_MEMORY, 100)
    assert pool.num_computed_tokens == 3 * 30 + 100 + 3 * 3
    for p, o in zip(prompts, outs):
        assert o.tokens == await cold(open_pool, p, 4)


async def test_a_rollback_ring_lets_a_regenerate_rewind_the_live_slot(open_pool):
    pool, tok = open_pool(1, rollback=8)
    prompt = ids(23, 100)
    async with sched_for(pool, tok, checkpoint_memory_mb=0) as sched:
        await collect(sched.submit(make_request(prompt, 6)))
        assert pool.min_truncate_len(0) == 105 - 8
        before = pool.num_computed_tokens
        out = await collect(sched.submit(make_request(prompt, 6)))
        await sched.check_integrity()
    assert reuse(out) == (ReuseSource.REWIND, 99)
    assert pool.num_computed_tokens - before == 1 + 5
    assert out.tokens == await cold(open_pool, prompt, 6)
