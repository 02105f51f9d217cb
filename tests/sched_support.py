"""Factories for the scheduler tests (fake engine, scheduler, greedy runs)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np
from slotserve.scheduler.config import SchedulerConfig
from slotserve.scheduler.fake_engine import FakeSlotPool
from slotserve.scheduler.request import (
    FinishEvent,
    GenerationRequest,
    ReuseSource,
    SamplingParams,
    TokenEvent,
)
from slotserve.scheduler.scheduler import Scheduler

N_VOCAB = 64
EOS = 2


def fake_token_bytes(n_vocab: int = N_VOCAB) -> list[bytes]:
    """Ids 0-3 special (empty), then letters, with a split 'é' (60, 61), space and newline."""
    table = [b"", b"", b"", b""]
    for i in range(4, n_vocab):
        table.append(bytes([97 + (i - 4) % 26]))
    table[60] = b"\xc3"
    table[61] = b"\xa9"
    table[62] = b" "
    table[63] = b"\n"
    return table


def make_pool(num_slots: int = 2, ctx_len: int = 512, **kw) -> FakeSlotPool:
    return FakeSlotPool(num_slots, ctx_len, N_VOCAB, **kw)


def make_config(**kw) -> SchedulerConfig:
    kw.setdefault("segment_tokens", 64)
    kw.setdefault("step_token_budget", 64)
    kw.setdefault("min_checkpoint_tokens", 8)
    kw.setdefault("checkpoint_memory_mb", 0)
    return SchedulerConfig(**kw)


def make_scheduler(pool: FakeSlotPool, config: SchedulerConfig | None = None, **kw) -> Scheduler:
    return Scheduler(
        pool,
        config or make_config(),
        token_bytes=fake_token_bytes(pool.n_vocab),
        eos_token_ids={EOS},
        **kw,
    )


def greedy(max_tokens: int = 8, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def make_request(prompt, max_tokens: int = 8, **kw) -> GenerationRequest:
    params = kw.pop("params", None) or greedy(max_tokens)
    return GenerationRequest(prompt_ids=[int(t) for t in prompt], params=params, **kw)


def prompt_of(seed: int, n: int, n_vocab: int = N_VOCAB) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(4, n_vocab, size=n)]


@dataclass
class Outcome:
    tokens: list[int]
    text: str
    finish: FinishEvent


async def collect(handle) -> Outcome:
    tokens: list[int] = []
    text = ""
    async for ev in handle:
        if isinstance(ev, TokenEvent):
            tokens.extend(ev.token_ids)
            text += ev.text
        else:
            assert isinstance(ev, FinishEvent)
            return Outcome(tokens, text + ev.text, ev)
    raise AssertionError("stream ended without a FinishEvent")


async def wait_tokens(handle, n: int) -> None:
    """Consume `handle`'s events until its n-th TokenEvent (the request keeps running)."""
    got = 0
    async for ev in handle:
        if isinstance(ev, TokenEvent):
            got += 1
            if got == n:
                return
    raise AssertionError(f"the request finished after {got} of {n} tokens")


async def run_one(sched: Scheduler, prompt, max_tokens: int = 8, **kw) -> Outcome:
    return await collect(sched.submit(make_request(prompt, max_tokens, **kw)))


async def cold_tokens(prompt, max_tokens: int = 8, **kw) -> list[int]:
    """Tokens of a cold run: a fresh one-slot pool and scheduler, no checkpoints."""
    pool = make_pool(1, 1024)
    async with make_scheduler(pool) as sched:
        out = await run_one(sched, prompt, max_tokens, **kw)
    assert out.finish.reuse.reused_tokens == 0
    return out.tokens


async def assert_warm_run(
    out: Outcome, prompt, max_tokens: int, source: ReuseSource, *, reused_tokens: int
) -> None:
    """A warm run reused `reused_tokens` prompt tokens from `source`, and its greedy tokens equal
    a cold run's of the same prompt and `max_tokens` (the run must have used that max_tokens)."""
    assert out.finish.reuse.source is source
    assert out.finish.reuse.reused_tokens == reused_tokens
    assert out.tokens == await cold_tokens(prompt, max_tokens)


def reference_greedy(pool: FakeSlotPool, prompt, max_tokens: int) -> list[int]:
    """Greedy tokens from the fake's stateless reference (independent of any slot state)."""
    seq = list(prompt)
    out = []
    for _ in range(max_tokens):
        tok = int(np.argmax(pool.reference_logits(seq)))
        out.append(tok)
        seq.append(tok)
    return out


async def wait_until(pred, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        if loop.time() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.001)


class ManualClock:
    """A scheduler clock (`Scheduler(clock=...)`) that moves only when told: time-based rules
    (timeouts, idle times) are tested without waiting for real time to pass."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ForwardLog:
    """Forward hook: the (slot, start_pos, num_tokens) of every item of every forward call."""

    def __init__(self, pool) -> None:
        self.calls: list[list[tuple[int, int, int]]] = []
        pool.forward_hook = self

    def __call__(self, batch) -> None:
        self.calls.append([(it.slot, it.start_pos, len(it.tokens)) for it in batch])

    def prefill_done_at(self, slot: int, prompt_len: int) -> int:
        """Index of the call that fed the last prompt token into `slot`."""
        return next(
            i for i, items in enumerate(self.calls) for s, p, n in items if s == slot and p + n == prompt_len
        )


class StepGate:
    """A fake-engine forward hook that holds the `pause_at`-th forward call (1-based) until
    `release` is set, so a test can act while that step is in flight."""

    def __init__(self, pool: FakeSlotPool, pause_at: int) -> None:
        import threading

        self.pause_at = pause_at
        self.calls = 0
        self.reached = threading.Event()
        self.release = threading.Event()
        pool.forward_hook = self

    def __call__(self, batch) -> None:
        self.calls += 1
        if self.calls == self.pause_at:
            self.reached.set()
            assert self.release.wait(10), "StepGate never released"

    async def wait_reached(self) -> None:
        ok = await asyncio.to_thread(self.reached.wait, 10)
        assert ok, "StepGate: step never reached"


class RecordingSink:
    """A StatsSink that keeps everything it is given."""

    def __init__(self) -> None:
        self.steps: list = []
        self.requests: list = []
        self.checkpoints: list = []
        self.routes: list = []
        self.cancels: list = []
        self.preemptions = 0

    def on_step(self, s) -> None:
        self.steps.append(s)

    def on_request(self, s) -> None:
        self.requests.append(s)

    def on_checkpoint(self, e) -> None:
        self.checkpoints.append(e)

    def on_route(self, r) -> None:
        self.routes.append(r)

    def on_cancel(self, c) -> None:
        self.cancels.append(c)

    def on_preemption(self) -> None:
        self.preemptions += 1


class CountingPool:
    """Delegates to a real SlotPool and counts the tokens fed to forward; calls `forward_hook`
    (if set, as FakeSlotPool does: e.g. a ForwardLog) with each batch first."""

    def __init__(self, pool) -> None:
        self._pool = pool
        self.num_computed_tokens = 0
        self.forward_hook = None

    def __getattr__(self, name):
        return getattr(self._pool, name)

    def forward(self, batch):
        if self.forward_hook is not None:
            self.forward_hook(batch)
        self.num_computed_tokens += sum(len(it.tokens) for it in batch)
        return self._pool.forward(batch)


async def cancel_in_prefill_and_resend(
    sched: Scheduler, pool, gate: StepGate, prompt, max_tokens: int, held: int
) -> tuple[Outcome, int]:
    """Submit `prompt` to a scheduler over a one-slot pool, cancel it while `gate` holds the
    engine mid-prefill, and resend it. Asserts that the cancel took effect and that slot 0 keeps
    exactly `held` tokens (the segments done) and can be extended from there (min_truncate_len
    == slot_len); returns the resend's output and the tokens the engine computed for it."""
    h = sched.submit(make_request(prompt, max_tokens))
    await gate.wait_reached()
    cancel = asyncio.ensure_future(h.cancel())
    gate.release.set()
    assert await cancel
    assert pool.slot_len(0) == held and pool.min_truncate_len(0) == held
    before = pool.num_computed_tokens
    out = await run_one(sched, prompt, max_tokens)
    await sched.check_integrity()
    return out, pool.num_computed_tokens - before
