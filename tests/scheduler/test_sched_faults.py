"""Faults: an engine error in a step, an unusable or full disk directory, corrupt or foreign
checkpoint files, a damaged in-memory checkpoint."""

from __future__ import annotations

import asyncio
import errno
import logging

from sched_support import (
    RecordingSink,
    StepGate,
    cold_tokens,
    collect,
    make_config,
    make_pool,
    make_request,
    make_scheduler,
    prompt_of,
    run_one,
    wait_tokens,
)
from slotserve.scheduler.disk_store import DiskCheckpointStore
from slotserve.scheduler.request import FinishReason, ReuseSource


async def test_engine_error_fails_only_the_request_in_the_faulty_slot():
    pool = make_pool(2, 1024)
    sink = RecordingSink()
    pa, pb = prompt_of(1, 50), prompt_of(2, 60)
    async with make_scheduler(pool, stats_sink=sink) as sched:
        a = sched.submit(make_request(pa, 40))
        b = sched.submit(make_request(pb, 20))
        await wait_tokens(a, 3)
        pool._inject_fault(a.finish.reuse.slot if a.finish else 0)
        a_out = await collect(a)
        b_out = await collect(b)
        assert a_out.finish.reason is FinishReason.ERROR
        assert "injected fault" in a_out.finish.error
        assert b_out.finish.reason is FinishReason.LENGTH
        # the tainted slot counts as empty and serves the next request correctly
        assert sched.slots()[0].state == "empty" and sched.slots()[0].num_tokens == 0
        await sched.check_integrity()
        again = await run_one(sched, pa, 5)
    assert b_out.tokens == await cold_tokens(pb, 20)
    assert again.finish.reuse.source is ReuseSource.NONE  # nothing left to reuse
    assert again.tokens == await cold_tokens(pa, 5)
    assert [r.outcome for r in sink.requests].count("error") == 1


async def test_engine_error_during_prefill():
    pool = make_pool(1, 2048)
    gate = StepGate(pool, pause_at=2)
    prompt = prompt_of(3, 500)
    async with make_scheduler(pool, make_config(segment_tokens=100, step_token_budget=100)) as sched:
        h = sched.submit(make_request(prompt, 4))
        await gate.wait_reached()
        pool._inject_fault(0)  # the step after the one in flight fails
        gate.release.set()
        out = await collect(h)
        assert out.finish.reason is FinishReason.ERROR
        await sched.check_integrity()
        retry = await run_one(sched, prompt, 4)
    assert retry.finish.reuse.reused_tokens == 0  # the tainted rows were not trusted
    assert retry.tokens == await cold_tokens(prompt, 4)


async def test_unusable_disk_directory_logs_one_warning_and_serving_goes_on(tmp_path, caplog):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    config = make_config(kv_disk_dir=str(not_a_dir / "kv"), checkpoint_memory_mb=4)
    pool = make_pool(1, 1024)
    with caplog.at_level(logging.WARNING, logger="slotserve.scheduler.disk"):
        async with make_scheduler(pool, config) as sched:
            await sched.wait_ready()
            for i in range(3):
                out = await run_one(sched, prompt_of(10 + i, 100), 3, prefix_hint=80)
                assert out.finish.reason is FinishReason.LENGTH
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unusable" in warnings[0].getMessage()


async def test_full_disk_logs_one_warning_and_keeps_serving(tmp_path, caplog, monkeypatch):
    def no_space(self, path, parts):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(DiskCheckpointStore, "_write_file", no_space)
    config = make_config(kv_disk_dir=str(tmp_path), checkpoint_memory_mb=4)
    pool = make_pool(1, 1024)
    system = prompt_of(20, 100)
    with caplog.at_level(logging.WARNING, logger="slotserve.scheduler.disk"):
        async with make_scheduler(pool, config) as sched:
            outs = [
                await run_one(sched, system + prompt_of(21 + i, 30), 3, prefix_hint=100) for i in range(3)
            ]
            sched._ckpt.disk.flush()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "No space left" in warnings[0].getMessage()
    assert not list(tmp_path.rglob("*.kvc")) and not list(tmp_path.rglob("*.tmp"))
    assert [o.finish.reuse.reused_tokens for o in outs] == [0, 100, 100]


async def _write_one_checkpoint(tmp_path, system):
    config = make_config(kv_disk_dir=str(tmp_path), checkpoint_memory_mb=4)
    async with make_scheduler(make_pool(1, 1024), config) as sched:
        await run_one(sched, system + prompt_of(31, 20), 3, prefix_hint=len(system))
    (path,) = list(tmp_path.rglob("*.kvc"))
    return config, path


async def test_corrupt_checkpoint_file_is_removed_and_never_loaded(tmp_path):
    system = prompt_of(30, 150)
    config, path = await _write_one_checkpoint(tmp_path, system)
    raw = bytearray(path.read_bytes())
    raw[-10] ^= 0xFF  # damage the KV data: the header still parses
    path.write_bytes(bytes(raw))
    pool = make_pool(1, 1024)
    sink = RecordingSink()
    prompt = system + prompt_of(32, 20)
    async with make_scheduler(pool, config, stats_sink=sink) as sched:
        await sched.wait_ready()
        out = await run_one(sched, prompt, 4)
        await asyncio.sleep(0.01)
    assert out.finish.reuse.source is ReuseSource.NONE
    assert pool.num_restores == 0
    assert not path.exists()
    assert any(e.kind == "drop" and e.tier == "disk" for e in sink.checkpoints)
    assert out.tokens == await cold_tokens(prompt, 4)


async def test_foreign_and_garbage_files_are_removed_at_index_time(tmp_path):
    system = prompt_of(40, 150)
    config, path = await _write_one_checkpoint(tmp_path, system)
    garbage = path.with_name("0" * 32 + "-9.kvc")
    garbage.write_bytes(b"not a checkpoint")
    # the same file under a pool of another model: its fingerprint differs
    other = make_pool(1, 1024, model_id="other-model")
    foreign_dir = DiskCheckpointStore(tmp_path, 1 << 20, other.fingerprint).dir
    foreign_dir.mkdir(parents=True)
    (foreign_dir / path.name).write_bytes(path.read_bytes())
    async with make_scheduler(other, config) as sched:
        await sched.wait_ready()
        out = await run_one(sched, system + prompt_of(41, 10), 3)
    assert out.finish.reuse.source is ReuseSource.NONE and other.num_restores == 0
    assert not (foreign_dir / path.name).exists()
    assert path.exists()  # the first model's directory is not touched by another model
    pool = make_pool(1, 1024)
    async with make_scheduler(pool, config) as sched:
        await sched.wait_ready()
        out = await run_one(sched, system + prompt_of(42, 10), 3)
    assert not garbage.exists()
    assert out.finish.reuse.source is ReuseSource.CHECKPOINT_DISK and pool.num_restores == 1


async def test_damaged_memory_checkpoint_is_dropped_and_the_request_rerouted():
    pool = make_pool(1, 1024)
    config = make_config(checkpoint_memory_mb=4)
    a, b = prompt_of(50, 200), prompt_of(51, 200)
    async with make_scheduler(pool, config) as sched:
        await run_one(sched, a, 3)
        await run_one(sched, b, 3)  # evicts a's record into the memory store
        entries = sched._ckpt.memory.entries()
        victim = next(e for e in entries if e.tokens[0] == a[0])
        victim.data = victim.data[:-1] + bytes([victim.data[-1] ^ 0xFF])
        out = await run_one(sched, a, 3)
        await sched.check_integrity()
    assert out.finish.reuse.source is ReuseSource.NONE
    assert out.tokens == await cold_tokens(a, 3)
    assert pool.num_restores == 0


async def test_an_internal_error_fails_held_requests_and_refuses_new_ones(monkeypatch, caplog):
    import pytest
    from slotserve.scheduler.request import Draining
    from slotserve.scheduler.scheduler import Scheduler

    def broken(self, plan, result, now):
        raise RuntimeError("bug in apply")

    pool = make_pool(1, 512)
    sched = make_scheduler(pool)
    monkeypatch.setattr(Scheduler, "_apply", broken)
    with caplog.at_level(logging.ERROR, logger="slotserve.scheduler"):
        async with sched:
            out = await run_one(sched, prompt_of(60, 20), 3)
            assert out.finish.reason is FinishReason.ERROR
            with pytest.raises(Draining):
                sched.submit(make_request(prompt_of(61, 20), 3))
    assert any("scheduler loop failed" in r.getMessage() for r in caplog.records)


async def test_disk_checkpoint_the_pool_refuses_is_dropped_not_retried(tmp_path):
    # written by a server with a longer ctx_len (not part of the fingerprint): this pool's
    # restore refuses it, and the request must not keep reloading it
    system = prompt_of(33, 300)
    config, path = await _write_one_checkpoint(tmp_path, system)
    pool = make_pool(1, 256)
    sink = RecordingSink()
    prompt = system[:200] + prompt_of(34, 20)
    async with make_scheduler(pool, config, stats_sink=sink) as sched:
        await sched.wait_ready()
        out = await asyncio.wait_for(run_one(sched, prompt, 4), 10)
        await sched.check_integrity()
    assert out.finish.reason is FinishReason.LENGTH
    assert out.finish.reuse.source is ReuseSource.NONE and pool.num_restores == 0
    assert not path.exists()
    assert [e.kind for e in sink.checkpoints if e.tier == "disk"].count("drop") == 1
    assert out.tokens == await cold_tokens(prompt, 4)
