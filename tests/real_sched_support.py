"""Set-up shared by the scheduler tests on the real C engine (tests/scheduler/
test_sched_real_engine*.py): a pool opener over a fixture file, a scheduler over a pool with its
tokenizer's bytes and EOS ids, seeded random prompts, and the cold run a warm answer is
compared with; and the scenarios that hold alike on more than one model."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from sched_support import CountingPool, collect, make_config, make_request
from slotserve.scheduler.request import FinishReason, ReuseSource, TokenEvent
from slotserve.scheduler.scheduler import Scheduler


def random_ids(seed: int, n: int, n_vocab: int = 299) -> list[int]:
    """n token ids in [3, n_vocab) drawn by a generator seeded with `seed` (the tiny fixtures'
    vocabulary has 299 tokens; 0..2 are the special ones)."""
    return [int(t) for t in np.random.default_rng(seed).integers(3, n_vocab, n)]


def pool_opener(
    path: Path | str, check: Callable[[Any], bool] | None = None
) -> Callable[..., tuple[CountingPool, Any]]:
    """`make(num_slots, ctx_len=512) -> (CountingPool, tokenizer)`: a fresh model opened from
    `path` on one thread each call; `check(pool)`, when given, is asserted (the layout under
    test is in use)."""
    from slotserve.engine_ext.loader import open_model

    def make(num_slots: int, ctx_len: int = 512) -> tuple[CountingPool, Any]:
        bundle = open_model(path, num_slots=num_slots, ctx_len=ctx_len, threads=1)
        if check is not None:
            assert check(bundle.pool), bundle.pool.fingerprint
        return CountingPool(bundle.pool), bundle.tokenizer

    return make


def real_scheduler(pool: Any, tok: Any, **kw: Any) -> Scheduler:
    """A scheduler over `pool` with `make_config(**kw)` and the tokenizer's bytes and EOS ids."""
    return Scheduler(pool, make_config(**kw), token_bytes=tok.token_bytes, eos_token_ids=tok.eos_token_ids)


async def cold_run(
    open_pool: Callable[..., tuple[CountingPool, Any]],
    sched_for: Callable[..., Scheduler],
    prompt: list[int],
    max_tokens: int,
    **kw: Any,
) -> Any:
    """`prompt` on a fresh one-slot pool (`sched_for(pool, tok, **kw)`): asserts that nothing was
    reused and that all `max_tokens` were generated; returns the collected output."""
    pool, tok = open_pool(1)
    async with sched_for(pool, tok, **kw) as sched:
        out = await collect(sched.submit(make_request(prompt, max_tokens)))
    assert out.finish.reuse.reused_tokens == 0 and out.finish.reason is FinishReason.LENGTH
    return out


# Scenarios whose rules hold alike on full KV and on lfm2's per-position conv rows (a slot cut
# back to any length): each test file runs them on its own model.


Cold = Callable[
    [Callable[..., Any], list[int], int], Awaitable[list[int]]
]  # a test file's cold(open_pool, prompt, n)


async def multi_turn_and_identical_repeat(
    open_pool: Callable[..., Any],
    sched_for: Callable[..., Scheduler],
    cold: Cold,
    resend_source: ReuseSource | None = None,
) -> None:
    """Turn 2 rewinds to turn 1's prompt and reply (all but the last reply token, 150 + 7);
    an identical resend reuses all but one token (from `resend_source` when given: a recurrent
    slot cannot rewind by one, it restores the prompt-end checkpoint); warm == cold for both."""
    pool, tok = open_pool(2)
    turn1 = random_ids(1, 150)
    async with sched_for(pool, tok) as sched:
        a = await collect(sched.submit(make_request(turn1, 8)))
        turn2 = turn1 + a.tokens + random_ids(2, 40)
        before = pool.num_computed_tokens
        b = await collect(sched.submit(make_request(turn2, 8)))
        assert b.finish.reuse.source is ReuseSource.REWIND
        assert b.finish.reuse.reused_tokens == 150 + 7
        assert pool.num_computed_tokens - before == len(turn2) - 157 + 7
        before = pool.num_computed_tokens
        c = await collect(sched.submit(make_request(turn2, 8)))
        assert (c.finish.reuse.reused_tokens, c.finish.reuse.prefilled_tokens) == (len(turn2) - 1, 1)
        if resend_source is not None:
            assert c.finish.reuse.source is resend_source
        assert pool.num_computed_tokens - before == 1 + 7
        await sched.check_integrity()
    assert a.tokens == await cold(open_pool, turn1, 8)
    assert b.tokens == c.tokens == await cold(open_pool, turn2, 8)


async def n_choices_fork_the_prompt_once(
    open_pool: Callable[..., Any], sched_for: Callable[..., Scheduler], cold: Cold
) -> None:
    """Three choices of one 120-token prompt on three slots: the prompt is computed once and
    forked (119 reused twice), and every choice equals the cold run."""
    pool, tok = open_pool(3)
    prompt = random_ids(60, 120)
    async with sched_for(pool, tok) as sched:
        outs = await asyncio.gather(*(collect(sched.submit(make_request(prompt, 6))) for _ in range(3)))
        await sched.check_integrity()
    assert sorted(o.finish.reuse.reused_tokens for o in outs) == [0, 119, 119]
    assert pool.num_computed_tokens == 120 + 2 * 1 + 3 * 5
    want = await cold(open_pool, prompt, 6)
    assert [o.tokens for o in outs] == [want] * 3


async def evicted_conversation_restored_from_disk(
    open_pool: Callable[..., Any], sched_for: Callable[..., Scheduler], cold: Cold, disk_dir: Path
) -> None:
    """A conversation captured to disk when a second prompt overwrites its only slot comes back
    in a new pool (a restart) at its full length: nothing computed before the request, the rest
    of the follow-up and the reply computed, warm == cold."""
    conv = random_ids(6, 150)
    kw = {"kv_disk_dir": str(disk_dir), "kv_disk_space_mb": 64, "capture_prompt_end": False}
    pool, tok = open_pool(1)
    async with sched_for(pool, tok, **kw) as sched:
        a = await collect(sched.submit(make_request(conv, 6)))
        await collect(sched.submit(make_request(random_ids(7, 90), 2)))  # overwrites it: captured on evict
    held = len(conv) + 5
    follow = conv + a.tokens + random_ids(8, 30)
    restarted, tok = open_pool(1)
    async with sched_for(restarted, tok, **kw) as sched:
        await sched.wait_ready()
        out = await collect(sched.submit(make_request(follow, 6)))
        await sched.check_integrity()
    assert out.finish.reuse.source is ReuseSource.CHECKPOINT_DISK
    assert out.finish.reuse.reused_tokens == held
    assert restarted.num_computed_tokens == len(follow) - held + 5
    assert out.tokens == await cold(open_pool, follow, 6)


async def shared_system_prompt_is_copied(
    open_pool: Callable[..., Any], sched_for: Callable[..., Scheduler], cold: Cold
) -> None:
    """Three prompts with one 100-token system prompt on three slots at once: the first computes
    it, the other two copy it (100 reused each), and every answer equals the cold run."""
    pool, tok = open_pool(3)
    system = random_ids(3, 100)
    prompts = [system + random_ids(10 + i, 12) for i in range(3)]
    async with sched_for(pool, tok) as sched:
        outs = await asyncio.gather(*(collect(sched.submit(make_request(p, 6))) for p in prompts))
        await sched.check_integrity()
    assert [o.finish.reuse.source for o in outs] == [ReuseSource.NONE] + [ReuseSource.COPY] * 2
    assert [o.finish.reuse.reused_tokens for o in outs] == [0, 100, 100]
    assert pool.num_computed_tokens == 112 + 2 * 12 + 3 * 5
    for p, o in zip(prompts, outs):
        assert o.tokens == await cold(open_pool, p, 6)


async def checkpoint_restore_and_abort_resend(
    open_pool: Callable[..., Any], sched_for: Callable[..., Scheduler], cold: Cold
) -> None:
    """One slot: a 120-token prompt's record is captured when a second prompt replaces it and
    restored when it comes back (119 reused, 1 + 5 computed); a stream aborted after its first
    token and resent prefills one token (89 reused); both answers equal the cold runs."""
    pool, tok = open_pool(1)
    a, b = random_ids(4, 120), random_ids(5, 90)
    async with sched_for(pool, tok, checkpoint_memory_mb=4) as sched:
        await collect(sched.submit(make_request(a, 4)))
        await collect(sched.submit(make_request(b, 4)))  # a's record is captured, then replaced
        before = pool.num_computed_tokens
        again = await collect(sched.submit(make_request(a, 6)))
        assert again.finish.reuse.source is ReuseSource.CHECKPOINT_MEMORY
        assert again.finish.reuse.reused_tokens == 119
        assert pool.num_computed_tokens - before == 1 + 5
        h = sched.submit(make_request(b, 50))  # abort a stream, resend it: one token of prefill
        async for ev in h:
            if isinstance(ev, TokenEvent):
                break
        assert await h.cancel() is True
        before = pool.num_computed_tokens
        resent = await collect(sched.submit(make_request(b, 6)))
        assert resent.finish.reuse.source in (ReuseSource.REWIND, ReuseSource.CHECKPOINT_MEMORY)
        assert (resent.finish.reuse.reused_tokens, resent.finish.reuse.prefilled_tokens) == (89, 1)
        assert pool.num_computed_tokens - before == 1 + 5
        await sched.check_integrity()
    assert again.tokens == await cold(open_pool, a, 6)
    assert resent.tokens == await cold(open_pool, b, 6)
