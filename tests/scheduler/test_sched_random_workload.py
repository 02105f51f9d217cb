"""Randomised workloads on the fake engine, checked against its stateless reference model:
every token any request streams must be the cold greedy token, whatever mix of rewinds, copies,
checkpoint restores, preemptions and cancels served it."""

from __future__ import annotations

import asyncio
import random

import pytest
from sched_support import make_config, make_pool, make_request, make_scheduler, prompt_of, reference_greedy
from slotserve.scheduler.request import FinishReason, ReuseSource, TokenEvent


@pytest.mark.parametrize("seed", range(int(__import__("os").environ.get("SCHED_FUZZ_SEEDS", "20"))))
async def test_random_workload_streams_only_cold_tokens(seed, tmp_path):
    rng = random.Random(seed)
    pool = make_pool(rng.randint(1, 4), 1024, can_copy=rng.random() < 0.8, can_truncate=rng.random() < 0.9)
    config = make_config(
        max_queue=500,
        segment_tokens=rng.choice([8, 16, 64]),
        step_token_budget=rng.choice([16, 64, 128]),
        checkpoint_memory_mb=rng.choice([0, 0.02, 0.1, 1]),
        capture_prompt_end=rng.random() < 0.5,
        kv_disk_dir=str(tmp_path) if rng.random() < 0.3 else None,
        kv_disk_space_mb=0.1,
    )
    systems = [prompt_of(1000 * seed + k, rng.randint(10, 80)) for k in range(3)]
    convs = [rng.choice(systems) + prompt_of(2000 * seed + c, rng.randint(1, 40)) for c in range(8)]
    sources: set[ReuseSource] = set()
    checked = 0

    async def client(i: int) -> None:
        nonlocal checked
        c = rng.randrange(len(convs))
        prompt = list(convs[c])
        max_tokens = rng.randint(1, 8)
        handle = sched.submit(
            make_request(
                prompt,
                max_tokens,
                priority=rng.choice([0, 0, 1]),
                prefix_hint=len(prompt) // 2 if rng.random() < 0.3 else None,
            )
        )
        cancel_after = rng.choice([None, None, 0, 1, 2])
        got: list[int] = []
        async for ev in handle:
            if isinstance(ev, TokenEvent):
                got.extend(ev.token_ids)
                if cancel_after is not None and len(got) >= cancel_after:
                    await handle.cancel()
        want = reference_greedy(pool, prompt, max_tokens)
        assert got == want[: len(got)], f"request {i}: stream differs from the cold tokens"
        fin = handle.finish
        if fin.reason is FinishReason.LENGTH:
            assert got == want
            checked += 1
            convs[c] = prompt + got + prompt_of(3000 * seed + i, rng.randint(1, 30))
        if fin.reuse is not None:
            sources.add(fin.reuse.source)
            assert fin.reuse.reused_tokens + fin.reuse.prefilled_tokens == len(prompt)

    async with make_scheduler(pool, config) as sched:
        await sched.wait_ready()
        for wave in range(6):
            await asyncio.gather(*(client(10 * wave + j) for j in range(rng.randint(1, 8))))
        await sched.check_integrity()
        stats = sched.stats()
    assert stats.num_running == 0 and stats.queue_depth == 0
    assert checked > 0
    if pool._can_truncate and pool.num_slots > 1:  # else reuse needs luck (one slot, no cuts)
        assert sources - {ReuseSource.NONE}, "the workload never reused anything"
    assert pool.num_concurrent_calls == 0
