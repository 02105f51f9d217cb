"""Cancels at unplanned moments on the real C engine's recurrent state (the tiny qwen35 fixture):
requests on two slots cancelled after a random few milliseconds, so cancels land while the
worker computes a prefill segment or a decode step (segments of 1 to 16 tokens), with and
without a rollback ring (and drafts through it). After every round the scheduler's mirror
equals the pool, and each slot's record is what its state says: extending it (or cutting it
back inside its ring first) reuses exactly that (from the slot, or a copy of it) and answers as
a cold run does. A slot whose length or state were out of step with the tokens it claims would
answer differently."""

from __future__ import annotations

import asyncio
import random

import pytest
from real_sched_support import random_ids as ids
from real_sched_support import real_scheduler
from sched_support import collect, make_request
from slotserve.scheduler.request import ReuseSource

ROUNDS = 3
SEEDS = 8


@pytest.fixture(scope="module")
def qwen35_path(qwen35_model_factory):
    return qwen35_model_factory("Q8_0")


@pytest.mark.parametrize("rollback", [0, 9])
async def test_cancels_mid_prefill_leave_each_slot_extendable_and_exact(qwen35_path, rollback):
    from slotserve.engine_ext import SlotPool
    from slotserve.engine_ext.loader import open_model

    bundle = open_model(qwen35_path, num_slots=1, ctx_len=512, threads=1)
    tok, model = bundle.tokenizer, bundle.pool._model
    cold_pool = bundle.pool
    cold_cache: dict[tuple[int, ...], list[int]] = {}

    async def cold(prompt: list[int]) -> list[int]:
        key = tuple(prompt)
        if key not in cold_cache:
            cold_pool.truncate(0, 0)  # empty: the run is cold
            async with real_scheduler(cold_pool, tok, checkpoint_memory_mb=0) as sched:
                out = await collect(sched.submit(make_request(prompt, 4)))
            assert out.finish.reuse.reused_tokens == 0
            cold_cache[key] = out.tokens
        return cold_cache[key]

    mid_prefill = checked = 0
    for seed in range(SEEDS):
        rng = random.Random(seed)
        pool = SlotPool(model, 2, 512, threads=1, rollback=rollback)
        config = {
            "segment_tokens": rng.choice([1, 2, 5, 16]),
            "step_token_budget": 64,
            "checkpoint_memory_mb": rng.choice([0, 8]),
            "checkpoint_interval_tokens": 0,
            "draft_max": 8 if rollback else None,
        }
        async with real_scheduler(pool, tok, **config) as sched:
            for r in range(ROUNDS):
                prompt = ids(seed * 10 + r, rng.randint(20, 200))
                others = [ids(seed * 100 + r * 7 + i, 40) for i in range(rng.randint(0, 2))]
                handles = [sched.submit(make_request(p, rng.randint(1, 20))) for p in (prompt, *others)]
                await asyncio.sleep(rng.random() * 0.01)
                for h in handles:
                    if rng.random() < 0.8:
                        await h.cancel()
                for h in handles:
                    await collect(h)
                await sched.check_integrity()
                for s in range(2):
                    rec = [int(t) for t in pool.record(s)]
                    if 0 < len(rec) < len(prompt) and rec == prompt[: len(rec)]:
                        mid_prefill += 1  # a cancel landed inside the prompt's prefill
                    if not rec:
                        continue
                    cut = rng.randint(0, min(len(rec) - 1, rollback + 2))
                    keep = len(rec) - cut
                    exact = pool.min_truncate_len(s) <= keep  # the slot can give back `cut` rows
                    tail = ids(seed * 100 + r * 10 + s + 5000, 6)
                    if keep < len(rec) and tail[0] == rec[keep]:
                        tail[0] = 3 + (rec[keep] - 2) % 296  # diverge right at `keep`
                    follow = rec[:keep] + tail
                    out = await collect(sched.submit(make_request(follow, 4)))
                    if exact:
                        # the slot itself, or a copy of it into a free slot (a short record
                        # may be forked to keep the longer one): exactly `keep` tokens either way
                        assert out.finish.reuse.source in (ReuseSource.REWIND, ReuseSource.COPY), (
                            s,
                            keep,
                            out.finish.reuse,
                        )
                        assert out.finish.reuse.reused_tokens == keep
                        checked += 1
                    assert out.tokens == await cold(follow), (seed, r, s, keep, out.finish.reuse)
                    await sched.check_integrity()
    # the moments were random: make sure they did land inside prefills, and slots were extended
    assert mid_prefill >= 2, mid_prefill
    assert checked >= SEEDS, checked
