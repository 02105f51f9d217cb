"""The scheduler on the real C engine with the tiny mixture-of-experts fixtures
(gguf_fixtures.ARCH_MODELS["qwen3moe"], ["qwen2moe"], ["olmoe"]): a MoE FFN changes nothing in the pool
contract (its KV is an attention model's), so rewinds, copies and checkpoint restores reuse as
much as on a dense model and every warm answer equals a cold run token for token; the reuse
source and count and the tokens the engine computed are asserted."""

from __future__ import annotations

import asyncio

import pytest
from real_sched_support import cold_run, multi_turn_and_identical_repeat, real_scheduler
from real_sched_support import random_ids as ids
from sched_support import CountingPool, collect, make_request
from slotserve.scheduler.request import ReuseSource
from slotserve.scheduler.scheduler import Scheduler


@pytest.fixture(scope="module", params=["qwen3moe", "qwen2moe", "olmoe"])
def moe_path(request, arch_model_factory):
    return arch_model_factory(request.param)


@pytest.fixture
def open_pool(moe_path):
    from slotserve.engine_ext.loader import open_model

    def make(num_slots: int, ctx_len: int = 512):
        # two threads: a step's expert groups are split between them
        bundle = open_model(moe_path, num_slots=num_slots, ctx_len=ctx_len, threads=2)
        assert bundle.model_file.config.moe is not None
        return CountingPool(bundle.pool), bundle.tokenizer

    return make


def sched_for(pool, tok, **kw) -> Scheduler:
    kw.setdefault("segment_tokens", 32)
    return real_scheduler(pool, tok, **kw)


async def cold(open_pool, prompt, max_tokens) -> list[int]:
    return (await cold_run(open_pool, sched_for, prompt, max_tokens)).tokens


async def test_multi_turn_and_identical_repeat(open_pool):
    await multi_turn_and_identical_repeat(open_pool, sched_for, cold)


async def test_shared_prefix_copy_and_checkpoint_restore_equal_cold(open_pool):
    """Three prompts on one system prompt decode side by side (their rows share a step, so
    their experts are grouped together); then a checkpoint restore."""
    pool, tok = open_pool(3)
    system = ids(3, 100)
    prompts = [system + ids(10 + i, 12) for i in range(3)]
    async with sched_for(pool, tok, checkpoint_memory_mb=4) as sched:
        outs = await asyncio.gather(*(collect(sched.submit(make_request(p, 6))) for p in prompts))
        assert [o.finish.reuse.source for o in outs] == [ReuseSource.NONE] + [ReuseSource.COPY] * 2
        assert [o.finish.reuse.reused_tokens for o in outs] == [0, 100, 100]
        for i in range(3):  # replace every slot's record: the first prompt lives on as a checkpoint
            await collect(sched.submit(make_request(ids(40 + i, 90), 2)))
        before = pool.num_computed_tokens
        again = await collect(sched.submit(make_request(prompts[0], 6)))
        assert again.finish.reuse.source is ReuseSource.CHECKPOINT_MEMORY
        assert again.finish.reuse.reused_tokens == len(prompts[0]) - 1
        assert pool.num_computed_tokens - before == 1 + 5
        await sched.check_integrity()
    for p, o in zip(prompts, outs):
        assert o.tokens == await cold(open_pool, p, 6)
    assert again.tokens == outs[0].tokens
