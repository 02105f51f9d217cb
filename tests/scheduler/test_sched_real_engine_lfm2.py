"""The scheduler on the real C engine with the tiny lfm2 fixture (short convolutions beside
attention, gguf_fixtures.ARCH_MODELS["lfm2"]): its conv state is kept per position, so the
scheduler reuses as much as on full KV (rewinds to any divergence point, copies, checkpoint
restores, from disk after a restart, n > 1 forks) and every warm answer equals a cold run token
for token; the reuse source and count and the tokens the engine computed are asserted."""

from __future__ import annotations

import pytest
from real_sched_support import (
    checkpoint_restore_and_abort_resend,
    cold_run,
    evicted_conversation_restored_from_disk,
    multi_turn_and_identical_repeat,
    n_choices_fork_the_prompt_once,
    pool_opener,
    real_scheduler,
    shared_system_prompt_is_copied,
)
from real_sched_support import random_ids as ids
from sched_support import collect, make_request
from slotserve.scheduler.request import ReuseSource
from slotserve.scheduler.scheduler import Scheduler


@pytest.fixture(scope="module")
def lfm2_path(arch_model_factory):
    return arch_model_factory("lfm2")


@pytest.fixture
def open_pool(lfm2_path):
    # the convolution layout is in use
    return pool_opener(lfm2_path, check=lambda pool: pool.fingerprint.endswith("/conv_rows=3"))


def sched_for(pool, tok, **kw) -> Scheduler:
    kw.setdefault("segment_tokens", 32)
    return real_scheduler(pool, tok, **kw)


async def cold(open_pool, prompt, max_tokens) -> list[int]:
    return (await cold_run(open_pool, sched_for, prompt, max_tokens)).tokens


async def test_multi_turn_and_identical_repeat(open_pool):
    await multi_turn_and_identical_repeat(open_pool, sched_for, cold)


@pytest.mark.parametrize("edit_at", [1, 2, 3, 57])
async def test_an_edited_early_turn_rewinds_to_the_edit(open_pool, edit_at):
    """A resend that changes token edit_at: the slot is cut back to exactly edit_at tokens (also
    inside the convolution's 3-position reach of the start) and only the rest is prefilled."""
    pool, tok = open_pool(1)
    first = ids(20, 120)
    edited = list(first)
    edited[edit_at] = (edited[edit_at] + 1) % 296 + 3
    async with sched_for(pool, tok) as sched:
        await collect(sched.submit(make_request(first, 5)))
        before = pool.num_computed_tokens
        out = await collect(sched.submit(make_request(edited, 6)))
        assert out.finish.reuse.source is ReuseSource.REWIND
        assert out.finish.reuse.reused_tokens == edit_at
        assert pool.num_computed_tokens - before == len(edited) - edit_at + 5
        await sched.check_integrity()
    assert out.tokens == await cold(open_pool, edited, 6)


async def test_shared_system_prompt_is_copied(open_pool):
    await shared_system_prompt_is_copied(open_pool, sched_for, cold)


async def test_checkpoint_restore_and_abort_resend(open_pool):
    await checkpoint_restore_and_abort_resend(open_pool, sched_for, cold)


async def test_n_choices_fork_the_prompt_once(open_pool):
    await n_choices_fork_the_prompt_once(open_pool, sched_for, cold)


async def test_an_evicted_conversation_is_restored_from_disk_after_a_restart(open_pool, tmp_path):
    """The snapshot on disk carries the conv rows with the attention KV: a new pool (a restart)
    continues the conversation from it exactly."""
    await evicted_conversation_restored_from_disk(open_pool, sched_for, cold, tmp_path)
