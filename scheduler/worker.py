"""The engine worker: one dedicated thread that runs every pool call, one job at a time.

Design: the event loop submits a callable with `await worker.run(fn, *args)`; the thread runs
it and resolves an asyncio future through `call_soon_threadsafe`, so the loop never blocks on
the engine and the pool is never entered from two threads. A job that was submitted always runs
to completion, even if the awaiting task is cancelled (the pool must not be left half-stepped).
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


_Job = tuple[Callable[..., Any], tuple[Any, ...], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]


class EngineWorker:
    def __init__(self, name: str = "slotserve-engine") -> None:
        self._name = name
        # (fn, args, loop, future) per job; None stops the thread
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
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
            fn, args, loop, fut = job
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                loop.call_soon_threadsafe(_settle, fut, False, exc)
            else:
                loop.call_soon_threadsafe(_settle, fut, True, result)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) on the worker thread and return its result (or raise its error)."""
        if self._thread is None:
            raise RuntimeError("EngineWorker.run before start()")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._jobs.put((fn, args, loop, fut))
        return await asyncio.shield(fut)

    def stop(self) -> None:
        """Finish queued jobs, then end the thread (blocking)."""
        if self._thread is None:
            return
        self._jobs.put(None)
        self._thread.join()
        self._thread = None
