"""Plain-data stats the scheduler emits; the metrics layer turns them into Prometheus series.

Design: the scheduler pushes one `StepStats` per engine step and one `RequestStats` per finished
request (plus route, checkpoint and cancel events) into a `StatsSink` given at construction, and answers
`Scheduler.stats()` with a `SchedulerStats` snapshot of current levels (queue depth, slots). It
never imports prometheus-client; `metrics/` implements StatsSink.

Every field a metric uses as a label is an enum (defined here or re-exported from the module
that owns it), so `metrics/definitions.py` derives its label values from these types and a
misspelt value is a type error, not a dropped event at run time.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .checkpoint_store import CaptureRule
from .policy import CheckpointTier, RestoreReason
from .request import FinishReason, ReuseSource, SlotState
from .sequence import Phase

_log = logging.getLogger("slotserve.scheduler")

__all__ = [
    "CancelStats",
    "CaptureRule",
    "CheckpointEvent",
    "CheckpointEventKind",
    "CheckpointTier",
    "FinishReason",
    "GuardedSink",
    "NullSink",
    "Outcome",
    "PrefillClass",
    "Phase",
    "Preemption",
    "RequestStats",
    "RestoreReason",
    "ReuseSource",
    "RouteStats",
    "SchedulerStats",
    "SlotLevel",
    "SlotState",
    "StatsSink",
    "StepStats",
]


class Outcome(str, enum.Enum):
    """How a request ended, as the metrics count it (`slotserve_requests_total{outcome}`)."""

    OK = "ok"  # finish reason stop or length
    CANCELLED = "cancelled"
    ERROR = "error"
    TIMEOUT = "timeout"
    REJECTED = "rejected"  # refused at submit (queue full, prompt too long, bad parameters)


class PrefillClass(str, enum.Enum):
    """A request by how much of its prompt it had to prefill
    (`slotserve_time_to_first_token_by_class_seconds{class}`)."""

    WARM = "warm"  # more than half of its prompt reused (a returning turn, a resend)
    COLD = "cold"  # at least half of its prompt prefilled

    @classmethod
    def of(cls, prompt_tokens: int, reused_tokens: int) -> PrefillClass:
        return cls.WARM if 2 * reused_tokens > prompt_tokens else cls.COLD


class CheckpointEventKind(str, enum.Enum):
    CAPTURE = "capture"  # a snapshot stored
    RESTORE = "restore"  # a snapshot loaded into a slot
    EVICT = "evict"  # removed to make room
    DROP = "drop"  # removed because the pool refused it, or a corrupt/foreign file


@dataclass(frozen=True, slots=True)
class StepStats:
    duration_s: float  # wall time of the engine forward call
    num_tokens: int  # tokens fed this step (prefill + decode)
    num_prefill_tokens: int
    num_decode_tokens: int
    batch_size: int  # slots in the step
    chained: bool = False  # started by the engine worker without the loop (scheduler/chain.py)
    num_discarded_tokens: int = 0  # rows computed for requests that had already ended (cut off)
    num_drafted_tokens: int = 0  # speculative draft tokens verified (their rows are in num_decode_tokens)
    num_accepted_tokens: int = 0  # of those, confirmed by the model


@dataclass(frozen=True, slots=True)
class RequestStats:
    outcome: Outcome
    finish_reason: FinishReason | None
    prompt_tokens: int
    reused_tokens: int
    reuse_source: ReuseSource
    prefilled_tokens: int  # prompt tokens computed (a resumed prefill counts only new ones)
    completion_tokens: int
    queue_s: float | None  # admission to slot assignment
    ttft_s: float | None  # admission to first token
    e2e_s: float | None  # admission to finish
    itl_s: tuple[float, ...]  # gaps between successive tokens


@dataclass(frozen=True, slots=True)
class CheckpointEvent:
    kind: CheckpointEventKind
    tier: CheckpointTier
    rule: CaptureRule | None  # the rule that captured it; None when unknown (a disk restore)
    num_bytes: int
    num_tokens: int


@dataclass(frozen=True, slots=True)
class RouteStats:
    """One routed request (a request rerouted after preemption or a failed prepare counts again)."""

    reuse_source: ReuseSource
    reused_tokens: int
    window_refused: bool  # a live slot shared more than its ring could be cut back to
    window_recomputed_tokens: int  # prompt tokens computed because of that (no source had them)
    restore_reason: RestoreReason | None  # for a checkpoint restore, else None


@dataclass(frozen=True, slots=True)
class Preemption:
    """A running prefill put back in the queue for a request of higher priority."""


# the events admission reports for the sink, in the order they happened (admission.py)
AdmissionEvent = CheckpointEvent | RouteStats | Preemption


@dataclass(frozen=True, slots=True)
class CancelStats:
    phase: Phase  # QUEUED, PREFILL or DECODE when the cancel was acknowledged
    ack_s: float  # cancel() call to acknowledgement


@dataclass(frozen=True, slots=True)
class SlotLevel:
    slot: int
    state: SlotState
    num_tokens: int  # tokens held


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    queue_depth: int  # admitted, waiting for a slot
    max_queue: int
    num_running: int  # requests holding a slot
    slots: tuple[SlotLevel, ...]
    ctx_len: int
    checkpoint_memory_bytes: int
    checkpoint_disk_bytes: int
    num_preemptions: int  # cumulative
    draining: bool


class StatsSink(Protocol):
    def on_step(self, s: StepStats) -> None: ...
    def on_request(self, s: RequestStats) -> None: ...
    def on_checkpoint(self, e: CheckpointEvent) -> None: ...
    def on_route(self, r: RouteStats) -> None: ...
    def on_cancel(self, c: CancelStats) -> None: ...
    def on_preemption(self) -> None: ...


class NullSink:
    """Drops everything; the default sink."""

    def on_step(self, s: StepStats) -> None:
        pass

    def on_request(self, s: RequestStats) -> None:
        pass

    def on_checkpoint(self, e: CheckpointEvent) -> None:
        pass

    def on_route(self, r: RouteStats) -> None:
        pass

    def on_cancel(self, c: CancelStats) -> None:
        pass

    def on_preemption(self) -> None:
        pass


class GuardedSink:
    """The scheduler's view of its StatsSink: every call is guarded, so a broken metrics sink is
    logged and never stops serving."""

    def __init__(self, sink: StatsSink) -> None:
        self._sink = sink

    def on_step(self, s: StepStats) -> None:
        self._call(self._sink.on_step, s)

    def on_request(self, s: RequestStats) -> None:
        self._call(self._sink.on_request, s)

    def on_checkpoint(self, e: CheckpointEvent) -> None:
        self._call(self._sink.on_checkpoint, e)

    def on_route(self, r: RouteStats) -> None:
        self._call(self._sink.on_route, r)

    def on_cancel(self, c: CancelStats) -> None:
        self._call(self._sink.on_cancel, c)

    def on_preemption(self) -> None:
        self._call(self._sink.on_preemption)

    def emit(self, e: AdmissionEvent) -> None:
        """Hand one of admission's events to the sink method of its type."""
        if isinstance(e, CheckpointEvent):
            self.on_checkpoint(e)
        elif isinstance(e, RouteStats):
            self.on_route(e)
        else:
            self.on_preemption()

    @staticmethod
    def _call(fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a broken metrics sink must not stop serving
            _log.exception("stats sink failed")
