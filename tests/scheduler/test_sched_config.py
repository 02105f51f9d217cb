"""SchedulerConfig validation and the SLOTSERVE_REUSE_LOG flag."""

from __future__ import annotations

import pytest
from slotserve.scheduler.config import SchedulerConfig, reuse_log_from_env


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        ({"max_queue": -1}, "max_queue"),
        ({"segment_tokens": 0}, "segment_tokens"),
        ({"step_token_budget": 0}, "step_token_budget"),
        ({"checkpoint_memory_mb": -1}, "checkpoint_memory_mb"),
        ({"kv_disk_space_mb": 0}, "kv_disk_space_mb"),
        ({"kv_disk_dir": " "}, "kv_disk_dir"),
        ({"default_timeout_s": 0}, "default_timeout_s"),
        ({"min_checkpoint_tokens": 0}, "min_checkpoint_tokens"),
        ({"idle_half_life_s": 0}, "idle_half_life_s"),
    ],
)
def test_bad_values_are_rejected_with_the_field_named(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        SchedulerConfig(**kwargs)


def test_defaults_and_byte_budgets():
    c = SchedulerConfig(checkpoint_memory_mb=1.5, kv_disk_space_mb=2)
    assert c.segment_tokens == 512 and c.kv_disk_dir is None and c.reuse_enabled
    assert c.checkpoint_memory_bytes == 1536 * 1024 and c.kv_disk_space_bytes == 2 << 20
    with pytest.raises(AttributeError):
        c.max_queue = 3  # frozen


@pytest.mark.parametrize("raw, want", [("1", True), ("true", True), ("0", False), ("", False)])
def test_reuse_log_env_flag(monkeypatch, raw, want):
    monkeypatch.setenv("SLOTSERVE_REUSE_LOG", raw)
    assert reuse_log_from_env() is want


def test_reuse_log_env_flag_fails_loudly(monkeypatch):
    monkeypatch.setenv("SLOTSERVE_REUSE_LOG", "maybe")
    with pytest.raises(ValueError, match="SLOTSERVE_REUSE_LOG"):
        reuse_log_from_env()
