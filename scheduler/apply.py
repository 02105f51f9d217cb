"""Applying an executed step's result on the event loop.

Design: the worker returns a `StepResult` for the `StepPlan` the loop built (step.py); applying
it, in this order: a chained plan's rows enter the slot mirror (the worker planned them); each
snapshot taken is filed under its capture's rule; slots the pool had to read back are
resynchronised and every slot's floor updated; a request whose slot preparation failed is
rerouted (the checkpoint it came from is dropped); then each forward row advances its request:
prefill progress, and the token of each row whose logits were wanted (picked on the worker, or
sampled here for a request with a grammar), which may end the request (eos, stop token or
string, max_tokens, context full). A failed forward counts an error against each request it
fed; a request whose slot the failure tainted, or that failed too often, ends with ERROR.

A drafted decode (step.py, verify.py) emits its verified tokens one by one through the same
rules, each with the slot length plain decoding would have had at that token. Rows it must
give back are cut in the next plan: `cuts` (a running request's rejected rows, when the loop
verified because its sampler has a grammar) and `trims` (a request that ended inside an accepted
draft, e.g. on a stop string, keeps only the rows plain decoding would have fed); the worker
already cut what its own verification rejected.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

import numpy as np

from .checkpoint_policy import CheckpointPolicy
from .finish import Finisher
from .interface import BatchItem
from .policy import RouteAction
from .prefill_order import AgingRate
from .request import FinishReason, TokenEvent
from .request_table import RequestTable
from .sequence import Phase, Sequence
from .slot_table import SlotTable
from .stats import StepStats
from .step import Pick, PlannedItem, StepPlan, StepResult
from .verify import Verdict, verify_draft

log = logging.getLogger("slotserve.scheduler")

_MAX_STEP_ERRORS = 3  # a request whose slot survives this many failed steps is failed anyway


class StepApplier:
    def __init__(
        self,
        *,
        table: RequestTable,
        slots: SlotTable,
        checkpoints: CheckpointPolicy,
        finisher: Finisher,
        aging: AgingRate,
        eos: Iterable[int],
        ctx_len: int,
    ) -> None:
        self._table = table
        self._slots = slots
        self._ckpt = checkpoints
        self._finisher = finisher
        self._aging = aging  # fed the prefill throughput of every step
        self._eos = frozenset(eos)
        self._ctx_len = ctx_len
        self.cuts: dict[int, int] = {}  # running slot -> rows it keeps (cut in the next plan)
        self.trims: dict[int, int] = {}  # released slot -> rows its ended request fed (likewise)
        self.num_drafted = 0  # draft tokens verified in the last applied step
        self.num_accepted = 0  # of those, accepted

    def apply(self, plan: StepPlan, result: StepResult, now: float) -> StepStats | None:
        """Apply one executed step (see the module's docstring); its stats, or None if no
        forward row ran."""
        if plan.chained:  # the worker planned it: its rows enter the mirror now
            for e in plan.items:
                self._slots.append(e.batch.slot, e.batch.tokens)
        self._apply_captures(plan, result)
        for slot, rec in result.resync.items():
            self._slots.assign(slot, rec, result.floors[slot])
        self._slots.floors[:] = result.floors
        self._apply_prepare_errors(plan, result, now)
        ran = [(e.batch, e.owner) for e, ok in zip(plan.items, result.ran_items) if ok]
        if not ran:
            return None
        self.num_drafted = self.num_accepted = 0
        step = _step_stats(plan, result, ran)
        if result.forward_error is not None:
            self._apply_forward_error(ran, result.forward_error, now)
            return step
        self._aging.observe(step.num_prefill_tokens, result.forward_s)
        self._apply_forward(plan, result, now)
        if self.num_drafted:
            step = dataclasses.replace(
                step, num_drafted_tokens=self.num_drafted, num_accepted_tokens=self.num_accepted
            )
        return step

    def _apply_captures(self, plan: StepPlan, result: StepResult) -> None:
        """File each snapshot the step took under its capture's rule."""
        for cap, snap in zip(plan.captures, result.snapshots):
            if isinstance(snap, BaseException):
                log.warning("checkpoint capture of %d tokens failed: %s", cap.num_tokens, snap)
                continue
            self._ckpt.keep(cap.tokens, snap, cap.rule)

    def _apply_prepare_errors(self, plan: StepPlan, result: StepResult, now: float) -> None:
        """Drop the checkpoint a failed restore came from and put its request back in the queue
        (or finish it, if it was cancelled meanwhile)."""
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
                self._finisher.finish(seq, FinishReason.CANCELLED, now, cancel_phase=seq.phase)
                continue
            self._finisher.release(seq, now)
            seq.reuse = None
            if seq.phase is not Phase.DONE:
                self._table.enqueue(seq)

    def _apply_forward(self, plan: StepPlan, result: StepResult, now: float) -> None:
        """Advance each request the forward fed: prefill progress, and the token of each row
        whose logits were wanted."""
        assert result.logits is not None  # the forward ran without error
        k = 0  # logits row (and pick) of the next want_logits item
        for i, (e, ok) in enumerate(zip(plan.items, result.ran_items)):
            if not ok:
                continue
            it, seq = e.batch, e.owner
            n = len(it.tokens)
            if e.draft:
                self._apply_draft(i, e, result, k, now)
            elif seq.phase is Phase.PREFILL:
                seq.num_computed += n
                seq.num_prefilled += n
                seq.prefill_s += result.forward_s
                if it.want_logits:
                    seq.phase = Phase.DECODE
                    self._on_logits(seq, result, k, now)
            elif seq.phase is Phase.DECODE:
                seq.pending_token = None
                self._on_logits(seq, result, k, now)
            # else DONE: a chained step's row for a request that had ended, discarded (row_trims.py)
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
                self._finisher.finish(seq, FinishReason.ERROR, now, error=f"engine error: {err}")

    def _apply_draft(self, i: int, e: PlannedItem, result: StepResult, k: int, now: float) -> None:
        """A drafted decode: its verdict (the worker's, else verified here), the mirror cut to
        the rows it keeps, then each emitted token in order."""
        it, seq = e.batch, e.owner
        w = int(it.want_logits)
        verdict = result.verdicts.get(i)
        if verdict is None and seq.phase is Phase.DECODE:
            assert result.logits is not None
            verdict = self._verify_here(e, result.logits[k : k + w])
        if verdict is None:  # a chained row for a request that had ended (step.py cut it)
            return
        self.num_drafted += e.draft
        self.num_accepted += verdict.accepted
        keep = it.start_pos + verdict.rows_kept
        if i not in result.verdicts:
            if keep < self._slots.lens[it.slot]:
                self.cuts[it.slot] = keep  # the pool still holds the rejected rows
        elif self._slots.lens[it.slot] > keep:
            self._slots.truncate(it.slot, keep)  # the worker cut the pool already
        if seq.phase is not Phase.DECODE:
            return  # DONE: the loop ended it before this chained step arrived
        seq.pending_token = None
        for j, pick in enumerate(verdict.picks):
            if not self._take(seq, pick, it.start_pos + 1 + j, now):
                if j + 1 < verdict.rows_kept:  # ended inside the accepted draft (a stop string)
                    fed = it.start_pos + 1 + j
                    self.cuts.pop(it.slot, None)
                    self.trims[it.slot] = min(self.trims.get(it.slot, fed), fed)
                return

    def _verify_here(self, e: PlannedItem, rows: np.ndarray) -> Verdict:
        """Verify a drafted item whose sampler the loop owns (a grammar checks each draft
        token: the row is sampled under its mask), with the worker's stop rules."""
        b, seq = e.batch, e.owner
        s = seq.sampler
        ctx = self._ctx_len

        def ends(tok: int, j: int) -> bool:
            return tok in e.stop_ids or j + 1 >= e.emit_limit or b.start_pos + 1 + j >= ctx

        draft = np.asarray(b.tokens[-e.draft :], dtype=np.int32)
        v = verify_draft(rows, draft, lambda r: (s.sample(r), s.last_logprob), ends)
        if e.spec is not None:
            e.spec.observe(e.draft, v.accepted)
        return v

    def _on_logits(self, seq: Sequence, result: StepResult, k: int, now: float) -> None:
        """Take the token of logits row k: picked on the worker (step.py), else sampled here."""
        pick = result.picks[k]
        if pick is None:
            assert result.logits is not None
            pick = seq.sampler.sample(result.logits[k]), seq.sampler.last_logprob
        self._take(seq, pick, self._slots.lens[_held_slot(seq)], now)

    def _take(self, seq: Sequence, pick: Pick, held: int, now: float) -> bool:
        """Emit one sampled token of `seq`, whose slot held `held` rows when it was sampled;
        False if it ended the request."""
        tok, lp = pick
        seq.num_generated += 1
        if seq.first_token_at is None:
            seq.first_token_at = now
        elif seq.last_token_at is not None:
            seq.itl_s.append(now - seq.last_token_at)
        seq.last_token_at = now
        p = seq.req.params
        if (tok in self._eos and not p.ignore_eos) or tok in p.stop_token_ids:
            self._finisher.finish(seq, FinishReason.STOP, now)
            return False
        text = seq.detok.push(tok)
        seq.events.put_nowait(TokenEvent((tok,), text, (lp,) if lp is not None else ()))
        if seq.detok.stopped:
            self._finisher.finish(seq, FinishReason.STOP, now)
        elif seq.num_generated >= p.max_tokens or held >= self._ctx_len:
            self._finisher.finish(seq, FinishReason.LENGTH, now)
        else:
            seq.pending_token = tok
            return True
        return False


def _step_stats(plan: StepPlan, result: StepResult, ran: list[tuple[BatchItem, Sequence]]) -> StepStats:
    num_prefill = sum(len(it.tokens) for it, seq in ran if seq.phase is Phase.PREFILL)
    num_tokens = sum(len(it.tokens) for it, _ in ran)
    # rows a chain computed for a request the loop had already ended (cut off by row_trims.py)
    num_discarded = sum(len(it.tokens) for it, seq in ran if seq.phase is Phase.DONE)
    return StepStats(
        result.forward_s,
        num_tokens,
        num_prefill,
        num_tokens - num_prefill,
        len(ran),
        chained=plan.chained,
        num_discarded_tokens=num_discarded,
    )


def _held_slot(seq: Sequence) -> int:
    """The slot of a request that holds one (running: prefill or decode)."""
    assert seq.slot is not None, f"{seq.request_id} holds no slot"
    return seq.slot
