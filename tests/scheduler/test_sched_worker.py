"""The engine worker's hand-off: a submitted job is taken before `submit` returns, and an ack
whose wait timed out never satisfies a later wait."""

from __future__ import annotations

import asyncio
import threading

import pytest
from slotserve.scheduler.worker import EngineWorker


@pytest.fixture
def worker():
    w = EngineWorker(pickup_timeout_s=30.0)
    w.start()
    yield w
    w.stop()


async def test_submit_returns_once_the_worker_took_the_job(worker):
    for i in range(50):
        fut = worker.submit(lambda k: k * 2, i)
        assert worker._jobs.empty()  # taken (and acknowledged) before submit returned
        assert await fut == 2 * i


async def test_a_timed_out_ack_does_not_end_a_later_wait_early():
    w = EngineWorker(pickup_timeout_s=0.01)
    w.start()
    try:
        release = threading.Event()
        blocker = w.submit(release.wait, 30.0)  # the worker is busy until released
        late = w.submit(lambda: "late")  # its wait for the busy worker times out
        release.set()
        assert await blocker is True and await late == "late"  # late's ack is now queued, stale
        w._pickup_timeout_s = 30.0
        last = w.submit(lambda: "last")
        assert w._jobs.empty()  # waited for its own ack, not the stale one
        assert await last == "last"
        assert w._taken.empty()  # every ack was consumed by a wait
    finally:
        w.stop()


async def test_errors_reach_the_awaiting_task_and_a_cancelled_wait_still_runs_the_job(worker):
    def boom() -> None:
        raise ValueError("bad step")

    with pytest.raises(ValueError, match="bad step"):
        await worker.run(boom)
    ran = threading.Event()
    release = threading.Event()

    def job() -> str:
        release.wait(30.0)
        ran.set()
        return "done"

    task = asyncio.ensure_future(worker.run(job))
    await asyncio.sleep(0)  # the task submitted and awaits
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    assert await worker.run(lambda: ran.is_set()) is True  # jobs run one at a time, in order
