"""Decode chaining: the engine worker starts the next decode step itself, without the loop.

Design: when every item of a step is a plain decode whose token the worker can pick (its
sampler runs off the loop: no grammar) and the step plans nothing else (no trims, captures or
prepares, no capture point pending, nothing already asking the loop to schedule), the loop
hands the worker a `DecodeChain` instead of a bare plan. The worker runs the plan, picks the
tokens (step.py), checks the stop rules it can (eos and stop token ids, max_tokens, the slot's
context) and, if no request ended and the loop has not asked it to stop, builds the next
decode plan from the picked tokens and runs it at once. Each step goes to the loop as it
completes, (plan, result) in order; the loop applies them as usual (events, detokenizing, stop
strings, stats) while the engine computes the next one:

    worker:  step N | pick, publish N, step N+1 ........ | pick, publish N+1, step N+2 ...
    loop:                     wake: apply N, SSE writes ^             wake: apply N+1 ...

So the loop -> worker hand-off is gone while the chain lasts, and the loop is woken once per
step off the critical path. NOTE: not by the worker: waking the loop is a write to its
self-pipe, and CPython releases the GIL around that syscall, so the woken loop would take the
GIL and run its whole burst (apply, every stream's SSE write) before the worker got it back to
start the next step. Instead the worker only appends the step to a deque, and the loop sleeps
on a timer until the step in flight should be done (its start plus the shortest recent forward
time), looks again a few times, and only if the step is still late asks the
worker for a wake-up (`_want_wake`): a slow step costs the old hand-off once, never a lost step.

The worker never runs more than one step ahead of what the loop has applied: before step N+2
it waits until the loop applied step N (`applied()`; normally long done, so it does not wait).
Whatever the loop decides that the worker could not (a stop string matched, a cancel, a new
request, a deadline) it signals with `stop()`, and the chain ends at the next step boundary.
The step the worker computed meanwhile may hold a row for a request the loop has already ended:
the loop discards that row (no event, counted as discarded) and cuts the slot back to the
request's own rows in its next plan (`StepPlan.trims`), so what a slot holds never depends on
how the two threads raced. With the one-step bound that is at most one step's rows per slot
(1 + its draft), within the slack rows of a sliding-window ring and, since a recurrent pool
drafts at most its rollback ring's length - 1 tokens, within that ring (`min_truncate_len`).
(A request ended by a stop string inside the previous step's accepted draft may need more;
the trim then stops at the floor and the slot keeps those exact extra rows.) A recurrent pool
without a rollback ring cannot take back even one row, so a request with stop strings (which
only the loop matches) is not chained there: its slot would keep the row of the token that
completed the stop string, one more than the request's own, and a next turn that carries the
reply without the stop string (or with it re-tokenized) could no longer extend the slot. A
cancel can still land while the worker computes a row; such a slot keeps that row.

Drafts: a chain carries speculative drafts (draft.py) as the loop's steps do. The worker
verifies each drafted item and cuts its rejected rows itself (step.py), and builds the next
item from the verdict: the slot's length is what the verification kept, the next draft comes
from the slot's record as the pool holds it (the worker's to read) and the request's SpecState,
which the worker owns while the chain runs, like the sampler.

Ownership: while the chain job runs, the worker alone uses the members' samplers; the loop only
reads the steps it is handed and writes the stop flag. The per-request counters the worker
needs (tokens generated) are its own copies, taken when the chain starts.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Set

import numpy as np

from .draft import Drafter
from .interface import BatchItem, SlotPool
from .sequence import Phase
from .step import PlannedItem, StepPlan, StepResult, execute_plan

ChainStep = tuple[StepPlan, StepResult]

# The loop first looks for a step at its start + the shortest of the last _EST_STEPS forward
# times + _LATE_S (a stalled step must not make it sleep through the next one), then every
# _POLL of that estimate (at least _POLL_MIN_S) up to _POLLS times, and only then asks the
# worker for a wake-up: a look while the worker computes costs the worker nothing (the GIL is
# free), a wake-up it must give costs the hand-off chaining avoids.
_EST_STEPS = 4
_LATE_S = 0.0002
_POLL = 0.1
_POLL_MIN_S = 0.0005
_POLLS = 5


def can_chain(plan: StepPlan, *, rows_taken_back: bool = True) -> bool:
    """Whether the worker can run `plan` and the decode steps after it alone: no trims, captures
    or prepares, and every item a decode whose token the worker picks, of a request with no
    capture point and no cancel pending. Without `rows_taken_back` (the pool cannot cut a step
    it ran past a request back off: recurrent, no rollback ring) no request with stop strings."""
    if plan.trims or plan.captures or plan.prepares:
        return False
    return all(
        e.sampler is not None
        and e.owner.phase is Phase.DECODE
        and not e.owner.capture_points
        and not e.owner.cancel_requested
        and (rows_taken_back or not e.owner.req.params.stop)
        for e in plan.items
    )


class DecodeChain:
    """One chained job: the worker's side is `run`; the loop's side `next`, `applied`, `stop`.

    Build it on the loop thread (it reads each item owner's generated-token count), hand
    `run` to the engine worker with the first plan, then `watch` the job's future."""

    def __init__(self, plan: StepPlan, eos: Set[int], ctx_len: int, drafter: Drafter | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._eos = eos
        self._drafter = drafter
        self._ctx_len = ctx_len
        # slot -> tokens its request has generated once the step in flight is applied (worker's copy)
        self._generated = {e.batch.slot: e.owner.num_generated for e in plan.items}
        self._stopped = False  # set by the loop (stop), read by the worker between steps
        self._turns = threading.Semaphore(1)  # steps the worker may start before the loop applied more
        # published by the worker, not yet taken by the loop (deque appends and pops are atomic)
        self._steps: collections.deque[ChainStep] = collections.deque()
        self._want_wake = False  # the loop waits for a step: the worker must wake it
        self._started_at = 0.0  # time.monotonic() when the worker started its latest forward
        # the latest applied steps' forward times (the loop's estimate of the next)
        self._forward_s: collections.deque[float] = collections.deque(maxlen=_EST_STEPS)
        self._waiter: asyncio.Future[None] | None = None
        self._done = False  # the job has returned (every step it published is delivered)
        self.num_steps = 0  # steps the worker started without the loop (worker writes, loop reads after)

    @property
    def slots(self) -> frozenset[int]:
        return frozenset(self._generated)

    # -- worker side -----------------------------------------------------------------------
    def run(self, pool: SlotPool, plan: StepPlan) -> None:
        """The job: run `plan`, then chained decode steps until a request ends, a step fails or
        the loop stops the chain. Engine worker thread only."""
        while True:
            self._started_at = time.monotonic()
            result = execute_plan(pool, plan)
            nxt = self._follow(pool, plan, result)
            self._steps.append((plan, result))
            if self._want_wake:  # (read after the append: see `next`)
                self._loop.call_soon_threadsafe(self._wake_waiter)
            if nxt is None or not self._take_turn():
                return
            self.num_steps += 1
            plan = nxt

    def _follow(self, pool: SlotPool, plan: StepPlan, result: StepResult) -> StepPlan | None:
        """The decode plan after `plan`, or None if the chain must end here."""
        if self._stopped or result.forward_error is not None or result.prepare_errors:
            return None
        nxt = StepPlan(chained=True)
        row = 0  # logits row (and pick) of the item
        batch = len(plan.items)
        for i, e in enumerate(plan.items):
            assert e.sampler is not None, "chained items are worker-picked decodes"
            verdict = result.verdicts.get(i)
            if verdict is not None:
                count, ended = len(verdict.picks), verdict.ended
                tok = verdict.picks[-1][0]
                pos = e.batch.start_pos + verdict.rows_kept  # the slot's length after the step
            else:
                pick = result.picks[row]
                assert pick is not None
                count, ended, tok = 1, False, pick[0]
                pos = e.batch.start_pos + len(e.batch.tokens)
            row += int(e.batch.want_logits)
            slot = e.batch.slot
            self._generated[slot] += count
            p = e.owner.req.params
            if (
                ended
                or (tok in self._eos and not p.ignore_eos)
                or tok in p.stop_token_ids
                or self._generated[slot] >= p.max_tokens
                or pos >= self._ctx_len
            ):
                return None  # the loop finishes that request (same rules) and reschedules
            nxt.items.append(self._next_item(pool, e, tok, pos, batch))
        return nxt

    def _next_item(self, pool: SlotPool, e: PlannedItem, tok: int, pos: int, batch: int) -> PlannedItem:
        """The next step's item of `e`'s request: its token, and a draft if the drafter has one."""
        slot = e.batch.slot
        p = e.owner.req.params
        spec = e.spec
        left = p.max_tokens - self._generated[slot]
        room = min(left - 1, self._ctx_len - pos - 1)
        toks = np.array([tok], dtype=np.int32)
        k = 0
        if self._drafter is not None and spec is not None and room > 0:
            history = np.append(np.asarray(pool.record(slot))[:pos], np.int32(tok))
            draft = self._drafter.draft(spec, history, room, batch)
            if draft.size:
                toks = np.concatenate([toks, draft]).astype(np.int32, copy=False)
                k = int(draft.size)
        item = BatchItem(slot, toks, pos, k + 1)
        return PlannedItem(item, e.owner, None, e.sampler, k, left, e.stop_ids, spec)

    def _take_turn(self) -> bool:
        """Wait (GIL released) until the loop applied the step before the one just published;
        False if the loop stopped the chain."""
        self._turns.acquire()
        return not self._stopped

    # -- loop side -------------------------------------------------------------------------
    def watch(self, job: asyncio.Future[None]) -> None:
        """Let `next` end when the job (the future of `run` on the worker) is done."""
        job.add_done_callback(self._job_done)

    def _job_done(self, _: asyncio.Future[None]) -> None:
        self._done = True
        self._wake_waiter()

    def _wake_waiter(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def next(self) -> ChainStep | None:
        """The next step the worker completed, in order; None once the chain ended and every
        step was taken."""
        if not self._steps and not self._done and self._forward_s:
            # asyncio's clock is time.monotonic: sleep until the step in flight should be done
            est = min(self._forward_s)
            delay = self._started_at + est + _LATE_S - time.monotonic()
            if delay > 0:
                await self._nap(delay)
            poll = max(_POLL * est, _POLL_MIN_S)
            for _ in range(_POLLS):
                if self._steps or self._done:
                    break
                await self._nap(poll)
        while not self._steps:
            if self._done:
                return None
            self._waiter = self._loop.create_future()
            self._want_wake = True
            # NOTE: flag first, then look: the worker appends, then reads the flag, so either
            # this sees its step or it sees the flag (the GIL orders the four operations)
            if not self._steps:
                await self._waiter
            self._want_wake = False
        plan, result = step = self._steps.popleft()
        self._forward_s.append(result.forward_s)
        return step

    async def _nap(self, delay: float) -> None:
        """Sleep `delay` seconds, or until the job is done (a chain that ends wakes the loop
        at once: the next plan, e.g. a new request's prefill, must not wait for a timer)."""
        fut = self._loop.create_future()
        self._waiter = fut
        timer = self._loop.call_later(delay, _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()

    def applied(self) -> None:
        """The loop applied one more step: the worker may start one more."""
        self._turns.release()

    def stop(self) -> None:
        """End the chain at the next step boundary (idempotent; the step in flight completes)."""
        if not self._stopped:
            self._stopped = True
            self._turns.release()  # a worker waiting for its turn sees the flag at once


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
