"""The scheduler on the real C engine with sliding-window rings: warm == cold token for token on
the tiny gemma3 fixture (window 16, a ring of 256 rows) and on Gemma 3 270M (real_model), with
the reuse source, the reused count and the tokens the engine computed asserted, so a path that
silently fell back to a cold prefill fails. Cold runs use a full-KV pool (swa_full): rings are
bit-identical to it (tests/engine/test_engine_ring.py).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from sched_support import CountingPool, RecordingSink, collect, make_config, make_request
from slotserve.scheduler.request import FinishReason, ReuseSource
from slotserve.scheduler.scheduler import Scheduler

SEGMENT = 32


class Model:
    def __init__(self, path, max_batch: int, n_vocab: int) -> None:
        from slotserve.engine_ext.loader import read_model

        self.path = path
        self.max_batch = max_batch
        self.model_file, self.tok = read_model(path)
        self.n_vocab = n_vocab

    def pool(self, num_slots: int, *, swa_full: bool = False, ctx_len: int = 2048) -> CountingPool:
        from slotserve.engine_ext.pool import SlotPool

        pool = SlotPool(
            self.model_file, num_slots, ctx_len, threads=2, max_batch_tokens=self.max_batch, swa_full=swa_full
        )
        return CountingPool(pool)

    def scheduler(self, pool, sink=None, **kw) -> Scheduler:
        kw.setdefault("segment_tokens", SEGMENT)
        kw.setdefault("step_token_budget", SEGMENT)
        kw.setdefault("checkpoint_memory_mb", 64)
        return Scheduler(
            pool,
            make_config(**kw),
            token_bytes=self.tok.token_bytes,
            eos_token_ids=self.tok.eos_token_ids,
            stats_sink=sink,
        )

    def ids(self, seed: int, n: int) -> list[int]:
        return [int(t) for t in np.random.default_rng(seed).integers(3, self.n_vocab, n)]

    async def cold(self, prompt, max_tokens: int) -> list[int]:
        pool = self.pool(1, swa_full=True)
        async with self.scheduler(pool) as sched:
            out = await collect(sched.submit(make_request(prompt, max_tokens)))
        assert out.finish.reuse.reused_tokens == 0 and out.finish.reason is FinishReason.LENGTH
        assert pool.num_computed_tokens == len(prompt) + max_tokens - 1
        return out.tokens


@pytest.fixture(scope="module")
def tiny(arch_model_factory) -> Model:
    return Model(arch_model_factory("gemma3"), max_batch=32, n_vocab=299)


async def run(sched, prompt, max_tokens: int, **kw):
    return await collect(sched.submit(make_request(prompt, max_tokens, **kw)))


async def test_multi_turn_and_abort_resend_past_the_window(tiny):
    pool = tiny.pool(1)
    assert pool.ring_len == 256 and pool.kv_window == 16
    turn1 = tiny.ids(1, 400)
    long = tiny.ids(2, 700)
    async with tiny.scheduler(pool, checkpoint_memory_mb=0) as sched:
        a = await run(sched, turn1, 6)
        turn2 = turn1 + a.tokens + tiny.ids(3, 120)
        before = pool.num_computed_tokens
        b = await run(sched, turn2, 6)
        assert (b.finish.reuse.source, b.finish.reuse.reused_tokens) == (ReuseSource.REWIND, 405)
        assert pool.num_computed_tokens - before == len(turn2) - 405 + 5
        # abort a prefill that has wrapped the ring, resend: the slot resumes where it stopped
        h = sched.submit(make_request(long, 5))

        def prefilling_long() -> bool:
            rec = pool.record(0)
            return 400 <= len(rec) <= 600 and list(rec[:8]) == long[:8]

        while not prefilling_long():
            await asyncio.sleep(0.001)
        assert await h.cancel() is True
        held = pool.slot_len(0)
        assert held > pool.ring_len and pool.min_truncate_len(0) > 0
        before = pool.num_computed_tokens
        c = await run(sched, long, 5)
        assert (c.finish.reuse.source, c.finish.reuse.reused_tokens) == (ReuseSource.REWIND, held)
        assert pool.num_computed_tokens - before == 700 - held + 4
        # a regenerated reply: cut back within the ring's reach
        before = pool.num_computed_tokens
        d = await run(sched, long, 5)
        assert (d.finish.reuse.source, d.finish.reuse.reused_tokens) == (ReuseSource.REWIND, 699)
        assert pool.num_computed_tokens - before == 1 + 4
        await sched.check_integrity()
    assert a.tokens == await tiny.cold(turn1, 6)
    assert b.tokens == await tiny.cold(turn2, 6)
    assert c.tokens == d.tokens == await tiny.cold(long, 5)


async def test_edit_of_an_early_turn_restores_the_checkpoint_below_it(tiny):
    pool = tiny.pool(1)
    sink = RecordingSink()
    async with tiny.scheduler(pool, sink, checkpoint_interval_tokens=128) as sched:
        conv: list[int] = []
        for i in range(4):
            conv = conv + tiny.ids(10 + i, 150)
            out = await run(sched, conv, 4)
            conv = conv + out.tokens
        edited = conv[:300] + tiny.ids(20, 60)  # diverges 300 tokens behind the end
        assert pool.min_truncate_len(0) > 300
        before = pool.num_computed_tokens
        e = await run(sched, edited, 5)
        await sched.check_integrity()
    # the best checkpoint at or below the divergence: the interval one at 256 (turn 2's prefill
    # crossed it; turn 1's prompt end at 150 and the interval one at 128 are lower)
    assert (e.finish.reuse.source, e.finish.reuse.reused_tokens) == (ReuseSource.CHECKPOINT_MEMORY, 256)
    assert pool.num_computed_tokens - before == len(edited) - 256 + 4
    last = sink.routes[-1]
    assert last.window_refused and last.window_recomputed_tokens == 300 - 256
    assert last.restore_reason is not None and last.restore_reason.value == "window"
    assert e.tokens == await tiny.cold(edited, 5)


async def test_one_system_prompt_shared_by_several_slots(tiny):
    pool = tiny.pool(3)
    system = tiny.ids(30, 150)
    prompts = [system + tiny.ids(31 + i, 300) for i in range(3)]
    async with tiny.scheduler(pool, capture_prompt_end=False) as sched:
        outs = [await run(sched, p, 4, prefix_hint=150) for p in prompts]
        await sched.check_integrity()
    # the first slot's ring is 300 tokens past the system prompt: no copy, the hint checkpoint
    assert [o.finish.reuse.source for o in outs] == [ReuseSource.NONE] + [ReuseSource.CHECKPOINT_MEMORY] * 2
    assert [o.finish.reuse.reused_tokens for o in outs] == [0, 150, 150]
    assert pool.num_computed_tokens == 450 + 2 * 300 + 3 * 3
    for p, o in zip(prompts, outs):
        assert o.tokens == await tiny.cold(p, 4)


async def test_an_evicted_conversation_comes_back_from_disk_after_a_restart(tiny, tmp_path):
    kw = dict(kv_disk_dir=str(tmp_path), kv_disk_space_mb=64, capture_prompt_end=False)
    conv = tiny.ids(40, 500)
    async with tiny.scheduler(tiny.pool(1), **kw) as sched:
        a = await run(sched, conv, 6)
        await run(sched, tiny.ids(41, 100), 2)  # overwrites the only slot: evict capture, on disk
    follow = conv + a.tokens + tiny.ids(42, 50)
    restarted = tiny.pool(1)
    async with tiny.scheduler(restarted, **kw) as sched:
        await sched.wait_ready()
        out = await run(sched, follow, 6)
        await sched.check_integrity()
    assert (out.finish.reuse.source, out.finish.reuse.reused_tokens) == (ReuseSource.CHECKPOINT_DISK, 505)
    assert restarted.num_computed_tokens == len(follow) - 505 + 5
    assert out.tokens == await tiny.cold(follow, 6)


@pytest.mark.real_model
async def test_gemma3_multi_turn_edit_and_resend_with_rings(gemma3_model_path):
    """Gemma 3 270M (window 512; max_batch 64 makes a ring of 768 rows, so a slot can be cut
    back 257 tokens): a conversation past the ring, an edit far behind its end, a resend."""
    g = Model(gemma3_model_path, max_batch=64, n_vocab=262144)
    pool = g.pool(1)
    assert (pool.ring_len, pool.kv_window) == (768, 512)
    sink = RecordingSink()
    async with g.scheduler(
        pool, sink, segment_tokens=64, step_token_budget=64, checkpoint_interval_tokens=256
    ) as s:
        turn1 = g.ids(1, 600)
        a = await run(s, turn1, 4)
        turn2 = turn1 + a.tokens + g.ids(2, 450)
        before = pool.num_computed_tokens
        b = await run(s, turn2, 4)
        assert (b.finish.reuse.source, b.finish.reuse.reused_tokens) == (ReuseSource.REWIND, 603)
        assert pool.num_computed_tokens - before == len(turn2) - 603 + 3
        # diverges at 780, before the slot's reach (1057 - 257 = 800): the interval checkpoint at
        # 768 (turn 2's prefill crossed it) beats turn 1's prompt end at 600
        assert pool.min_truncate_len(0) == 800
        edited = turn2[:780] + g.ids(3, 40)
        before = pool.num_computed_tokens
        e = await run(s, edited, 4)
        assert (e.finish.reuse.source, e.finish.reuse.reused_tokens) == (ReuseSource.CHECKPOINT_MEMORY, 768)
        assert pool.num_computed_tokens - before == len(edited) - 768 + 3
        assert sink.routes[-1].window_refused and sink.routes[-1].window_recomputed_tokens == 12
        before = pool.num_computed_tokens
        r = await run(s, edited, 4)  # resend: rewind within the ring
        assert (r.finish.reuse.source, r.finish.reuse.reused_tokens) == (ReuseSource.REWIND, len(edited) - 1)
        assert pool.num_computed_tokens - before == 1 + 3
        await s.check_integrity()
    assert b.tokens == await g.cold(turn2, 4)
    assert e.tokens == r.tokens == await g.cold(edited, 4)


@pytest.mark.real_model
async def test_gemma3_abort_shared_prompt_and_disk_restart_with_rings(gemma3_model_path, tmp_path):
    """Gemma 3 270M with rings of 768 rows: an aborted prefill past the ring resumes; a system
    prompt longer than the window is restored from its hint checkpoint, not copied from a slot
    whose ring moved past it; an evicted conversation comes back from disk after a restart."""
    g = Model(gemma3_model_path, max_batch=64, n_vocab=262144)
    kw = dict(segment_tokens=64, step_token_budget=64, capture_prompt_end=False)
    long = g.ids(50, 1000)
    system = g.ids(51, 600)
    shared = [system + g.ids(52 + i, 300) for i in range(2)]
    pool = g.pool(2)
    async with g.scheduler(pool, **kw) as s:
        h = s.submit(make_request(long, 4))

        def prefilling_long() -> bool:
            rec = pool.record(0)
            return 800 <= len(rec) <= 950 and list(rec[:8]) == long[:8]

        while not prefilling_long():
            await asyncio.sleep(0.002)
        assert await h.cancel() is True
        held = pool.slot_len(0)
        before = pool.num_computed_tokens
        a = await run(s, long, 4)
        assert (a.finish.reuse.source, a.finish.reuse.reused_tokens) == (ReuseSource.REWIND, held)
        assert pool.num_computed_tokens - before == 1000 - held + 3
        first = await run(s, shared[0], 4, prefix_hint=600)
        assert pool.min_truncate_len(first.finish.reuse.slot) > 600  # its ring moved past the prompt
        before = pool.num_computed_tokens
        second = await run(s, shared[1], 4, prefix_hint=600)
        assert (second.finish.reuse.source, second.finish.reuse.reused_tokens) == (
            ReuseSource.CHECKPOINT_MEMORY,
            600,
        )
        assert pool.num_computed_tokens - before == 300 + 3
        await s.check_integrity()
    disk = dict(kw, kv_disk_dir=str(tmp_path), kv_disk_space_mb=256)
    conv = g.ids(60, 900)
    async with g.scheduler(g.pool(1), **disk) as s:
        c = await run(s, conv, 6)
        await run(s, g.ids(61, 100), 2)  # overwrites the only slot: evict capture, on disk
    follow = conv + c.tokens + g.ids(62, 50)
    restarted = g.pool(1)
    async with g.scheduler(restarted, **disk) as s:
        await s.wait_ready()
        d = await run(s, follow, 4)
        await s.check_integrity()
    assert (d.finish.reuse.source, d.finish.reuse.reused_tokens) == (ReuseSource.CHECKPOINT_DISK, 905)
    assert restarted.num_computed_tokens == len(follow) - 905 + 3
    assert a.tokens == await g.cold(long, 4)
    assert second.tokens == await g.cold(shared[1], 4)
    assert d.tokens == await g.cold(follow, 4)
