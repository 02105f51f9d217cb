"""A read-only or full --kv-disk-dir: the server keeps serving (same greedy answers as a server
without the disk tier), logs one warning, and leaves no partial file behind.

Read-only is a read-only tmpfs when the test may mount one (root with CAP_SYS_ADMIN), else a
directory without write permission (not root); full is a tmpfs filled to the last byte when it
may mount, else (and always in the `enospc` case) ENOSPC injected into the store's fsync.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from gateway_support import make_runtime, running_app, serve_config
from slotserve.gateway.app import create_app

pytestmark = pytest.mark.soak

MAX_REQUESTS = 400


def try_mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


def unmount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True)


@contextmanager
def read_only_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    root = tmp_path / "ro"
    if try_mount_tmpfs(root, "ro,size=1m"):
        try:
            yield root, "read-only tmpfs"
        finally:
            unmount(root)
    elif os.geteuid() != 0:
        root.chmod(0o500)
        try:
            yield root, "directory without write permission"
        finally:
            root.chmod(0o700)
    else:
        pytest.skip("root without mount rights: no way to make a directory read-only")


@contextmanager
def full_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, may_mount: bool = True
) -> Iterator[tuple[Path, str]]:
    root = tmp_path / "full"
    if may_mount and try_mount_tmpfs(root, "size=256k"):
        try:
            fd = os.open(root / "filler", os.O_WRONLY | os.O_CREAT)  # take every free byte
            try:
                while True:
                    os.write(fd, bytes(4096))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
            finally:
                os.close(fd)
            yield root, "full tmpfs"
        finally:
            unmount(root)
    else:
        from slotserve.scheduler import disk_store

        def no_space(fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

        monkeypatch.setattr(disk_store.os, "fsync", no_space)
        yield root, "ENOSPC injected at fsync"


@contextmanager
def enospc_injected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    with full_dir(tmp_path, monkeypatch, may_mount=False) as got:
        yield got


FAULTS = {"read_only": read_only_dir, "full": full_dir, "enospc": enospc_injected}


def conversation(i: int) -> dict:
    system = f"You are assistant number {i % 3}, and you answer every question briefly and kindly. " * 2
    return {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"Question {i}?"}],
        "max_tokens": 8,
        "temperature": 0,
    }


async def answers(app, deadline: float, limit: int) -> list[str]:
    out = []
    async with running_app(app) as client:
        for i in range(limit):
            if time.monotonic() > deadline and i >= 6:
                break
            r = await client.post("/v1/chat/completions", json=conversation(i))
            assert r.status_code == 200, r.text
            out.append(r.json()["choices"][0]["message"]["content"])
    return out


@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_the_server_keeps_serving_on_a_broken_disk(
    fault: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    soak_seconds: float,
) -> None:
    with FAULTS[fault](tmp_path, monkeypatch) as (root, how):
        runtime, pool = make_runtime(
            num_slots=1, ctx_len=1024, kv_disk_dir=str(root), kv_disk_space_mb=64, checkpoint_memory_mb=0
        )
        with caplog.at_level("WARNING", logger="slotserve.scheduler.disk"):
            got = await answers(
                create_app(runtime, serve_config()), time.monotonic() + soak_seconds / 2, MAX_REQUESTS
            )
        leftovers = [p.name for p in root.rglob("*") if p.name.endswith((".kvc", ".tmp"))]
    cold_runtime, _ = make_runtime(num_slots=1, ctx_len=1024, reuse=False)
    want = await answers(create_app(cold_runtime, serve_config()), time.monotonic() + 3600, len(got))
    warnings = [r.getMessage() for r in caplog.records if "serving continues without it" in r.getMessage()]
    print(f"\nsoak disk fault {fault} ({how}): {len(got)} requests served, warnings {warnings}")
    assert got == want
    assert len(warnings) == 1, warnings  # logged once, not per request
    assert leftovers == []  # no partial checkpoint left behind
    if fault != "read_only":
        assert pool.num_snapshots > 0  # the disk tier was tried (and failed), not skipped
