"""The scheduler: requests in, engine steps out, events back.

Design: everything except pool calls runs on the event loop. One loop task repeats

    plan = schedule()                      # timeouts, cancels, admission + routing, captures, batch
    result = await worker.run(execute_plan, pool, plan)   # the only place the pool is called
    apply(plan, result)                    # sample, emit events, finish requests, store checkpoints

so cancels and submits that arrive while the engine computes take effect at the next step
boundary, which is at most one prefill segment away. The slot mirror (`SlotTable`) is updated
as pool operations are planned; the plan executes them in the same order, and a failure
resynchronises the mirror from the pool.

Between two engine steps the loop does only what the next plan needs (stop checks, events,
schedule; the tokens are picked on the worker, step.py); the step's stats go to the sink after
the next step was handed to the worker, while the engine computes (`_pending_steps`). When a
plan is nothing but plain decodes, the worker chains the following decode steps itself
(`chain.py`) and the loop applies each step while the engine computes the next, until
something needs the loop to schedule (`_kick`: a submit, a cancel, a request it ended, a
deadline); rows the worker computed for a request the loop had already ended are cut off in
the next plan (`_trims`).

Admission walks the queue by priority, then by prefill order (`prefill_order.py`: least prompt
left to prefill first, aged by waiting time, or FIFO), and the step's prefill budget goes to
running prefills in the same order: each request is routed (`policy.route`) against every
slot and the checkpoint store, then its slot is prepared (rewind / copy / restore / clear) in
the same step that starts its first prefill segment. A request that would overwrite valuable
content first has it captured into the checkpoint store.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq

import numpy as np

from .admission import Admission
from .chain import DecodeChain
from .checkpoint_policy import CheckpointPolicy, auto_interval_tokens
from .checkpoint_store import CaptureRule
from .config import SchedulerConfig, reuse_log_from_env
from .detok import Detokenizer
from .finish import finish_records, rejected_stats
from .handle import RequestHandle
from .interface import BatchItem, SlotPool
from .policy import Capabilities, CheckpointTier, RouteAction, RouteDecision
from .prefill_order import AgingRate, order_key
from .request import (
    Draining,
    FinishReason,
    GenerationRequest,
    PromptTooLong,
    QueueFull,
    SlotState,
    SlotView,
    TokenEvent,
)
from .sampling import Sampler
from .sequence import Phase, Sequence
from .slot_table import SlotTable
from .stats import (
    CancelStats,
    CheckpointEvent,
    CheckpointEventKind,
    NullSink,
    RequestStats,
    RouteStats,
    SchedulerStats,
    SlotLevel,
    StatsSink,
    StepStats,
)
from .step import Capture, StepPlan, StepResult, Trim, execute_plan
from .validation import validate_request
from .worker import EngineWorker

log = logging.getLogger("slotserve.scheduler")

_MAX_STEP_ERRORS = 3  # a request whose slot survives this many failed steps is failed anyway


class Scheduler:
    """Serves GenerationRequests on a SlotPool. See scheduler/request.py for the contract."""

    def __init__(
        self,
        pool: SlotPool,
        config: SchedulerConfig | None = None,
        *,
        token_bytes: Seq[bytes],
        eos_token_ids: Iterable[int],
        stats_sink: StatsSink | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        config = config or SchedulerConfig()
        if len(token_bytes) < pool.n_vocab:
            raise ValueError(
                f"token_bytes has {len(token_bytes)} entries but the model has {pool.n_vocab} "
                "token ids; pass one bytes value per token id"
            )
        self._pool = pool
        self._config = config
        self._token_bytes = list(token_bytes)
        self._eos = frozenset(int(t) for t in eos_token_ids)
        self._sink: StatsSink = stats_sink or NullSink()
        self._clock = clock
        self._caps = Capabilities(bool(pool.can_copy), bool(pool.can_snapshot))
        self._slots = SlotTable(pool.num_slots, pool.ctx_len)
        interval = config.checkpoint_interval_tokens
        if interval is None:
            interval = auto_interval_tokens(
                kv_window=pool.kv_window,
                num_slots=pool.num_slots,
                ctx_len=pool.ctx_len,
                budget_bytes=config.checkpoint_memory_bytes,
                snapshot_nbytes=pool.snapshot_nbytes,
                min_tokens=config.min_checkpoint_tokens,
                restored_floor=pool.restored_min_truncate_len,
            )
        self._ckpt = CheckpointPolicy(
            config,
            can_snapshot=self._caps.can_snapshot,
            fingerprint=pool.fingerprint,
            snapshot_nbytes=pool.snapshot_nbytes,
            emit=self._emit_checkpoint,
            restored_floor=pool.restored_min_truncate_len,
            interval_tokens=interval,
            live_records=self._slots.live_records,
        )
        self._queue: list[Sequence] = []  # waiting, by priority (admission sorts by prefill order)
        self._running: dict[int, Sequence] = {}  # slot -> request holding it
        self._order = itertools.count()
        self._ids = itertools.count(1)
        self._draining = False
        self._closing = False
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()  # set whenever a request finishes
        self._step_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._worker = EngineWorker()
        self._aging = AgingRate(config.prefill_aging_tokens_per_s)  # fed by _apply
        self._pending_steps: list[StepStats] = []  # applied steps whose stats the sink has not had
        self._chain: DecodeChain | None = None  # the decode chain the worker runs, if any
        self._chain_deadline: float | None = None  # earliest deadline when the chain started
        self._trims: dict[int, int] = {}  # slot -> rows its ended request holds (cut in the next plan)
        self._admission = Admission(
            config,
            caps=self._caps,
            slots=self._slots,
            checkpoints=self._ckpt,
            queue=self._queue,
            running=self._running,
            release_slot=self._release_slot,
            plan_capture=self._plan_capture,
            emit_checkpoint=self._emit_checkpoint,
            on_preemption=lambda: self._sink_call(self._sink.on_preemption),
            wake=self._kick,
            log_reuse=config.reuse_log or reuse_log_from_env(),
            restored_floor=pool.restored_min_truncate_len,
            emit_route=self._emit_route,
            share_by_checkpoint=pool.restored_min_truncate_len(pool.ctx_len) > 0,  # ring, recurrent
            aging=self._aging,
        )

    @property
    def checkpoint_interval_tokens(self) -> int:
        """Rule interval's K in use (0: off)."""
        return self._ckpt.interval_tokens

    # -- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start the engine worker thread and the step loop (reads the pool's records once)."""
        if self._task is not None:
            return
        self._worker.start()
        pool = self._pool
        records = await self._worker.run(
            lambda: [
                (np.array(pool.record(s), dtype=np.int32), pool.min_truncate_len(s))
                for s in range(pool.num_slots)
            ]
        )
        now = self._clock()
        for s, (rec, floor) in enumerate(records):
            self._slots.assign(s, rec, floor)
            self._slots.last_used[s] = now
        self._ckpt.start(asyncio.get_running_loop())
        self._task = asyncio.create_task(self._loop(), name="slotserve-scheduler")

    async def wait_ready(self) -> None:
        """Wait until the disk tier's index is rebuilt (returns at once without a disk tier).
        Serving does not need this; requests routed before it simply miss the disk tier."""
        await self._ckpt.wait_ready()

    async def aclose(self) -> None:
        """Cancel whatever is queued or running, stop the loop and the worker thread."""
        if self._closing:
            return
        self._draining = True
        await self._cancel_all()
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await self._task
            except Exception:  # noqa: BLE001 - already logged by the loop
                pass
            self._task = None
        await self._admission.aclose()
        await asyncio.to_thread(self._worker.stop)
        await self._ckpt.aclose()

    async def drain(self, grace_s: float) -> None:
        """Stop admitting; let queued and running requests finish for up to grace_s seconds,
        then cancel the rest (each cancel acknowledged)."""
        self._draining = True
        deadline = self._clock() + grace_s
        while self._queue or self._running:
            left = deadline - self._clock()
            if left <= 0:
                break
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                break
        await self._cancel_all()

    async def _cancel_all(self) -> None:
        seqs = list(self._queue) + list(self._running.values())
        if seqs:
            await asyncio.gather(*(self._cancel(s) for s in seqs))

    # -- gateway API -----------------------------------------------------------------------
    def submit(self, req: GenerationRequest) -> RequestHandle:
        """Admit `req` or raise at once: Draining, PromptTooLong, QueueFull, ValueError (bad
        parameters). Call from the event loop thread."""
        if self._draining or self._closing:
            raise Draining("the server is draining and admits no new requests")
        try:
            prompt = validate_request(req, self._pool.n_vocab, self._pool.ctx_len)
        except (ValueError, PromptTooLong):
            self._reject(req)
            raise
        if len(self._queue) >= self._config.max_queue:
            self._reject(req)
            raise QueueFull(self._config.retry_after_s)
        if not req.request_id:
            req.request_id = f"req-{next(self._ids)}"
        now = self._clock()
        timeout = req.timeout_s if req.timeout_s is not None else self._config.default_timeout_s
        seq = Sequence(
            req=req,
            prompt=prompt,
            order=next(self._order),
            admitted_at=now,
            deadline=now + timeout if timeout is not None else None,
            sampler=Sampler(req.params, self._pool.n_vocab),
            detok=Detokenizer(self._token_bytes, req.params.stop),
            events=asyncio.Queue(),
        )
        self._admission.enqueue(seq)
        self._kick()
        return RequestHandle(seq, self._cancel)

    def _reject(self, req: GenerationRequest) -> None:
        self._emit_request_stats(rejected_stats(req))

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            queue_depth=len(self._queue),
            max_queue=self._config.max_queue,
            num_running=len(self._running),
            slots=tuple(
                SlotLevel(s, self._slot_state(s), self._slots.lens[s]) for s in range(self._slots.num_slots)
            ),
            ctx_len=self._pool.ctx_len,
            checkpoint_memory_bytes=self._ckpt.memory.bytes_used,
            checkpoint_disk_bytes=self._ckpt.disk_bytes,
            num_preemptions=self._admission.num_preemptions,
            draining=self._draining,
        )

    def slots(self) -> list[SlotView]:
        now = self._clock()
        out = []
        for s in range(self._slots.num_slots):
            seq = self._running.get(s)
            out.append(
                SlotView(
                    slot=s,
                    state=self._slot_state(s),
                    num_tokens=self._slots.lens[s],
                    idle_s=None if seq is not None else now - self._slots.last_used[s],
                    request_id=seq.request_id if seq is not None else None,
                    num_reuse_hits=self._slots.num_reuse_hits[s],
                    num_reused_tokens=self._slots.num_reused_tokens[s],
                )
            )
        return out

    def _slot_state(self, s: int) -> SlotState:
        seq = self._running.get(s)
        if seq is not None:
            return SlotState.DECODE if seq.phase is Phase.DECODE else SlotState.PREFILL
        return SlotState.IDLE if self._slots.lens[s] else SlotState.EMPTY

    async def check_integrity(self) -> None:
        """Assert the slot mirror equals the pool and the stores are consistent (tests)."""
        self._kick()  # a decode chain holds the step lock until it ends
        async with self._step_lock:
            await self._worker.run(self._slots.check_integrity, self._pool)
            self._ckpt.memory.check_integrity()
            assert all(self._running[s].slot == s for s in self._running)
            assert all(q.phase is Phase.QUEUED for q in self._queue)

    # -- cancel ----------------------------------------------------------------------------
    async def _cancel(self, seq: Sequence) -> bool:
        if seq.phase is Phase.DONE:
            return seq.was_cancelled
        now = self._clock()
        if seq.phase is Phase.QUEUED:
            self._finish(seq, FinishReason.CANCELLED, now, cancel_phase=Phase.QUEUED, cancel_at=now)
            return True
        if not seq.cancel_requested:
            seq.cancel_requested = True
            seq.cancel_at = now
        if seq.ack is None:
            seq.ack = asyncio.get_running_loop().create_future()
        self._kick()
        return await asyncio.shield(seq.ack)

    # -- the loop --------------------------------------------------------------------------
    async def _loop(self) -> None:
        try:
            while True:
                async with self._step_lock:
                    self._wake.clear()
                    now = self._clock()
                    plan = self._schedule(now)
                    if plan is not None:
                        chain = self._chain_for(plan)
                        if chain is not None:
                            await self._run_chain(plan, chain, now)
                            continue
                        step = self._worker.submit(execute_plan, self._pool, plan)
                        self._flush_step_stats()  # while the engine computes
                        result = await step
                        self._apply(plan, result, self._clock())
                        continue
                self._flush_step_stats()
                if self._closing and not self._queue and not self._running:
                    return
                try:
                    await asyncio.wait_for(self._wake.wait(), self._next_deadline_in(now))
                except asyncio.TimeoutError:
                    pass
        except Exception:
            log.exception("scheduler loop failed; failing every request it holds")
            self._draining = True  # new requests are refused (503) instead of hanging
            now = self._clock()
            for seq in list(self._queue) + list(self._running.values()):
                self._finish(seq, FinishReason.ERROR, now, error="scheduler failure")
            raise

    def _next_deadline(self) -> float | None:
        deadlines = [
            s.deadline for s in itertools.chain(self._queue, self._running.values()) if s.deadline is not None
        ]
        return min(deadlines) if deadlines else None

    def _next_deadline_in(self, now: float) -> float | None:
        deadline = self._next_deadline()
        return None if deadline is None else max(0.0, deadline - now)

    def _kick(self) -> None:
        """Something needs a schedule: wake the loop, and end a running decode chain at its
        next step boundary."""
        self._wake.set()
        if self._chain is not None:
            self._chain.stop()

    # -- decode chains (chain.py) ----------------------------------------------------------
    def _chain_for(self, plan: StepPlan) -> DecodeChain | None:
        """A chain for `plan` if it is nothing but decodes the worker can pick and nothing
        waits for the loop, else None."""
        if not self._config.decode_chain or self._wake.is_set() or self._closing:
            return None
        if plan.trims or plan.captures or plan.prepares:
            return None
        for e in plan.items:
            seq = e.owner
            if (
                e.sampler is None
                or seq.phase is not Phase.DECODE
                or seq.capture_points
                or seq.cancel_requested
            ):
                return None
        return DecodeChain(plan, self._eos, self._pool.ctx_len)

    async def _run_chain(self, plan: StepPlan, chain: DecodeChain, now: float) -> None:
        """Hand `plan` to the worker as a chain and apply its steps as they come, stopping it
        when something needs a schedule (`_kick`) or a deadline passes."""
        self._chain, self._chain_deadline = chain, self._next_deadline()
        job = self._worker.submit(chain.run, self._pool, plan)
        chain.watch(job)
        self._flush_step_stats()  # while the engine computes
        try:
            while (step := await chain.next()) is not None:
                now = self._clock()
                self._apply(*step, now)
                if self._chain_deadline is not None and now >= self._chain_deadline:
                    chain.stop()
                chain.applied()
                self._flush_step_stats()
        finally:
            chain.stop()
            self._chain = None
        await job

    def _plan_trims(self, plan: StepPlan) -> None:
        """Cut each slot whose request a chain outran back to that request's rows (as far as
        its ring allows: any length from the floor up is exact)."""
        for slot, n in self._trims.items():
            assert slot not in self._running, f"slot {slot} was handed on before its trim"
            n = max(n, self._slots.floors[slot])
            if self._slots.lens[slot] > n:
                plan.trims.append(Trim(slot, n))
                self._slots.truncate(slot, n)
        self._trims.clear()

    def _schedule(self, now: float) -> StepPlan | None:
        plan = StepPlan()
        if self._trims:
            self._plan_trims(plan)
        for seq in [*self._queue, *self._running.values()]:
            if seq.deadline is not None and seq.deadline <= now:
                self._finish(seq, FinishReason.TIMEOUT, now)
        for seq in list(self._running.values()):
            if seq.cancel_requested:
                self._finish(seq, FinishReason.CANCELLED, now, cancel_phase=seq.phase)
        if not self._closing:
            self._admission.admit(plan, now)
        self._plan_due_captures(plan)
        self._plan_batch(plan)
        return None if plan.is_empty() else plan

    # -- captures --------------------------------------------------------------------------
    def _plan_capture(self, plan: StepPlan, slot: int, n: int, rule: CaptureRule) -> None:
        """Snapshot the first n rows of slot at the start of this step, if worth it and room."""
        tokens = self._slots.record(slot)[:n].copy()
        if not self._ckpt.wants(tokens, rule):
            return
        if any(np.array_equal(c.tokens, tokens) for c in plan.captures):
            return
        plan.captures.append(Capture(slot, tokens, rule))

    def _plan_due_captures(self, plan: StepPlan) -> None:
        """Plan the captures whose prompt offset (from `record_routed`) each slot now holds."""
        for seq in self._running.values():
            if plan.prepares_slot_for(seq):
                # NOTE: captures run before prepares in execute_plan, so a slot prepared in this
                # step still holds its old rows when snapshots are taken: capture next step.
                continue
            slot = _held_slot(seq)
            held = self._slots.lens[slot]
            while seq.capture_points and seq.capture_points[0][0] <= min(held, seq.num_computed):
                n, rule = seq.capture_points.pop(0)
                if n >= self._slots.floors[slot]:  # else the ring no longer holds it
                    self._plan_capture(plan, slot, n, rule)

    # -- batch -----------------------------------------------------------------------------
    def _plan_batch(self, plan: StepPlan) -> None:
        for seq in self._running.values():
            if seq.phase is Phase.DECODE and seq.pending_token is not None:
                toks = np.array([seq.pending_token], dtype=np.int32)
                self._add_item(plan, seq, toks, want_logits=True)
        cfg = self._config
        rate = self._aging.tokens_per_s
        budget = cfg.step_token_budget
        # Prefill order (prefill_order.py): with COST the least prompt left, aged, goes first,
        # so a mostly reused prompt's short tail runs beside, not after, long cold prefills.
        prefilling = sorted(
            (s for s in self._running.values() if s.phase is Phase.PREFILL),
            key=lambda s: order_key(
                cfg.prefill_order,
                priority=s.priority,
                admitted_at=s.admitted_at,
                admission_order=s.order,
                tokens_left=s.prompt_len - s.num_computed,
                aging_tokens_per_s=rate,
            ),
        )
        for seq in prefilling:
            n = min(seq.prompt_len - seq.num_computed, self._config.segment_tokens, budget)
            # A segment ends at the next capture point, so the snapshot is taken with the slot
            # exactly there (a ring could not be cut back to it from much further).
            nxt = next((p for p, _ in seq.capture_points if p > seq.num_computed), None)
            if nxt is not None:
                n = min(n, nxt - seq.num_computed)
            if n <= 0:
                break
            toks = seq.prompt[seq.num_computed : seq.num_computed + n]
            self._add_item(plan, seq, toks, want_logits=seq.num_computed + n == seq.prompt_len)
            budget -= n

    def _add_item(self, plan: StepPlan, seq: Sequence, toks: np.ndarray, want_logits: bool) -> None:
        slot = _held_slot(seq)
        sampler = seq.sampler if want_logits and seq.sampler.can_sample_off_loop else None
        plan.add_item(BatchItem(slot, toks, self._slots.lens[slot], want_logits), seq, sampler)
        self._slots.append(slot, toks)

    # -- applying results ------------------------------------------------------------------
    def _apply(self, plan: StepPlan, result: StepResult, now: float) -> None:
        if plan.chained:  # the worker planned it: its rows enter the mirror now
            for e in plan.items:
                self._slots.append(e.batch.slot, e.batch.tokens)
        for cap, snap in zip(plan.captures, result.snapshots):
            if isinstance(snap, BaseException):
                log.warning("checkpoint capture of %d tokens failed: %s", cap.num_tokens, snap)
                continue
            self._ckpt.keep(cap.tokens, snap, cap.rule)
        for slot, rec in result.resync.items():
            self._slots.assign(slot, rec, result.floors[slot])
        self._slots.floors[:] = result.floors
        for i, err in result.prepare_errors.items():
            seq, d = plan.prepares[i].owner, plan.prepares[i].decision
            log.warning("preparing slot %d for %s failed (%s); rerouting", d.dest, seq.request_id, err)
            if d.action is RouteAction.RESTORE_MEMORY:
                assert d.checkpoint is not None
                self._ckpt.drop_memory(d.checkpoint.key, d.checkpoint.num_tokens)
            elif d.action is RouteAction.RESTORE_DISK:
                assert d.checkpoint is not None
                self._ckpt.drop_disk(d.checkpoint.key, err)
            if seq.cancel_requested:
                # NOTE: requeued, a cancelled request would wait for a free slot before its
                # cancel is acknowledged (the queue only honours cancels as they arrive).
                self._finish(seq, FinishReason.CANCELLED, now, cancel_phase=seq.phase)
                continue
            self._release_slot(seq, now)
            seq.reuse = None
            if seq.phase is not Phase.DONE:
                self._admission.enqueue(seq)
        ran = [(e.batch, e.owner) for e, ok in zip(plan.items, result.ran_items) if ok]
        if not ran:
            return
        num_prefill = sum(len(it.tokens) for it, seq in ran if seq.phase is Phase.PREFILL)
        num_tokens = sum(len(it.tokens) for it, _ in ran)
        # rows a chain computed for a request the loop had already ended (cut off by _trims)
        num_discarded = sum(len(it.tokens) for it, seq in ran if seq.phase is Phase.DONE)
        self._pending_steps.append(
            StepStats(
                result.forward_s,
                num_tokens,
                num_prefill,
                num_tokens - num_prefill,
                len(ran),
                chained=plan.chained,
                num_discarded_tokens=num_discarded,
            )
        )
        if result.forward_error is not None:
            self._apply_forward_error(ran, result.forward_error, now)
            return
        self._aging.observe(num_prefill, result.forward_s)
        assert result.logits is not None  # the forward ran without error
        k = 0  # logits row (and pick) of the next want_logits item
        for it, seq in ran:
            n = len(it.tokens)
            if seq.phase is Phase.PREFILL:
                seq.num_computed += n
                seq.num_prefilled += n
                seq.prefill_s += result.forward_s
                if it.want_logits:
                    seq.phase = Phase.DECODE
                    self._on_logits(seq, result, k, now)
            elif seq.phase is Phase.DECODE:
                seq.pending_token = None
                self._on_logits(seq, result, k, now)
            # else DONE: a chained step's row for a request that had ended, discarded (_trims)
            k += it.want_logits

    def _apply_forward_error(
        self, ran: list[tuple[BatchItem, Sequence]], err: BaseException, now: float
    ) -> None:
        log.error("engine step failed: %s", err)
        for it, seq in ran:
            if seq.phase is Phase.DONE:
                continue
            seq.num_errors += 1
            tainted = self._slots.lens[it.slot] < it.start_pos
            if tainted or isinstance(err, ValueError) or seq.num_errors >= _MAX_STEP_ERRORS:
                self._finish(seq, FinishReason.ERROR, now, error=f"engine error: {err}")

    def _on_logits(self, seq: Sequence, result: StepResult, k: int, now: float) -> None:
        """Take the token of logits row k: picked on the worker (step.py), else sampled here."""
        pick = result.picks[k]
        if pick is None:
            assert result.logits is not None
            tok, lp = seq.sampler.sample(result.logits[k]), seq.sampler.last_logprob
        else:
            tok, lp = pick
        seq.num_generated += 1
        if seq.first_token_at is None:
            seq.first_token_at = now
        elif seq.last_token_at is not None:
            seq.itl_s.append(now - seq.last_token_at)
        seq.last_token_at = now
        p = seq.req.params
        if (tok in self._eos and not p.ignore_eos) or tok in p.stop_token_ids:
            self._finish(seq, FinishReason.STOP, now)
            return
        text = seq.detok.push(tok)
        seq.events.put_nowait(TokenEvent((tok,), text, (lp,) if lp is not None else ()))
        if seq.detok.stopped:
            self._finish(seq, FinishReason.STOP, now)
        elif seq.num_generated >= p.max_tokens or self._slots.lens[_held_slot(seq)] >= self._pool.ctx_len:
            self._finish(seq, FinishReason.LENGTH, now)
        else:
            seq.pending_token = tok

    # -- finishing -------------------------------------------------------------------------
    def _release_slot(self, seq: Sequence, now: float) -> None:
        if seq.slot is not None and self._running.get(seq.slot) is seq:
            del self._running[seq.slot]
            self._slots.last_used[seq.slot] = now
            if self._chain is not None and seq.slot in self._chain.slots:
                # the worker may already be computing the next row of this slot (chain.py)
                self._trims[seq.slot] = self._slots.lens[seq.slot]
        seq.pending_token = None
        self._kick()

    def _finish(
        self,
        seq: Sequence,
        reason: FinishReason,
        now: float,
        *,
        error: str | None = None,
        cancel_phase: Phase | None = None,
        cancel_at: float | None = None,
    ) -> None:
        if seq.phase is Phase.DONE:
            return
        if seq.phase is Phase.QUEUED and seq in self._queue:
            self._queue.remove(seq)
        self._release_slot(seq, now)
        seq.phase = Phase.DONE
        ev, stats = finish_records(seq, reason, seq.detok.flush(), now, error)
        seq.finish = ev
        seq.events.put_nowait(ev)
        if seq.ack is not None and not seq.ack.done():
            seq.ack.set_result(reason is FinishReason.CANCELLED)
        self._emit_request_stats(stats)
        if reason is FinishReason.CANCELLED:
            started = cancel_at if cancel_at is not None else (seq.cancel_at or now)
            self._sink_call(self._sink.on_cancel, CancelStats(cancel_phase or Phase.DECODE, now - started))
        self._changed.set()

    # -- stats helpers ---------------------------------------------------------------------
    def _flush_step_stats(self) -> None:
        """Hand the applied steps' stats to the sink, oldest first."""
        if self._pending_steps:
            steps, self._pending_steps = self._pending_steps, []
            for st in steps:
                self._sink_call(self._sink.on_step, st)

    def _sink_call(self, fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a broken metrics sink must not stop serving
            log.exception("stats sink failed")

    def _emit_request_stats(self, s: RequestStats) -> None:
        self._sink_call(self._sink.on_request, s)

    def _emit_route(self, d: RouteDecision) -> None:
        stats = RouteStats(
            d.action.reuse_source, d.reuse_len, d.window_refused, d.window_lost_tokens, d.restore_reason
        )
        self._sink_call(self._sink.on_route, stats)

    def _emit_checkpoint(
        self,
        kind: CheckpointEventKind,
        tier: CheckpointTier,
        rule: CaptureRule | None,
        num_bytes: int,
        n: int,
    ) -> None:
        self._sink_call(self._sink.on_checkpoint, CheckpointEvent(kind, tier, rule, num_bytes, n))


def _held_slot(seq: Sequence) -> int:
    """The slot of a request that holds one (running: prefill or decode)."""
    assert seq.slot is not None, f"{seq.request_id} holds no slot"
    return seq.slot
