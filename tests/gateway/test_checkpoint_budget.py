"""The default checkpoint budget: 1/8 of the available memory, clamped to 256..4096 MiB, read
from /proc/meminfo and the cgroup v2 limit (fake files here); --checkpoint-memory-mb wins."""

from __future__ import annotations

from pathlib import Path

import pytest
from slotserve.gateway import checkpoint_budget as cb
from slotserve.gateway.config import ServeConfig
from slotserve.gateway.runtime import scheduler_config

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("available_mib", "expected_mb"),
    [
        (None, 256),  # unknown: the floor
        (1024, 256),  # 1/8 is 128: the floor
        (2048, 256),  # exactly the floor
        (8192, 1024),
        (8192 + 7, 1024),  # rounded down
        (32 * 1024, 4096),  # exactly the cap
        (256 * 1024, 4096),  # capped
    ],
)
def test_default_is_an_eighth_clamped(available_mib: int | None, expected_mb: int):
    available = None if available_mib is None else available_mib * MIB
    assert cb.default_checkpoint_memory_mb(available) == expected_mb


def write_meminfo(tmp_path: Path, available_kb: int) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       99999999 kB\nMemFree:  1 kB\nMemAvailable:   {available_kb} kB\n")
    return path


def test_available_memory_reads_meminfo_and_the_cgroup_headroom(tmp_path: Path):
    meminfo = write_meminfo(tmp_path, 16 * 1024 * 1024)  # 16 GiB
    no_cgroup = tmp_path / "no-cgroup"
    assert cb.available_memory_bytes(meminfo, no_cgroup) == 16 * 1024 * MIB
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("max\n")  # no limit: MemAvailable stands
    (cgroup / "memory.current").write_text(f"{100 * MIB}\n")
    assert cb.available_memory_bytes(meminfo, cgroup) == 16 * 1024 * MIB
    (cgroup / "memory.max").write_text(f"{2048 * MIB}\n")  # a 2 GiB container, 100 MiB used
    assert cb.available_memory_bytes(meminfo, cgroup) == 1948 * MIB
    assert cb.available_memory_bytes(tmp_path / "missing", no_cgroup) is None


def test_the_override_wins_and_the_default_is_described():
    assert cb.checkpoint_budget(64, available_bytes=64 * 1024 * MIB) == cb.CheckpointBudget(
        64, "--checkpoint-memory-mb"
    )
    assert cb.checkpoint_budget(0, available_bytes=64 * 1024 * MIB).memory_mb == 0  # 0 still disables
    sized = cb.checkpoint_budget(None, available_bytes=8192 * MIB)
    assert sized.memory_mb == 1024
    assert sized.describe() == "checkpoints 1024 MiB (1/8 of 8192 MiB available, 256..4096)"


def test_scheduler_config_takes_the_budget(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cb, "available_memory_bytes", lambda: 8192 * MIB)
    assert scheduler_config(ServeConfig()).checkpoint_memory_mb == 1024
    assert scheduler_config(ServeConfig(checkpoint_memory_mb=300)).checkpoint_memory_mb == 300
    monkeypatch.setattr(cb, "available_memory_bytes", lambda: None)
    assert scheduler_config(ServeConfig()).checkpoint_memory_mb == 256


def test_the_start_up_line_prints_the_budget():
    from slotserve.gateway.runtime import Runtime
    from slotserve.gateway.server import summary_line

    budget = cb.checkpoint_budget(None, available_bytes=8192 * MIB)
    runtime = Runtime(
        scheduler=None,  # type: ignore[arg-type]  # the line reads no scheduler
        tokenizer=None,  # type: ignore[arg-type]
        chat=None,
        model_names=("m",),
        ctx_len=16,
        num_slots=1,
        checkpoint_budget=budget,
    )
    assert "| checkpoints 1024 MiB (1/8 of 8192 MiB available, 256..4096) |" in summary_line(
        runtime, ServeConfig()
    )
