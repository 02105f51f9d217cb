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
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

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
from .step import StepPlan, StepResult

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
        step = _step_stats(plan, result, ran)
        if result.forward_error is not None:
            self._apply_forward_error(ran, result.forward_error, now)
            return step
        self._aging.observe(step.num_prefill_tokens, result.forward_s)
        self._apply_forward(ran, result, now)
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

    def _apply_forward(self, ran: list[tuple[BatchItem, Sequence]], result: StepResult, now: float) -> None:
        """Advance each request the forward fed: prefill progress, and the token of each row
        whose logits were wanted."""
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
                self._finisher.finish(seq, FinishReason.ERROR, now, error=f"engine error: {err}")

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
            self._finisher.finish(seq, FinishReason.STOP, now)
            return
        text = seq.detok.push(tok)
        seq.events.put_nowait(TokenEvent((tok,), text, (lp,) if lp is not None else ()))
        if seq.detok.stopped:
            self._finisher.finish(seq, FinishReason.STOP, now)
        elif seq.num_generated >= p.max_tokens or self._slots.lens[_held_slot(seq)] >= self._ctx_len:
            self._finisher.finish(seq, FinishReason.LENGTH, now)
        else:
            seq.pending_token = tok


def _step_stats(plan: StepPlan, result: StepResult, ran: list[tuple[BatchItem, Sequence]]) -> StepStats:
    num_prefill = sum(len(it.tokens) for it, seq in ran if seq.phase is Phase.PREFILL)
    num_tokens = sum(len(it.tokens) for it, _ in ran)
    # rows a chain computed for a request the loop had already ended (cut off by _trims)
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
