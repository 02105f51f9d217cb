"""The scheduler: requests in, engine steps out, events back.

Design: everything except pool calls runs on the event loop. One loop task repeats

    plan = schedule()                      # timeouts, cancels, admission + routing, captures, batch
    result = await worker.run(execute_plan, pool, plan)   # the engine step, on the worker thread
    apply(plan, result)                    # sample, emit events, finish requests, store checkpoints

so cancels and submits that arrive while the engine computes take effect at the next step
boundary, which is at most one prefill segment away. The pool is called only on the worker
thread: by `execute_plan` and a decode chain (step.py, chain.py), and once by `start()`, which
reads every slot's record (`pool.record`, `min_truncate_len`) before the loop runs. The slot
mirror (`SlotTable`) is updated as pool operations are planned; the plan executes them in the
same order, and a failure resynchronises the mirror from the pool.

Between two engine steps the loop does only what the next plan needs (stop checks, events,
schedule; the tokens are picked on the worker, step.py); the step's stats go to the sink after
the next step was handed to the worker, while the engine computes (`_pending_steps`). When a
plan is nothing but plain decodes, the worker chains the following decode steps itself
(`chain.py`) and the loop applies each step while the engine computes the next, until
something needs the loop to schedule (`_kick`: a submit, a cancel, a request it ended, a
deadline); rows the worker computed for a request the loop had already ended are cut off in
the next plan (row_trims.py).

The queue and who holds which slot are one `RequestTable` (request_table.py), shared with
`Admission` (admission.py: queue order, routing, slot preparation, preemption), which returns
what it did (`Admitted`): the scheduler hands its events to the stats sink and starts its disk
loads (disk_loads.py). Captures are planned in captures.py, the forward batch in batch.py, a
step's result applied in apply.py, and a request ends in finish.py.
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
from .apply import StepApplier
from .batch import plan_batch
from .captures import plan_due_captures
from .chain import DecodeChain, can_chain
from .checkpoint_policy import CheckpointPolicy, auto_interval_tokens
from .checkpoint_store import CaptureRule
from .config import SchedulerConfig
from .detok import Detokenizer
from .disk_loads import DiskLoads
from .draft import Drafter, NgramPool, SpecState
from .finish import Finisher, rejected_stats
from .handle import RequestHandle
from .interface import SlotPool
from .policy import Capabilities, CheckpointTier
from .prefill_order import AgingRate
from .request import (
    Draining,
    FinishReason,
    GenerationRequest,
    PromptTooLong,
    QueueFull,
    SlotView,
)
from .request_table import RequestTable
from .row_trims import RowTrims
from .sampling import Sampler
from .sequence import Phase, Sequence
from .slot_table import SlotTable
from .stats import (
    CheckpointEvent,
    CheckpointEventKind,
    GuardedSink,
    NullSink,
    SchedulerStats,
    SlotLevel,
    StatsSink,
    StepStats,
)
from .step import StepPlan, StepResult, execute_plan
from .validation import validate_request
from .worker import EngineWorker

log = logging.getLogger("slotserve.scheduler")


_POOL_TOKENS = 1024  # the last tokens of a released slot added to the shared n-gram pool


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
        self._sink = GuardedSink(stats_sink or NullSink())
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
        self._table = RequestTable(self._slots)  # who waits, who holds which slot
        self._order = itertools.count()
        self._ids = itertools.count(1)
        self._draining = False
        self._closing = False
        self._wake = asyncio.Event()
        self._step_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._worker = EngineWorker()
        self._aging = AgingRate(config.prefill_aging_tokens_per_s)  # fed by _apply
        self._pending_steps: list[StepStats] = []  # applied steps whose stats the sink has not had
        self._chain: DecodeChain | None = None  # the decode chain the worker runs, if any
        self._chain_deadline: float | None = None  # earliest deadline when the chain started
        self._admission = Admission(
            config,
            table=self._table,
            slots=self._slots,
            checkpoints=self._ckpt,
            caps=self._caps,
            aging=self._aging,
            restored_floor=pool.restored_min_truncate_len,
            share_by_checkpoint=pool.restored_min_truncate_len(pool.ctx_len) > 0,  # ring, recurrent
        )
        # speculative decoding (draft.py): None = off. A recurrent pool (a restored snapshot of 1
        # token cannot be cut back) takes rows back only through its rollback ring of k states:
        # it drafts at most k - 1 tokens, so a step's rejected rows can be cut off and a whole
        # step a decode chain ran past its request's end taken back (chain.py); none without one.
        draft_max = config.draft_max or 0
        if pool.restored_min_truncate_len(1) >= 1:
            draft_max = min(draft_max, pool.rollback - 1)
        # a chained step run past a request's end is cut back off its slot (chain.py), except on
        # a recurrent pool without a rollback ring, which chains no request with stop strings
        self._rows_taken_back = pool.restored_min_truncate_len(1) == 0 or pool.rollback >= 1
        self._drafter = (
            Drafter(draft_max, gate=config.spec_cost_gate, pool=NgramPool()) if draft_max >= 1 else None
        )
        self._disk_loads = DiskLoads(wake=self._kick)
        self._finisher = Finisher(self._table, self._sink, on_release=self._on_release)
        self._applier = StepApplier(
            table=self._table,
            slots=self._slots,
            checkpoints=self._ckpt,
            finisher=self._finisher,
            aging=self._aging,
            eos=self._eos,
            ctx_len=pool.ctx_len,
        )
        self._row_trims = RowTrims(self._slots, self._table, self._applier)  # cut in the next plan

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
        await self._disk_loads.aclose()
        await asyncio.to_thread(self._worker.stop)
        await self._ckpt.aclose()

    async def drain(self, grace_s: float) -> None:
        """Stop admitting; let queued and running requests finish for up to grace_s seconds,
        then cancel the rest (each cancel acknowledged)."""
        self._draining = True
        deadline = self._clock() + grace_s
        while not self._table.is_empty:
            left = deadline - self._clock()
            if left <= 0:
                break
            self._finisher.changed.clear()
            try:
                await asyncio.wait_for(self._finisher.changed.wait(), left)
            except asyncio.TimeoutError:
                break
        await self._cancel_all()

    async def _cancel_all(self) -> None:
        seqs = self._table.all()
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
        if self._table.num_queued >= self._config.max_queue:
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
            spec=SpecState() if self._drafter is not None and req.speculative else None,
        )
        self._table.enqueue(seq)
        self._kick()
        return RequestHandle(seq, self._cancel)

    def _reject(self, req: GenerationRequest) -> None:
        self._sink.on_request(rejected_stats(req))

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            queue_depth=self._table.num_queued,
            max_queue=self._config.max_queue,
            num_running=self._table.num_running,
            slots=tuple(
                SlotLevel(s, self._table.slot_state(s), self._slots.lens[s])
                for s in range(self._slots.num_slots)
            ),
            ctx_len=self._pool.ctx_len,
            checkpoint_memory_bytes=self._ckpt.memory.bytes_used,
            checkpoint_disk_bytes=self._ckpt.disk_bytes,
            num_preemptions=self._admission.num_preemptions,
            draining=self._draining,
        )

    def slots(self) -> list[SlotView]:
        return self._table.slot_views(self._clock())

    async def check_integrity(self) -> None:
        """Assert the slot mirror equals the pool and the stores are consistent (tests)."""
        self._kick()  # a decode chain holds the step lock until it ends
        async with self._step_lock:
            await self._worker.run(self._slots.check_integrity, self._pool)
            self._ckpt.memory.check_integrity()
            self._table.check_integrity()

    # -- cancel ----------------------------------------------------------------------------
    async def _cancel(self, seq: Sequence) -> bool:
        if seq.phase is Phase.DONE:
            return seq.was_cancelled
        now = self._clock()
        if seq.phase is Phase.QUEUED:
            self._finisher.finish(seq, FinishReason.CANCELLED, now, cancel_phase=Phase.QUEUED, cancel_at=now)
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
                if self._closing and self._table.is_empty:
                    return
                try:
                    await asyncio.wait_for(self._wake.wait(), self._next_deadline_in(now))
                except asyncio.TimeoutError:
                    pass
        except Exception:
            log.exception("scheduler loop failed; failing every request it holds")
            self._draining = True  # new requests are refused (503) instead of hanging
            now = self._clock()
            for seq in self._table.all():
                self._finisher.finish(seq, FinishReason.ERROR, now, error="scheduler failure")
            raise

    def _next_deadline(self) -> float | None:
        deadlines = [s.deadline for s in self._table if s.deadline is not None]
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
        """A chain for `plan` if the worker can run it alone (`can_chain`) and nothing waits for
        the loop, else None."""
        if (
            not self._config.decode_chain
            or self._wake.is_set()
            or self._closing
            or not can_chain(plan, rows_taken_back=self._rows_taken_back)
        ):
            return None
        return DecodeChain(plan, self._eos, self._pool.ctx_len, self._drafter)

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

    def _schedule(self, now: float) -> StepPlan | None:
        plan = StepPlan()
        self._row_trims.plan(plan)
        for seq in self._table.all():
            if seq.deadline is not None and seq.deadline <= now:
                self._finisher.finish(seq, FinishReason.TIMEOUT, now)
        for seq in list(self._table.running()):
            if seq.cancel_requested:
                self._finisher.finish(seq, FinishReason.CANCELLED, now, cancel_phase=seq.phase)
        if not self._closing:
            self._admit(plan, now)
        plan_due_captures(plan, self._slots, self._ckpt, self._table.running())
        plan_batch(
            plan,
            self._table.running(),
            self._slots,
            self._config,
            self._aging.tokens_per_s,
            self._drafter,
            self._eos,
        )
        return None if plan.is_empty() else plan

    def _admit(self, plan: StepPlan, now: float) -> None:
        """Run admission for this step and act on what it reports."""
        admitted = self._admission.admit(plan, now)
        for event in admitted.events:
            self._sink.emit(event)
        if admitted.preempted:
            self._kick()
        for seq, match in admitted.disk_loads:
            disk = self._ckpt.disk
            assert disk is not None
            self._disk_loads.start(disk, seq, match)

    # -- applying results (apply.py) -------------------------------------------------------
    def _apply(self, plan: StepPlan, result: StepResult, now: float) -> None:
        step = self._applier.apply(plan, result, now)
        if step is not None:
            self._pending_steps.append(step)
            if self._drafter is not None and step.num_prefill_tokens == 0 and not step.num_discarded_tokens:
                self._drafter.cost.observe(step.batch_size, step.num_tokens, step.duration_s)

    # -- finishing (finish.py) ------------------------------------------------------------
    def _on_release(self, slot: int | None, held: bool) -> None:
        """A request's slot was taken back (`held`; else it held none): a decode chain that may
        be computing the slot's next row has it cut back in the next plan; wake the loop."""
        if held and slot is not None and self._drafter is not None and self._drafter.pool is not None:
            # what the request's slot holds (its prompt and answer) drafts for later requests
            self._drafter.pool.add(self._slots.record(slot)[-_POOL_TOKENS:])
        if held and self._chain is not None and slot in self._chain.slots:
            assert slot is not None
            # the worker may already be computing the next row of this slot (chain.py)
            self._row_trims.outran(slot)
        self._kick()

    # -- stats helpers ---------------------------------------------------------------------
    def _flush_step_stats(self) -> None:
        """Hand the applied steps' stats to the sink, oldest first."""
        if self._pending_steps:
            steps, self._pending_steps = self._pending_steps, []
            for st in steps:
                self._sink.on_step(st)

    def _emit_checkpoint(
        self,
        kind: CheckpointEventKind,
        tier: CheckpointTier,
        rule: CaptureRule | None,
        num_bytes: int,
        n: int,
    ) -> None:
        self._sink.on_checkpoint(CheckpointEvent(kind, tier, rule, num_bytes, n))
