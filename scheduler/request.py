"""What the gateway hands the scheduler, and what comes back.

Contract of `scheduler.Scheduler` (scheduler/scheduler.py), the gateway's only entry point:

    sched = Scheduler(pool, SchedulerConfig(...), token_bytes=[...], eos_token_ids={...})
    async with sched:                       # starts the step loop + engine worker thread
        handle = sched.submit(request)      # raises QueueFull / PromptTooLong / Draining at once
        async for event in handle:          # TokenEvent ... then exactly one FinishEvent
            ...
        ok = await handle.cancel()          # idempotent; returns once the scheduler acknowledged
        sched.stats()                       # SchedulerStats snapshot (plain data) for metrics
        sched.slots()                       # list[SlotView] for GET /slots
        await sched.drain(grace_s)          # stop admitting; finish or cancel what runs
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .divergence import Divergence


class FinishReason(str, enum.Enum):
    STOP = "stop"  # eos token, stop token id or stop string
    LENGTH = "length"  # max_tokens reached, or the slot's context is full
    CANCELLED = "cancelled"  # cancel() or client disconnect
    TIMEOUT = "timeout"  # per-request timeout elapsed
    ERROR = "error"  # engine failure in this request's slot


class ReuseSource(str, enum.Enum):
    NONE = "none"  # cold prefill
    REWIND = "rewind"  # an idle slot truncated to the common prefix
    COPY = "copy"  # prefix rows copied from another (busy) slot
    CHECKPOINT_MEMORY = "checkpoint_memory"  # restored from the in-memory store
    CHECKPOINT_DISK = "checkpoint_disk"  # restored from the disk tier


class SlotState(str, enum.Enum):
    EMPTY = "empty"  # holds no tokens, no request
    IDLE = "idle"  # holds a record, no request
    PREFILL = "prefill"  # a request is computing its prompt
    DECODE = "decode"  # a request is generating


MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs


class TokenConstraint(Protocol):
    """One sequence's grammar state (e.g. a JSON schema matcher), owned by its Sampler.

    Contract: `allowed()` returns bool [n_vocab], True for every token the grammar accepts next,
    with at least one True (an eos id once the grammar is complete); it may wait for a mask that
    was being computed in the background. `accept(token)` advances the state by the sampled
    token, which `allowed()` allowed, and may start computing the next mask off the caller's
    thread. Both are called from the scheduler's event-loop thread, one sequence at a time."""

    def allowed(self) -> np.ndarray: ...

    def accept(self, token: int) -> None: ...


class Grammar(Protocol):
    """An immutable compiled grammar; `start()` gives a fresh TokenConstraint per sequence (so
    n choices of one request each get their own state)."""

    def start(self) -> TokenConstraint: ...


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None  # same seed + same prompt -> same tokens
    max_tokens: int = 256
    stop: tuple[str, ...] = ()  # stop strings: matched across token boundaries, never emitted
    stop_token_ids: tuple[int, ...] = ()  # in addition to the model's eos ids
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit); <= -100 bans it
    logprobs: int | None = None  # None: off; k >= 0: the sampled token's logprob and the k best
    grammar: Grammar | None = None  # constrained decoding: only tokens the grammar allows are sampled


@dataclass(slots=True)
class GenerationRequest:
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""  # the scheduler assigns one when empty
    prefix_hint: int | None = None  # token offset where the system turn ends (checkpoint rule 1)
    # token offsets where the template starts the last user message and each assistant turn,
    # ascending (checkpoint rule turn: where agent conversations are edited or regenerated)
    turn_offsets: tuple[int, ...] = ()
    timeout_s: float | None = None
    priority: int = 0  # higher preempts lower between prefill segments
    speculative: bool = True  # False: never draft for this request (scheduler's --speculative aside)
    session_key: str | None = None  # the client's conversation id, hashed (policy.Affinity)


@dataclass(frozen=True, slots=True)
class ReuseInfo:
    source: ReuseSource
    reused_tokens: int  # prompt tokens not computed for this request
    prefilled_tokens: int  # prompt tokens computed for this request
    slot: int
    divergence: Divergence | None = None  # where the prompt left what was held, why less was reused


@dataclass(frozen=True, slots=True)
class PrefillProgress:
    """How far a request's prompt is: `processed` of its `total` prompt tokens are in its slot,
    `cached` of those reused (rewound, copied or restored) instead of computed. While queued
    (also after a preemption) nothing is processed; once decoding, all of it is."""

    total: int
    processed: int
    cached: int


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """Log-probabilities at one sampled position, from the distribution the sampler drew from
    before temperature and truncation: the logits after penalties, logit_bias and the grammar
    mask, log-softmaxed (so the greedy token carries the top logprob)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob) of the k best, best first


@dataclass(frozen=True, slots=True)
class TokenEvent:
    token_ids: tuple[int, ...]  # tokens sampled since the last event
    text: str  # complete UTF-8 text released by them (held back: partial chars, stop-string prefixes)
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token id when params.logprobs is set


@dataclass(frozen=True, slots=True)
class FinishEvent:
    reason: FinishReason
    text: str  # any text released at finish
    prompt_tokens: int
    completion_tokens: int
    reuse: ReuseInfo | None  # None when the request never got a slot
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)  # queue_s, ttft_s, e2e_s, prefill_s
    stop_sequence: str | None = None  # the stop string that ended it (reason STOP), else None
    drafted_tokens: int = 0  # speculative draft tokens verified for this request
    accepted_tokens: int = 0  # of those, confirmed by the model (each saved a decode step)


class QueueFull(Exception):
    """Admission queue is full; retry after `retry_after_s` seconds."""

    def __init__(self, retry_after_s: float):
        super().__init__(f"queue is full; retry after {retry_after_s:.0f}s")
        self.retry_after_s = retry_after_s


class PromptTooLong(ValueError):
    """The prompt (plus at least one generated token) does not fit a slot's context."""


class Draining(Exception):
    """The scheduler is draining and admits no new requests."""


@dataclass(frozen=True, slots=True)
class SlotView:
    """One slot as GET /slots shows it (token counts only, never prompt text)."""

    slot: int
    state: SlotState
    num_tokens: int  # tokens whose KV the slot holds
    idle_s: float | None  # seconds since last use; None while a request holds the slot
    request_id: str | None  # the request holding the slot
    num_reuse_hits: int  # requests served here that reused at least one token
    num_reused_tokens: int  # prompt tokens those requests did not compute
    last_divergence: Divergence | None = None  # the last request routed here (divergence.py)
