"""Scheduler configuration: one frozen, validated dataclass.

Constructing a `SchedulerConfig` only stores and checks values; nothing is read from the
environment or written to disk here. `reuse_log_from_env()` is the single place the scheduler
reads `SLOTSERVE_REUSE_LOG`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .prefill_order import PrefillOrder

REUSE_LOG_ENV = "SLOTSERVE_REUSE_LOG"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_bool(text: str) -> bool:
    """The one boolean parser for environment values (the gateway's options use it too):
    1/true/yes/on or 0/false/no/off, any case; empty is False. ValueError otherwise."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"expected one of 1/0/true/false/yes/no/on/off, got {text!r}")


def env_flag(name: str) -> bool:
    """Parse a boolean environment variable with `parse_bool`; unset is False."""
    raw = os.environ.get(name, "")
    try:
        return parse_bool(raw)
    except ValueError:
        raise ValueError(f"{name}={raw.strip().lower()!r} is not a boolean; set it to 1 or 0") from None


def reuse_log_from_env() -> bool:
    return env_flag(REUSE_LOG_ENV)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_queue: int = 64  # requests admitted but waiting for a slot; more -> QueueFull
    segment_tokens: int = 512  # max prefill tokens one request feeds per engine step
    step_token_budget: int = 512  # max prefill tokens per step over all requests (decode extra)
    checkpoint_memory_mb: float = 256.0  # in-memory checkpoint budget; 0 disables the store
    kv_disk_dir: str | None = None  # disk checkpoint tier, off unless a directory is given
    kv_disk_space_mb: float = 1024.0  # disk tier budget
    reuse_enabled: bool = True  # False: every request prefills cold (for A/B measurements)
    reuse_log: bool = False  # one "reuse ..." line per request on logger slotserve.reuse
    default_timeout_s: float | None = None  # per-request limit when the request sets none
    min_checkpoint_tokens: int = 64  # captures shorter than this are not worth a snapshot
    capture_prompt_end: bool = True  # checkpoint rule 3: snapshot the prompt after prefill
    # checkpoint rule interval: snapshot every K tokens of a prefill; None: auto (off for full
    # KV, sized by the window and the memory budget for ring KV); 0: off
    checkpoint_interval_tokens: int | None = None
    idle_half_life_s: float = 600.0  # victim choice: an idle slot's value halves this often
    retry_after_s: float = 1.0  # hint carried by QueueFull
    # which waiting request gets a slot, and which running prefill the segment budget, first
    # (within a priority): COST = least prompt left to prefill, aged (prefill_order.py); FIFO
    prefill_order: PrefillOrder = PrefillOrder.COST
    # COST aging: a request with C tokens left is overtaken only by requests admitted less than
    # C / this many seconds after it; None: auto (measured prefill tokens/s / 4, prefill_order.py)
    prefill_aging_tokens_per_s: float | None = None
    # plain decode steps chain on the engine worker without waiting for the loop (chain.py)
    decode_chain: bool = True
    # speculative decoding from the conversation itself (draft.py): None = off; else the most
    # draft tokens a slot's step carries (keep it below the pool's rows per step)
    draft_max: int | None = None
    spec_cost_gate: bool = True  # False: draft whenever a match exists (tests, measurements)

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"SchedulerConfig: {msg}")

        need(self.max_queue >= 0, f"max_queue={self.max_queue} must be >= 0")
        need(self.segment_tokens >= 1, f"segment_tokens={self.segment_tokens} must be >= 1")
        need(
            self.step_token_budget >= 1,
            f"step_token_budget={self.step_token_budget} must be >= 1",
        )
        need(
            self.checkpoint_memory_mb >= 0,
            f"checkpoint_memory_mb={self.checkpoint_memory_mb} must be >= 0 (0 disables)",
        )
        need(
            self.kv_disk_space_mb > 0,
            f"kv_disk_space_mb={self.kv_disk_space_mb} must be > 0",
        )
        need(
            self.kv_disk_dir is None or str(self.kv_disk_dir).strip() != "",
            "kv_disk_dir must be a directory path or None",
        )
        need(
            self.default_timeout_s is None or self.default_timeout_s > 0,
            f"default_timeout_s={self.default_timeout_s} must be > 0 or None",
        )
        need(
            self.min_checkpoint_tokens >= 1,
            f"min_checkpoint_tokens={self.min_checkpoint_tokens} must be >= 1",
        )
        need(
            self.checkpoint_interval_tokens is None or self.checkpoint_interval_tokens >= 0,
            f"checkpoint_interval_tokens={self.checkpoint_interval_tokens} must be >= 0 (0: off) or None (auto)",
        )
        need(self.idle_half_life_s > 0, f"idle_half_life_s={self.idle_half_life_s} must be > 0")
        need(self.retry_after_s >= 0, f"retry_after_s={self.retry_after_s} must be >= 0")
        need(
            isinstance(self.prefill_order, PrefillOrder),
            f"prefill_order={self.prefill_order!r} must be a PrefillOrder ({', '.join(o.value for o in PrefillOrder)})",
        )
        need(
            self.draft_max is None or 1 <= self.draft_max < self.step_token_budget,
            f"draft_max={self.draft_max} must be >= 1 and below step_token_budget (or None: off)",
        )
        need(
            self.prefill_aging_tokens_per_s is None or self.prefill_aging_tokens_per_s > 0,
            f"prefill_aging_tokens_per_s={self.prefill_aging_tokens_per_s} must be > 0 or None (auto)",
        )

    @property
    def checkpoint_memory_bytes(self) -> int:
        return int(self.checkpoint_memory_mb * 1024 * 1024)

    @property
    def kv_disk_space_bytes(self) -> int:
        return int(self.kv_disk_space_mb * 1024 * 1024)
