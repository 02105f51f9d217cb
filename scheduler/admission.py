"""Admission: which queued requests get a slot this step, where their prefix comes from, and how
their slot is prepared.

Design: `Admission` walks the queue by priority, and within a priority in the configured
`PrefillOrder` (prefill_order.py): with COST, before routing it sorts the queue by virtual
deadline (admission time + estimated prompt tokens left to prefill / aging rate), so a
request whose prompt is mostly reused overtakes cold ones for a free slot. Each request is routed (`policy.route`) against
every slot and the checkpoint stores, then its slot is prepared (rewind / copy / restore / clear)
in the same step that starts its first prefill segment: a `Prepare` goes into the step plan and
the slot mirror is updated at once, in the order the plan will execute. A request that would
overwrite valuable content first has it captured (rule `evict`). With no free slot, a request
puts back the lowest-priority running prefill below its own priority (preemption). A route to a
disk checkpoint first reads the file on a background thread; the request keeps its place in the
queue meanwhile and is routed again once the file is staged.

Each slot candidate carries the slot's `min_truncate_len` (the mirror's floor), so routing
values a ring slot by what it can really supply. With ring KV (`share_by_checkpoint`), a request
that waits for another's prefill of a shared prefix also gives that prefill a capture point at
the shared length: the leader's ring will soon be past it, but the waiter can restore it.

The queue and the running table are the `RequestTable` the scheduler shares with admission;
admission is the only code that moves a request from the queue to a slot (or back, when it
preempts one). `admit` plans the step and returns what it did as an `Admitted`: the requests it
routed with their decisions, the events for the stats sink in order, the requests it preempted
and the disk checkpoints to load; the scheduler emits the events and starts the loads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from .captures import plan_capture
from .checkpoint_policy import CheckpointPolicy
from .checkpoint_store import CaptureRule, RestoredFloor
from .config import SchedulerConfig, reuse_log_from_env
from .divergence import Divergence, Evicted, explain
from .policy import (
    Affinity,
    Capabilities,
    CheckpointMatch,
    CheckpointTier,
    RouteAction,
    RouteDecision,
    SlotCandidate,
    route,
)
from .prefill_order import AgingRate, PrefillOrder, estimate_tokens_left, order_key
from .request import ReuseInfo
from .request_table import RequestTable
from .sequence import Phase, Sequence
from .slot_table import SlotTable
from .stats import AdmissionEvent, CheckpointEvent, CheckpointEventKind, Preemption, RouteStats
from .step import Prepare, StepPlan

log = logging.getLogger("slotserve.scheduler")
reuse_log = logging.getLogger("slotserve.reuse")


@dataclass(slots=True)
class Admitted:
    """What one `Admission.admit` did, for the scheduler to act on."""

    routed: list[tuple[Sequence, RouteDecision]] = field(default_factory=list)  # given a slot
    events: list[AdmissionEvent] = field(default_factory=list)  # for the stats sink, in order
    preempted: list[Sequence] = field(default_factory=list)  # put back in the queue
    # disk checkpoints to load for queued requests (each marked `loading` already)
    disk_loads: list[tuple[Sequence, CheckpointMatch]] = field(default_factory=list)


def _affinity(request_key: str | None, slot_key: str | None) -> Affinity:
    if request_key is None or slot_key is None:
        return Affinity.NONE
    return Affinity.SAME if request_key == slot_key else Affinity.OTHER


class Admission:
    """Admission over the scheduler's collaborators: the request table it moves requests in,
    the slot mirror it plans slot preparations into, and the checkpoint policy it routes
    against. `aging` is the scheduler's measured prefill rate (prefill_order.py);
    `restored_floor` the pool's `restored_min_truncate_len`; `share_by_checkpoint` is True
    with ring KV (see the module's docstring)."""

    def __init__(
        self,
        config: SchedulerConfig,
        *,
        table: RequestTable,
        slots: SlotTable,
        checkpoints: CheckpointPolicy,
        caps: Capabilities,
        aging: AgingRate,
        restored_floor: RestoredFloor,
        share_by_checkpoint: bool = False,
    ) -> None:
        self._config = config
        self._table = table
        self._slots = slots
        self._ckpt = checkpoints
        self._caps = caps
        self._aging = aging
        self._restored_floor = restored_floor
        self._share_by_checkpoint = share_by_checkpoint
        self._reuse_log = config.reuse_log or reuse_log_from_env()
        self.num_preemptions = 0

    def admit(self, plan: StepPlan, now: float) -> Admitted:
        """Give slots to queued requests, in prefill order, until one must wait for a slot."""
        out = Admitted()
        table = self._table
        queue = table.queue
        if len(queue) > 1 and not table.all_slots_held:
            self._sort_queue()
        i = 0
        while i < len(queue):
            seq = queue[i]
            if seq.loading:
                i += 1
                continue
            if table.all_slots_held:  # no free slot: skip the routing
                if self._try_preempt(seq, plan, now, out):
                    continue
                return out
            decision = self._route(seq, now)
            if decision.action is RouteAction.WAIT_SLOT:
                if self._try_preempt(seq, plan, now, out):
                    continue
                return out
            if decision.action is RouteAction.WAIT_SHARED:
                self._mark_shared(decision)
                i += 1
                continue
            if decision.action is RouteAction.RESTORE_DISK and seq.staged_snapshot is None:
                assert decision.checkpoint is not None
                seq.loading = True
                out.disk_loads.append((seq, decision.checkpoint))
                i += 1
                continue
            self._assign(seq, decision, plan, now, out)
        return out

    def _sort_queue(self) -> None:
        """Sort the queue by prefill order (stable: equal keys keep admission order). With COST
        each request's tokens left are estimated against the slots and checkpoints as they are
        now; FIFO keeps the (-priority, order) the queue is already in."""
        cfg = self._config
        if cfg.prefill_order is PrefillOrder.FIFO:
            return
        rate = self._aging.tokens_per_s
        slots = [(self._slots.record(s), self._slots.floors[s]) for s in range(self._slots.num_slots)]
        for seq in self._table.queue:
            if cfg.reuse_enabled:
                matches = self._ckpt.matches(seq.prompt, seq.staged_snapshot)
                seq.est_tokens_left = estimate_tokens_left(seq.prompt, slots, matches)
            else:
                seq.est_tokens_left = seq.prompt_len
        self._table.sort_queue(
            lambda q: order_key(
                cfg.prefill_order,
                priority=q.priority,
                admitted_at=q.admitted_at,
                admission_order=q.order,
                tokens_left=q.est_tokens_left,
                aging_tokens_per_s=rate,
            )
        )

    def _route(self, seq: Sequence, now: float) -> RouteDecision:
        cands = []
        for s in range(self._slots.num_slots):
            owner = self._table.lookup(s)
            target = owner.prompt if owner is not None and owner.phase is Phase.PREFILL else None
            cands.append(
                SlotCandidate(
                    slot=s,
                    tokens=self._slots.record(s),
                    is_free=owner is None,
                    idle_s=0.0 if owner is not None else max(0.0, now - self._slots.last_used[s]),
                    prefill_target=target,
                    min_truncate_len=self._slots.floors[s],
                    affinity=_affinity(seq.req.session_key, self._slots.session_keys[s]),
                )
            )
        return route(
            seq.prompt,
            cands,
            self._ckpt.matches(seq.prompt, seq.staged_snapshot),
            caps=self._caps,
            idle_half_life_s=self._config.idle_half_life_s,
            reuse_enabled=self._config.reuse_enabled,
        )

    def _mark_shared(self, d: RouteDecision) -> None:
        """Give the leader of a shared prefill a capture point where the waiter's prefix ends."""
        leader = self._table.lookup(d.src_slot) if d.src_slot is not None else None
        if not self._share_by_checkpoint or leader is None or d.common <= leader.num_computed:
            return
        if d.common < self._config.min_checkpoint_tokens:
            return
        if all(p != d.common for p, _ in leader.capture_points):
            leader.capture_points.append((d.common, CaptureRule.COMMON_PREFIX))
            leader.capture_points.sort()

    def _try_preempt(self, seq: Sequence, plan: StepPlan, now: float, out: Admitted) -> bool:
        """Put back the lowest-priority running prefill below seq's priority; True if done."""
        victims = [
            r
            for r in self._table.running()
            if r.phase is Phase.PREFILL
            and r.priority < seq.priority
            and not r.cancel_requested
            and not plan.prepares_slot_for(r)  # its slot is prepared in this very step
        ]
        if not victims:
            return False
        v = min(victims, key=lambda r: (r.priority, -r.order))
        self._table.release(v, now)
        v.reuse = None
        self._table.enqueue(v)
        self.num_preemptions += 1
        out.preempted.append(v)
        out.events.append(Preemption())
        log.debug("preempted %s (priority %d) for %s", v.request_id, v.priority, seq.request_id)
        return True

    def _assign(self, seq: Sequence, d: RouteDecision, plan: StepPlan, now: float, out: Admitted) -> None:
        dest, n = d.dest, d.reuse_len
        assert dest is not None and self._table.lookup(dest) is None
        if d.lost_tokens > 0:  # what a later prompt may miss: divergence.py
            self._ckpt.evictions.add(Evicted.SLOT, self._slots.record(dest))
        if d.evicts and d.lost_tokens >= self._config.min_checkpoint_tokens:
            plan_capture(plan, self._slots, self._ckpt, dest, self._slots.lens[dest], CaptureRule.EVICT)
        source = d.action.reuse_source
        prep: Prepare | None = None
        if d.action is RouteAction.REWIND:
            if self._slots.lens[dest] != n:
                prep = Prepare(RouteAction.REWIND, dest, n)
            self._slots.truncate(dest, n)
        elif d.action is RouteAction.COPY:
            assert d.src_slot is not None
            prep = Prepare(RouteAction.COPY, dest, n, src_slot=d.src_slot)
            self._slots.copy_prefix(d.src_slot, dest, n)
        elif d.action is RouteAction.RESTORE_MEMORY:
            assert d.checkpoint is not None
            entry = self._ckpt.memory.get(d.checkpoint.key)
            assert entry is not None
            prep = Prepare(RouteAction.RESTORE_MEMORY, dest, n, snapshot=entry.data)
            self._slots.assign(dest, entry.tokens[:n], self._restored_floor(entry.num_tokens))
            out.events.append(
                CheckpointEvent(
                    CheckpointEventKind.RESTORE, CheckpointTier.MEMORY, entry.rule, entry.num_bytes, n
                )
            )
        elif d.action is RouteAction.RESTORE_DISK:
            assert seq.staged_snapshot is not None
            tokens, data = seq.staged_snapshot
            seq.staged_snapshot = None
            prep = Prepare(RouteAction.RESTORE_DISK, dest, n, snapshot=data)
            self._slots.assign(dest, tokens[:n], self._restored_floor(int(tokens.shape[0])))
            out.events.append(
                CheckpointEvent(
                    CheckpointEventKind.RESTORE, CheckpointTier.DISK, None, memoryview(data).nbytes, n
                )
            )
        else:  # COLD
            if self._slots.lens[dest]:
                prep = Prepare(RouteAction.COLD, dest, 0)
            self._slots.truncate(dest, 0)
        if prep is not None:
            plan.add_prepare(prep, seq, d)
        seq.phase = Phase.PREFILL
        self._table.assign(seq, dest)
        seq.num_computed = n
        seq.num_errors = 0
        seq.reuse = ReuseInfo(source, n, seq.prompt_len - n, dest, self._divergence(seq, d))
        self._slots.last_divergence[dest] = seq.reuse.divergence
        self._slots.session_keys[dest] = seq.req.session_key
        if seq.assigned_at is None:
            seq.assigned_at = now
        if n > 0:
            self._slots.num_reuse_hits[dest] += 1
            self._slots.num_reused_tokens[dest] += n
        seq.capture_points = self._ckpt.record_routed(
            seq.prompt, seq.req.prefix_hint, d, seq.req.turn_offsets
        )
        out.routed.append((seq, d))
        out.events.append(
            RouteStats(
                d.action.reuse_source, d.reuse_len, d.window_refused, d.window_lost_tokens, d.restore_reason
            )
        )
        if self._reuse_log:
            extra = f" src={d.src_slot}" if d.action is RouteAction.COPY else ""
            if d.window_refused:
                extra += f" window_refused=1 window_recomputed={d.window_lost_tokens}"
            if d.restore_reason is not None:
                extra += f" restore_reason={d.restore_reason.value}"
            reuse_log.info(
                "reuse slot=%d live=%d prompt=%d common=%d action=%s%s reused=%d prefilled=%d request=%s",
                dest,
                d.live_len,
                seq.prompt_len,
                d.common,
                source.value if n else "cold",
                extra,
                n,
                seq.prompt_len - n,
                seq.request_id,
            )

    def _divergence(self, seq: Sequence, d: RouteDecision) -> Divergence:
        missed = d.reuse_len < seq.prompt_len - 1 and self._config.reuse_enabled
        return explain(
            prompt_len=seq.prompt_len,
            reused_len=d.reuse_len,
            shared_len=d.shared_len,
            refused_by=d.refused_by,
            evicted=self._ckpt.evictions.longest(seq.prompt) if missed else (0, None),
            reuse_enabled=self._config.reuse_enabled,
        )
