"""Set-up shared by the scheduler tests on the real C engine (tests/scheduler/
test_sched_real_engine*.py): a pool opener over a fixture file, a scheduler over a pool with its
tokenizer's bytes and EOS ids, seeded random prompts, and the cold run a warm answer is
compared with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sched_support import CountingPool, collect, make_config, make_request
from slotserve.scheduler.request import FinishReason
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
