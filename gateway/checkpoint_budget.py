"""The default in-memory checkpoint budget, sized from the machine at start.

Design: without --checkpoint-memory-mb the budget is 1/CHECKPOINT_SHARE of the memory available
when the server starts, never below CHECKPOINT_MIN_MB (the old fixed default) and never above
CHECKPOINT_MAX_MB. "Available" is /proc/meminfo's MemAvailable, lowered to the headroom of the
process's cgroup v2 memory limit (memory.max - memory.current) when one is set: in a container
MemAvailable describes the host. When neither can be read (not Linux) the floor is used.
The budget is computed once, here, and printed in the start-up line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHECKPOINT_SHARE = 8  # the default budget is 1/8 of the available memory ...
CHECKPOINT_MIN_MB = 256  # ... at least this (the fixed default before it was sized) ...
CHECKPOINT_MAX_MB = 4096  # ... and at most this
MIB = 1024 * 1024

MEMINFO = Path("/proc/meminfo")
CGROUP_DIR = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CheckpointBudget:
    memory_mb: int  # the budget handed to the scheduler
    source: str  # how it was chosen, for the start-up line

    def describe(self) -> str:
        return f"checkpoints {self.memory_mb} MiB ({self.source})"


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (no limit) -> None


def available_memory_bytes(meminfo: Path = MEMINFO, cgroup_dir: Path = CGROUP_DIR) -> int | None:
    """MemAvailable in bytes, lowered to the cgroup v2 limit's headroom if there is a limit;
    None when neither can be read."""
    available = None
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024  # the file counts kB
                break
    except (OSError, ValueError, IndexError):
        pass
    limit, used = _read_int(cgroup_dir / "memory.max"), _read_int(cgroup_dir / "memory.current")
    if limit is not None:
        headroom = max(0, limit - (used or 0))
        available = headroom if available is None else min(available, headroom)
    return available


def default_checkpoint_memory_mb(available_bytes: int | None) -> int:
    """1/CHECKPOINT_SHARE of `available_bytes` in MiB, clamped to [CHECKPOINT_MIN_MB,
    CHECKPOINT_MAX_MB]; CHECKPOINT_MIN_MB when the available memory is unknown."""
    if available_bytes is None:
        return CHECKPOINT_MIN_MB
    return min(CHECKPOINT_MAX_MB, max(CHECKPOINT_MIN_MB, available_bytes // CHECKPOINT_SHARE // MIB))


def checkpoint_budget(override_mb: int | None, available_bytes: int | None = None) -> CheckpointBudget:
    """The budget to serve with: `override_mb` (--checkpoint-memory-mb) when given, else the
    default sized from `available_bytes` (read from the machine when None)."""
    if override_mb is not None:
        return CheckpointBudget(override_mb, "--checkpoint-memory-mb")
    if available_bytes is None:
        available_bytes = available_memory_bytes()
    if available_bytes is None:
        return CheckpointBudget(CHECKPOINT_MIN_MB, "available memory unknown: the floor")
    return CheckpointBudget(
        default_checkpoint_memory_mb(available_bytes),
        f"1/{CHECKPOINT_SHARE} of {available_bytes // MIB} MiB available, "
        f"{CHECKPOINT_MIN_MB}..{CHECKPOINT_MAX_MB}",
    )
