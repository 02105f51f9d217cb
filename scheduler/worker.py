"""The engine worker: one dedicated thread that runs every pool call, one job at a time.

Design: the event loop submits a callable with `await worker.run(fn, *args)`; the thread runs
it and resolves an asyncio future through `call_soon_threadsafe`, so the loop never blocks on
the engine and the pool is never entered from two threads. A job that was submitted always runs
to completion, even if the awaiting task is cancelled (the pool must not be left half-stepped).

The hand-off of one step (both threads need the GIL for their Python; the engine releases it
while it computes):

    worker: done -> call_soon_threadsafe -> (asks for the GIL) ...> take job, ack -> fn: compute
    loop:           wakes: apply, schedule -> put job, wait for ack -^ -> SSE writes, HTTP, stats

A decode chain (chain.py) is one job that runs many steps: the worker picks each step's tokens
and starts the next forward itself, handing each step to the loop with `call_soon_threadsafe`,
so while it lasts the only hand-off per step is worker -> loop, off the critical path:

    worker: done -> pick, publish ---------------------------> forward N+1 (compute) ...
    loop:                  wakes: apply N, SSE writes, HTTP (while N+1 computes)

NOTE: `submit` blocks the loop (GIL released) until the worker has taken the job, at most
`pickup_timeout_s`. Without that wait the worker, which asked for the GIL while the loop held
it, would get it only when the loop next sleeps in its selector: after every stream's SSE
write of the step, so that Python work would run between engine steps instead of during one
(CPython hands a released GIL back to the thread that released it unless the waiter has waited
a whole switch interval). With it the loop's per-step work overlaps the engine's compute. The
wait is short: the worker is idle whenever the loop submits (jobs come one at a time).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any


def _settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.cancelled():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


_Job = tuple[int, Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]

PICKUP_TIMEOUT_S = 0.005  # longest the loop blocks for the worker to take a job (NOTE above)


class EngineWorker:
    def __init__(self, name: str = "slotserve-engine", pickup_timeout_s: float = PICKUP_TIMEOUT_S) -> None:
        self._name = name
        self._pickup_timeout_s = pickup_timeout_s
        # (seq, fn, args, loop, future) per job; None stops the thread
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._taken: queue.SimpleQueue[int] = queue.SimpleQueue()  # seq of each job as it is taken
        self._seq = 0  # jobs submitted
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            seq, fn, args, loop, fut = job
            self._taken.put(seq)
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                loop.call_soon_threadsafe(_settle, fut, False, exc)
            else:
                loop.call_soon_threadsafe(_settle, fut, True, result)

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Queue fn(*args) for the worker thread and return the future of its result (or
        error). Blocks the calling loop until the worker took the job, at most
        pickup_timeout_s (module docstring); call from the loop's thread."""
        if self._thread is None:
            raise RuntimeError("EngineWorker.submit before start()")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._seq += 1
        self._jobs.put((self._seq, fn, args, loop, fut))
        self._wait_taken(self._seq)
        # NOTE: not shielded: cancelling the awaiting task cancels `fut`, which only drops the
        # result (`_settle`); the job itself still runs to completion on the worker.
        return fut

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) on the worker thread and return its result (or raise its error)."""
        return await self.submit(fn, *args)

    def _wait_taken(self, seq: int) -> None:
        """Block (GIL released) until the worker took job `seq` or the timeout passed; acks of
        earlier jobs whose wait timed out are skipped."""
        try:
            while self._taken.get(timeout=self._pickup_timeout_s) < seq:
                pass
        except queue.Empty:
            pass

    def stop(self) -> None:
        """Finish queued jobs, then end the thread (blocking)."""
        if self._thread is None:
            return
        self._jobs.put(None)
        self._thread.join()
        self._thread = None
