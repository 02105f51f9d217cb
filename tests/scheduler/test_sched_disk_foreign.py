"""The disk tier and the checkpoints of other models or KV layouts beside its own folder: they
count against --kv-disk-space-mb and are removed oldest first when it is exceeded (before any of
this pool's own), with a log line; nothing else under --kv-disk-dir is touched."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest
from slotserve.scheduler import checkpoint_store as ck
from slotserve.scheduler.disk_store import _MAGIC, DiskCheckpointStore

KIB = 1024


def fake_checkpoints(folder: Path, sizes_kib: list[int], first_mtime: float) -> list[Path]:
    """Files that look like another model's checkpoints (magic + padding), one second apart in
    age starting at `first_mtime`, in the order given."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, size in enumerate(sizes_kib):
        path = folder / f"{i:032x}-{size}.kvc"
        path.write_bytes(_MAGIC + bytes(size * KIB - len(_MAGIC)))
        os.utime(path, (first_mtime + i, first_mtime + i))
        paths.append(path)
    return paths


def started(root: Path, space_bytes: int, fingerprint: str = "fp-this") -> tuple[DiskCheckpointStore, list]:
    d = DiskCheckpointStore(root, space_bytes, fingerprint)
    events: list[tuple[str, str, int, int]] = []
    d.on_event = lambda *e: events.append(e)
    d.start()
    assert d.index_ready.wait(10)
    return d, events


def toks(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 250, n).astype(np.int32)


@pytest.fixture()
def other_models(tmp_path: Path) -> dict[str, list[Path]]:
    """Two foreign folders (older A, newer B) of 4 x 10 KiB each, plus things that are not ours."""
    now = time.time()
    files = {
        "a": fake_checkpoints(tmp_path / "00000000000000aa", [10] * 4, now - 1000),
        "b": fake_checkpoints(tmp_path / "00000000000000bb", [10] * 4, now - 500),
    }
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "x.kvc").write_bytes(_MAGIC + bytes(50 * KIB))  # not a model-id folder
    (tmp_path / "00000000000000aa" / "README").write_text("mine")  # not a checkpoint
    (tmp_path / "00000000000000bb" / "bogus.kvc").write_bytes(bytes(30 * KIB))  # no magic
    return files


def untouched(root: Path) -> None:
    assert (root / "notes" / "x.kvc").exists()
    assert (root / "00000000000000aa" / "README").exists()
    assert (root / "00000000000000bb" / "bogus.kvc").exists()


def test_foreign_checkpoints_under_the_budget_are_kept_and_counted(tmp_path: Path, other_models) -> None:
    d, events = started(tmp_path, 1 << 20)
    assert d.foreign_bytes == 80 * KIB and d.bytes_used == 0
    assert all(p.exists() for ps in other_models.values() for p in ps)
    assert events == []
    untouched(tmp_path)
    d.close()


def test_at_start_foreign_checkpoints_past_the_budget_go_oldest_first(
    tmp_path: Path, other_models, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="slotserve.scheduler.disk"):
        d, events = started(tmp_path, 55 * KIB)  # 80 KiB found: the 3 oldest (all of A's but one) go
    a, b = other_models["a"], other_models["b"]
    assert [p.exists() for p in a] == [False, False, False, True]
    assert all(p.exists() for p in b)
    assert d.foreign_bytes == 50 * KIB
    assert [(e[0], e[2]) for e in events] == [("drop", 10 * KIB)] * 3
    removed = [
        r.getMessage() for r in caplog.records if "removed checkpoints of other models" in r.getMessage()
    ]
    assert len(removed) == 1 and "00000000000000aa/ 3 files (0.0 MiB)" in removed[0]
    untouched(tmp_path)
    d.close()


def test_writes_make_room_by_removing_foreign_files_before_their_own(tmp_path: Path, other_models) -> None:
    d, _ = started(tmp_path, 100 * KIB)
    own = []
    for i in range(2):  # each checkpoint ~ 30 KiB: 80 + 60 > 100, so 5 foreign files must go
        t = toks(i, 64)
        d.put(t, bytes(30 * KIB), "hint")
        d.flush()
        own.append(ck.tokens_key(t))
        time.sleep(0.01)
    assert all(d.contains(toks(i, 64)) for i in range(2))  # none of its own was evicted
    assert d.bytes_used + d.foreign_bytes <= 100 * KIB
    left = sorted(p.name for ps in other_models.values() for p in ps if p.exists())
    # the oldest went first: all of A, then B's oldest
    assert not any(p.exists() for p in other_models["a"])
    assert left == sorted(p.name for p in other_models["b"][1:])
    assert not (tmp_path / "00000000000000aa" / other_models["a"][0].name).exists()
    assert (tmp_path / "00000000000000aa").exists()  # README keeps the folder: not removed
    untouched(tmp_path)
    d.close()
    # a restart finds the same state and does not remove anything more
    d2, events = started(tmp_path, 100 * KIB)
    assert len(d2) == 2 and events == []
    d2.close()


def test_an_emptied_foreign_folder_is_removed(tmp_path: Path) -> None:
    fake_checkpoints(tmp_path / "0123456789abcdef", [10, 10], time.time() - 100)
    d, _ = started(tmp_path, 5 * KIB)
    assert not (tmp_path / "0123456789abcdef").exists()
    assert d.foreign_bytes == 0 and d.dir.exists()
    d.close()


def test_a_shrunk_budget_evicts_own_checkpoints_at_start(tmp_path: Path) -> None:
    d, _ = started(tmp_path, 1 << 20)
    for i in range(4):
        d.put(toks(i, 64), bytes(20 * KIB), "evict")
        d.flush()
        time.sleep(0.01)
    d.close()
    d2, events = started(tmp_path, 50 * KIB)
    assert len(d2) == 2 and d2.bytes_used <= 50 * KIB
    assert d2.contains(toks(3, 64)) and d2.contains(toks(2, 64))  # the newest stay
    assert [e[0] for e in events] == ["evict", "evict"]
    d2.close()
