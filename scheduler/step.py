"""One engine step as plain data, and the function that runs it on the engine worker thread.

Design: the event loop builds a `StepPlan` (trims, captures, slot preparations, one forward
batch), hands it to the worker, and applies the returned `StepResult`. Each plan entry carries
what the loop needs back (the request it serves, the routing decision, the tokens and rule of a
capture); the worker reads only the pool operation in it, and the item's sampler if it has one.
`execute_plan` (and `chain.py`, which builds further decode plans on the worker) is the only
code that calls the pool during serving (besides `Scheduler.start`, which reads every slot's
record once on the worker before the loop runs), in this order:

    trims (cut slots back to what their ended requests really hold: chain.py's extra rows)
      -> captures (snapshot slots about to be overwritten, or that reached a capture point)
      -> prepares (truncate / copy_prefix / restore / clear, one per newly routed request)
      -> forward (decode tokens + prefill segments; items of a failed prepare are dropped)
      -> picks (the next token of every item with a sampler, sampled here on the worker)
      -> cuts (a drafted item's rows past what its verification kept: verify.py)

A drafted decode item (`PlannedItem.draft` > 0) feeds the last sampled token followed by its
draft tokens and wants every row's logits; with a worker-side sampler the worker verifies it
(`verify_draft`, with the stop rules it can check: eos, stop ids, max_tokens, the context) and
cuts the rows of the rejected tokens off the slot in the same step, so no slot ever holds them
past the step (a cancel or a new request that lands meanwhile sees an exact slot). Without one
(a grammar: the loop owns it) the loop verifies and plans the cut as the next step's trim.

A request's Sampler is used by one thread at a time: the worker while a step of a plan that
carries it runs, the loop only between steps (and never for a sampler it handed to a plan:
`Sampler.can_sample_off_loop`, i.e. no grammar, whose state the loop owns).

After a failure it reads back the affected slots' records so the loop can resynchronise its
mirror of them; after every step it reads back each slot's `min_truncate_len` (a ring's reach
moves as it fills). It never raises (except on a bug in this module).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from .checkpoint_store import CaptureRule
from .draft import SpecState
from .interface import BatchItem, SlotPool
from .policy import RouteAction, RouteDecision
from .request import TokenLogprob
from .sampling import Sampler
from .sequence import Sequence
from .verify import Verdict, verify_draft

log = logging.getLogger("slotserve.scheduler")

# a token picked on the worker, with its logprobs when the request asked for them
Pick = tuple[int, TokenLogprob | None]


@dataclass(slots=True)
class Trim:
    slot: int
    num_tokens: int  # rows the slot keeps (an ended request's rows; see chain.py)


@dataclass(slots=True)
class Capture:
    slot: int
    tokens: np.ndarray  # int32 [n] a copy of the slot's first n record tokens: snapshot those rows
    rule: CaptureRule  # why: the checkpoint is filed under this rule

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(slots=True)
class Prepare:
    action: RouteAction  # REWIND, COPY, RESTORE_MEMORY/RESTORE_DISK (restore), COLD
    dest: int
    num_tokens: int  # rows the slot holds afterwards
    src_slot: int | None = None  # COPY
    snapshot: bytes | None = None  # RESTORE_*


@dataclass(slots=True)
class PlannedPrepare:
    op: Prepare
    owner: Sequence  # the request the slot is prepared for
    decision: RouteDecision  # the routing that chose it (to undo a failed restore)


@dataclass(slots=True)
class PlannedItem:
    batch: BatchItem
    owner: Sequence  # the request whose tokens these are
    prepare: int | None  # index of the prepare it depends on (dropped if that fails), or None
    sampler: Sampler | None = None  # want_logits items: pick the next token on the worker with it
    draft: int = 0  # the last `draft` tokens are a draft to verify (want_logits == draft + 1)
    emit_limit: int = 0  # drafted items: tokens the request may still emit (max_tokens left)
    stop_ids: frozenset[int] = frozenset()  # drafted items: ids that end the request (eos, stop ids)
    spec: SpecState | None = None  # drafted items: the request's drafting state (fed the verdict)


@dataclass(slots=True)
class StepPlan:
    trims: list[Trim] = field(default_factory=list)
    captures: list[Capture] = field(default_factory=list)
    prepares: list[PlannedPrepare] = field(default_factory=list)
    items: list[PlannedItem] = field(default_factory=list)
    # True: built on the worker by a decode chain (chain.py); its items are not in the loop's
    # slot mirror yet (the loop appends them when it applies the step)
    chained: bool = False
    _prepare_of: dict[int, int] = field(default_factory=dict)  # id(owner) -> index in prepares

    def is_empty(self) -> bool:
        return not (self.trims or self.captures or self.prepares or self.items)

    def add_prepare(self, op: Prepare, owner: Sequence, decision: RouteDecision) -> None:
        self._prepare_of[id(owner)] = len(self.prepares)
        self.prepares.append(PlannedPrepare(op, owner, decision))

    def prepares_slot_for(self, owner: Sequence) -> bool:
        """Whether `owner`'s slot is prepared in this step (captures run before prepares, and
        a request whose slot is being prepared cannot be preempted out of it)."""
        return id(owner) in self._prepare_of

    def add_item(
        self,
        batch: BatchItem,
        owner: Sequence,
        sampler: Sampler | None = None,
        *,
        draft: int = 0,
        emit_limit: int = 0,
        stop_ids: frozenset[int] = frozenset(),
        spec: SpecState | None = None,
    ) -> None:
        """Feed `batch` for `owner`, after its slot's prepare if it has one in this step; with
        `sampler` (and want_logits), the worker picks the item's next token (with `draft`, the
        worker verifies the item's last `draft` tokens: see the module doc)."""
        prep = self._prepare_of.get(id(owner))
        self.items.append(PlannedItem(batch, owner, prep, sampler, draft, emit_limit, stop_ids, spec))


@dataclass(slots=True)
class StepResult:
    snapshots: list[bytes | BaseException]  # parallel to plan.captures
    prepare_errors: dict[int, Exception]  # prepare index -> error (slot left as the pool says)
    ran_items: list[bool]  # parallel to plan.items: False if dropped after a failed prepare
    logits: np.ndarray | None  # float32 [k, n_vocab], rows of want_logits items that ran
    picks: list[Pick | None]  # [k] parallel to logits rows: the token picked on the worker, or None
    # item index -> the worker's verification of a drafted item (its slot already cut to
    # start_pos + rows_kept); drafted items sampled on the loop are not in it
    verdicts: dict[int, Verdict]
    forward_error: BaseException | None
    resync: dict[int, np.ndarray]  # slot -> its record as the pool holds it after a failure
    forward_s: float
    floors: list[int]  # [slot] pool.min_truncate_len after the step


def _rewind_after_failure(pool: SlotPool, item: BatchItem) -> None:
    """A failed forward may have appended part of an item; cut the slot back to start_pos."""
    try:
        if pool.slot_len(item.slot) > item.start_pos:
            pool.truncate(item.slot, item.start_pos)
    except Exception:  # noqa: BLE001 - the resync below reports whatever state remains
        pass


def execute_plan(pool: SlotPool, plan: StepPlan) -> StepResult:
    """Run `plan` against `pool`. Must be called on the engine worker thread only."""
    trim_failed: set[int] = set()
    for t in plan.trims:
        try:
            pool.truncate(t.slot, t.num_tokens)
        except Exception as exc:  # noqa: BLE001 - the slot keeps its extra rows (still exact)
            trim_failed.add(t.slot)
            log.warning("cutting slot %d back to %d rows failed: %s", t.slot, t.num_tokens, exc)
    snapshots: list[bytes | BaseException] = []
    for c in plan.captures:
        try:
            snapshots.append(pool.snapshot(c.slot, c.num_tokens))
        except Exception as exc:  # noqa: BLE001 - a failed capture only loses the checkpoint
            snapshots.append(exc)
    prepare_errors: dict[int, Exception] = {}
    for i, planned in enumerate(plan.prepares):
        p = planned.op
        try:
            if p.action is RouteAction.REWIND:
                pool.truncate(p.dest, p.num_tokens)
            elif p.action is RouteAction.COPY:
                assert p.src_slot is not None
                pool.copy_prefix(p.src_slot, p.dest, p.num_tokens)
            elif p.action in (RouteAction.RESTORE_MEMORY, RouteAction.RESTORE_DISK):
                assert p.snapshot is not None
                held = pool.restore(p.dest, p.snapshot)
                if held < p.num_tokens:
                    raise ValueError(f"snapshot holds {held} tokens, {p.num_tokens} expected")
                if held > p.num_tokens:
                    pool.truncate(p.dest, p.num_tokens)
            elif p.action is RouteAction.COLD:
                pool.truncate(p.dest, 0)
            else:
                raise AssertionError(f"not a prepare action: {p.action}")
        except Exception as exc:  # noqa: BLE001 - reported to the loop, which reroutes
            prepare_errors[i] = exc
    ran = [e.prepare is None or e.prepare not in prepare_errors for e in plan.items]
    items = [e.batch for e, ok in zip(plan.items, ran) if ok]
    logits, forward_error, forward_s = None, None, 0.0
    if items:
        t0 = time.perf_counter()
        try:
            logits = pool.forward(items)
        except Exception as exc:  # noqa: BLE001 - slots are resynchronised below
            forward_error = exc
            for it in items:
                _rewind_after_failure(pool, it)
        forward_s = time.perf_counter() - t0
    picks: list[Pick | None] = []
    verdicts: dict[int, Verdict] = {}
    if logits is not None:
        k = 0
        for i, (e, ok) in enumerate(zip(plan.items, ran)):
            if not ok or not e.batch.want_logits:
                continue
            s = e.sampler
            w = int(e.batch.want_logits)
            if e.draft and s is not None:
                v = _verify_on_worker(pool, e, s, logits[k : k + w])
                verdicts[i] = v
                picks.extend(v.picks)
                picks.extend([None] * (w - len(v.picks)))
            elif s is None:
                picks.extend([None] * w)
            else:
                picks.append((s.sample(logits[k]), s.last_logprob))
            k += w
    resync: dict[int, np.ndarray] = {}
    if prepare_errors or forward_error is not None or trim_failed:
        touched = {plan.prepares[i].op.dest for i in prepare_errors} | trim_failed
        if forward_error is not None:
            touched.update(it.slot for it in items)
        for slot in touched:
            resync[slot] = np.array(pool.record(slot), dtype=np.int32)
    floors = [pool.min_truncate_len(s) for s in range(pool.num_slots)]
    return StepResult(
        snapshots, prepare_errors, ran, logits, picks, verdicts, forward_error, resync, forward_s, floors
    )


def _verify_on_worker(pool: SlotPool, e: PlannedItem, sampler: Sampler, rows: np.ndarray) -> Verdict:
    """Verify a drafted item with its sampler and cut the slot back to the rows it keeps."""
    b = e.batch
    draft = np.asarray(b.tokens[-e.draft :], dtype=np.int32)
    stop_ids, limit, ctx_len = e.stop_ids, e.emit_limit, pool.ctx_len

    def ends(tok: int, i: int) -> bool:
        # as Scheduler._on_logits: a stop id, max_tokens, or a full slot (its length when the
        # i-th emitted token is sampled is start_pos + 1 + i)
        return tok in stop_ids or i + 1 >= limit or b.start_pos + 1 + i >= ctx_len

    v = verify_draft(rows, draft, lambda r: (sampler.sample(r), sampler.last_logprob), ends)
    if e.spec is not None:
        e.spec.observe(e.draft, v.accepted)
    keep = b.start_pos + v.rows_kept
    if pool.slot_len(b.slot) > keep:
        pool.truncate(b.slot, keep)
    return v
