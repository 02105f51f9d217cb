"""Planning checkpoint captures into a step: which slot rows to snapshot at the start of it.

Design: a capture is planned where its rows are in the slot mirror (`SlotTable`) and the
checkpoint policy wants them (`CheckpointPolicy.wants`: not held already, room for it); the
step plan runs captures before prepares, so a capture sees the slot as it was before this
step's routing overwrote it. Admission plans the `evict` captures of slots it is about to
overwrite; the scheduler plans the captures a running request's prompt reached
(`plan_due_captures`, offsets from `CheckpointPolicy.record_routed`).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .checkpoint_policy import CheckpointPolicy
from .checkpoint_store import CaptureRule
from .sequence import Sequence
from .slot_table import SlotTable
from .step import Capture, StepPlan


def plan_capture(
    plan: StepPlan, slots: SlotTable, checkpoints: CheckpointPolicy, slot: int, n: int, rule: CaptureRule
) -> None:
    """Snapshot the first n rows of slot at the start of this step, if worth it and room."""
    tokens = slots.record(slot)[:n].copy()
    if not checkpoints.wants(tokens, rule):
        return
    if any(np.array_equal(c.tokens, tokens) for c in plan.captures):
        return
    plan.captures.append(Capture(slot, tokens, rule))


def plan_due_captures(
    plan: StepPlan, slots: SlotTable, checkpoints: CheckpointPolicy, running: Iterable[Sequence]
) -> None:
    """Plan the captures whose prompt offset (from `record_routed`) each running request's slot
    now holds."""
    for seq in running:
        if plan.prepares_slot_for(seq):
            # NOTE: captures run before prepares in execute_plan, so a slot prepared in this
            # step still holds its old rows when snapshots are taken: capture next step.
            continue
        assert seq.slot is not None, f"{seq.request_id} holds no slot"
        slot = seq.slot
        held = slots.lens[slot]
        while seq.capture_points and seq.capture_points[0][0] <= min(held, seq.num_computed):
            n, rule = seq.capture_points.pop(0)
            if n >= slots.floors[slot]:  # else the ring no longer holds it
                plan_capture(plan, slots, checkpoints, slot, n, rule)
