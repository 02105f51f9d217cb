"""Disk checkpoint loads for queued requests, read on a background thread.

Design: when admission routes a queued request to a disk checkpoint it marks the request
`loading` and reports the load (`Admitted.disk_loads`); the scheduler starts it here. The file is
read off the event loop; when it is done the request's `loading` is cleared and, if it is still
queued, the loaded snapshot is staged on it (`staged_snapshot`, which routing then offers as the
disk tier's candidate), and `wake` asks the scheduler for a new schedule. A failed load only
loses the reuse: the request is routed again without it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .disk_store import DiskCheckpointStore
from .policy import CheckpointMatch
from .sequence import Phase, Sequence

log = logging.getLogger("slotserve.scheduler")


class DiskLoads:
    def __init__(self, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._tasks: set[asyncio.Task[None]] = set()  # loads in flight

    def start(self, disk: DiskCheckpointStore, seq: Sequence, match: CheckpointMatch) -> None:
        """Load `match` from `disk` for queued `seq` (call from the event loop)."""
        seq.loading = True

        async def load() -> None:
            try:
                loaded = await asyncio.to_thread(disk.load, match.key)
            except Exception:  # noqa: BLE001 - a failed load only loses the reuse
                log.exception("loading disk checkpoint %s failed", match.key)
                loaded = None
            seq.loading = False
            if loaded is not None and seq.phase is Phase.QUEUED:
                seq.staged_snapshot = loaded
            self._wake()

        task = asyncio.get_running_loop().create_task(load())
        self._tasks.add(task)  # keep a reference until done
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Wait for the loads in flight."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
