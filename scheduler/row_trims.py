"""RowTrims: the rows to cut off slots in the next plan, held until it is planned.

Three kinds reach a plan as `Trim`s (step.py), the slot mirror truncated as they are planned:
a running request's draft rows that the loop's verification rejected and the rows of a request
that ended inside an accepted draft (both left by `StepApplier`, apply.py: `cuts`, `trims`), and
the rows a decode chain may have computed for a request the loop had already ended (`outran`:
the worker can be computing that slot's next row when the request is released, chain.py).
"""

from __future__ import annotations

from .apply import StepApplier
from .request_table import RequestTable
from .slot_table import SlotTable
from .step import StepPlan, Trim


class RowTrims:
    """Owns the released slots a decode chain outran; plans them with the applier's cuts and
    trims. Call from the event loop thread (the mirror and the applier are the loop's)."""

    def __init__(self, slots: SlotTable, table: RequestTable, applier: StepApplier) -> None:
        self._slots = slots
        self._table = table
        self._applier = applier
        self._trims: dict[int, int] = {}  # slot -> rows its ended request holds (cut in the next plan)

    def outran(self, slot: int) -> None:
        """`slot`'s request was released while a chain may be computing its next row: cut the
        slot back to its current rows in the next plan."""
        self._trims[slot] = self._slots.lens[slot]

    def plan(self, plan: StepPlan) -> None:
        """Append every pending cut and trim to `plan` (truncating the mirror as they are
        planned) and forget them."""
        self._plan_cuts(plan)
        if self._trims:
            self._plan_trims(plan)

    def _plan_cuts(self, plan: StepPlan) -> None:
        """Cut the rows a loop-side draft verification rejected (apply.py) off running slots,
        and hand the trims of requests that ended inside an accepted draft to `_trims`."""
        cuts, trims = self._applier.cuts, self._applier.trims
        for slot, n in cuts.items():
            assert self._slots.floors[slot] <= n <= self._slots.lens[slot], (slot, n)
            plan.trims.append(Trim(slot, n))
            self._slots.truncate(slot, n)
        for slot, n in trims.items():
            self._trims[slot] = min(n, self._trims.get(slot, n))
        cuts.clear()
        trims.clear()

    def _plan_trims(self, plan: StepPlan) -> None:
        """Cut each slot whose request a chain outran back to that request's rows (as far as
        its ring allows: any length from the floor up is exact)."""
        for slot, n in self._trims.items():
            assert self._table.lookup(slot) is None, f"slot {slot} was handed on before its trim"
            n = max(n, self._slots.floors[slot])
            if self._slots.lens[slot] > n:
                plan.trims.append(Trim(slot, n))
                self._slots.truncate(slot, n)
        self._trims.clear()
