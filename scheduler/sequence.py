"""Per-request state while the scheduler owns a request.

Design: one `Sequence` per admitted request, owned by the scheduler's event-loop side. A single
counter, `num_computed`, tracks how many prompt tokens the request's slot holds; prefill,
segmenting, reuse and resumption are all expressed through it (prefill is done when it reaches
the prompt length). Generated tokens are counted in `num_generated`; the last sampled token sits
in `pending_token` until a decode step feeds it into the slot.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

import numpy as np

from .checkpoint_store import CaptureRule
from .detok import Detokenizer
from .draft import SpecState
from .request import FinishEvent, FinishReason, GenerationRequest, ReuseInfo, TokenEvent
from .sampling import Sampler


class Phase(str, enum.Enum):
    QUEUED = "queued"  # admitted, waiting for a slot (also after preemption)
    PREFILL = "prefill"  # holds a slot, computing prompt rows
    DECODE = "decode"  # holds a slot, generating
    DONE = "done"  # a FinishEvent was emitted


@dataclass(eq=False, slots=True)
class Sequence:
    req: GenerationRequest
    prompt: np.ndarray  # int32 [prompt_len]
    order: int  # admission order (FIFO tie-break)
    admitted_at: float  # monotonic
    deadline: float | None  # monotonic, or None
    sampler: Sampler
    detok: Detokenizer
    events: asyncio.Queue[TokenEvent | FinishEvent]  # TokenEvent ... FinishEvent for the handle
    phase: Phase = Phase.QUEUED
    slot: int | None = None
    num_computed: int = 0  # prompt tokens in the slot (== slot record length during prefill)
    num_prefilled: int = 0  # prompt tokens this request computed, over all attempts
    num_generated: int = 0  # tokens sampled
    pending_token: int | None = None  # sampled, not yet fed
    spec: SpecState | None = None  # drafting state (draft.py); None: this request never drafts
    reuse: ReuseInfo | None = None
    est_tokens_left: int = 0  # queued: prompt tokens it would prefill if routed now (estimate)
    capture_points: list[tuple[int, CaptureRule]] = field(default_factory=list)
    staged_snapshot: tuple[np.ndarray, bytes] | None = None  # disk checkpoint loaded for us
    loading: bool = False  # a disk load for this request is in flight
    cancel_requested: bool = False
    cancel_at: float | None = None  # monotonic time of the first cancel() call
    num_errors: int = 0  # failed engine steps this request's slot survived
    ack: asyncio.Future[bool] | None = None  # resolved when a running request's cancel is done
    finish: FinishEvent | None = None
    assigned_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    prefill_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def prompt_len(self) -> int:
        return int(self.prompt.shape[0])

    @property
    def priority(self) -> int:
        return self.req.priority

    @property
    def was_cancelled(self) -> bool:
        return self.finish is not None and self.finish.reason is FinishReason.CANCELLED
