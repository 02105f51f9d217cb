"""The forward batch of one step: every decoding request's pending token, then running prefills'
next segments within the step's token budget.

Design: decodes always go in (one row each, plus the rows of a draft when the drafter gives
one: draft.py; the worker verifies it, step.py); the prefill budget (`step_token_budget`) goes to
running prefills in prefill order (prefill_order.py: with COST the least prompt left, aged,
first, so a mostly reused prompt's short tail runs beside, not after, long cold prefills). A
segment is at most `segment_tokens` long and ends at the request's next capture point, so the
snapshot is taken with the slot exactly there. Each item's rows enter the slot mirror as they
are planned; an item whose logits are wanted carries the request's sampler when the worker
may pick its token (`Sampler.can_sample_off_loop`).
"""

from __future__ import annotations

from collections.abc import Iterable, Set

import numpy as np

from .config import SchedulerConfig
from .draft import Drafter
from .interface import BatchItem
from .prefill_order import order_key
from .sequence import Phase, Sequence
from .slot_table import SlotTable
from .step import StepPlan


def plan_batch(
    plan: StepPlan,
    running: Iterable[Sequence],
    slots: SlotTable,
    config: SchedulerConfig,
    aging_tokens_per_s: float,
    drafter: Drafter | None = None,
    eos: Set[int] = frozenset(),
) -> None:
    """Add this step's forward items for the `running` requests to `plan`."""
    running = list(running)
    decoding = [s for s in running if s.phase is Phase.DECODE and s.pending_token is not None]
    for seq in decoding:
        assert seq.pending_token is not None
        if drafter is not None and seq.spec is not None:
            add_decode(plan, slots, seq, drafter, eos, len(decoding))
        else:
            add_item(plan, slots, seq, np.array([seq.pending_token], dtype=np.int32), want_logits=True)
    budget = config.step_token_budget
    prefilling = sorted(
        (s for s in running if s.phase is Phase.PREFILL),
        key=lambda s: order_key(
            config.prefill_order,
            priority=s.priority,
            admitted_at=s.admitted_at,
            admission_order=s.order,
            tokens_left=s.prompt_len - s.num_computed,
            aging_tokens_per_s=aging_tokens_per_s,
        ),
    )
    for seq in prefilling:
        n = min(seq.prompt_len - seq.num_computed, config.segment_tokens, budget)
        # A segment ends at the next capture point, so the snapshot is taken with the slot
        # exactly there (a ring could not be cut back to it from much further).
        nxt = next((p for p, _ in seq.capture_points if p > seq.num_computed), None)
        if nxt is not None:
            n = min(n, nxt - seq.num_computed)
        if n <= 0:
            break
        toks = seq.prompt[seq.num_computed : seq.num_computed + n]
        add_item(plan, slots, seq, toks, want_logits=seq.num_computed + n == seq.prompt_len)
        budget -= n


def add_item(plan: StepPlan, slots: SlotTable, seq: Sequence, toks: np.ndarray, want_logits: bool) -> None:
    """Feed `toks` into the slot `seq` holds, from the end of its record."""
    assert seq.slot is not None, f"{seq.request_id} holds no slot"
    slot = seq.slot
    sampler = seq.sampler if want_logits and seq.sampler.can_sample_off_loop else None
    plan.add_item(BatchItem(slot, toks, slots.lens[slot], want_logits), seq, sampler)
    slots.append(slot, toks)


def add_decode(
    plan: StepPlan, slots: SlotTable, seq: Sequence, drafter: Drafter, eos: Set[int], batch: int
) -> None:
    """Feed `seq`'s pending token and the draft the drafter gives for it (maybe none)."""
    assert seq.slot is not None and seq.pending_token is not None and seq.spec is not None
    slot = seq.slot
    pos = slots.lens[slot]
    p = seq.req.params
    left = p.max_tokens - seq.num_generated  # tokens the request may still emit (>= 1)
    # a draft of k yields up to k + 1 tokens and needs k + 1 rows of context
    room = min(left - 1, slots.ctx_len - pos - 1)
    history = np.append(slots.record(slot), np.int32(seq.pending_token))
    draft = drafter.draft(seq.spec, history, room, batch) if room > 0 else np.zeros(0, dtype=np.int32)
    toks = history[pos:] if draft.size == 0 else np.concatenate([history[pos:], draft])
    toks = toks.astype(np.int32, copy=False)
    k = int(draft.size)
    sampler = seq.sampler if seq.sampler.can_sample_off_loop else None
    stop_ids = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else frozenset(eos))
    item = BatchItem(slot, toks, pos, k + 1)
    plan.add_item(item, seq, sampler, draft=k, emit_limit=left, stop_ids=stop_ids, spec=seq.spec)
    slots.append(slot, toks)
