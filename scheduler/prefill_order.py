"""Prefill order: which waiting request gets a slot, and which running prefill gets the step's
segment budget, first.

Design: within a priority, `PrefillOrder.COST` serves the request with the least prompt left to
prefill first, aged by how long it has waited, so a returning turn whose prompt is mostly
reused is not stuck behind long cold prefills, and a cold request is not starved. Each request
gets a virtual deadline

    deadline = admitted_at + tokens_left / aging_tokens_per_s

and the earliest deadline goes first (ties: admission order). `tokens_left` is what the request
still has to prefill: for a running prefill its prompt minus the rows its slot holds; for a
queued request the prompt minus the reuse the router would find (`estimate_tokens_left`, cheap:
the longest prefix any slot record or checkpoint shares). Written this way the aging rule is
plain arithmetic: a request with C tokens left is overtaken only by requests admitted less than
C / aging_tokens_per_s seconds after it (a later one's deadline is later whatever its cost),
so a cold prompt of the whole context is delayed by at most ctx_len / rate seconds' worth of
cheaper arrivals. `PrefillOrder.FIFO` is admission order (a huge rate tends to it; a rate near
0 is shortest-job-first without aging).

The deadline of a running prefill moves earlier as its segments complete, so a started prefill
is not overtaken by a similar one that arrived later (no thrashing between equals).

The rate is fixed by the operator, or auto (`AgingRate`): the prefill throughput the engine
measured, divided by AUTO_AGING_SLOWDOWN, so a request is overtaken only by requests arriving
within 4x the time its own prefill takes at that throughput, on any model and machine (a fixed
rate would let aging win at once on a slow model and never on a fast one).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import numpy as np

from .checkpoint_store import usable_len
from .policy import CheckpointMatch
from .prefix import common_prefix_len


class PrefillOrder(str, enum.Enum):
    """Order of waiting requests and of running prefills within one priority."""

    COST = "cost"  # least prompt left to prefill first, aged by waiting time (virtual deadline)
    FIFO = "fifo"  # admission order


# (-priority, virtual deadline or 0.0, admission order): smaller sorts first
OrderKey = tuple[int, float, int]

AUTO_AGING_SLOWDOWN = 4.0  # auto rate = measured prefill tokens/s / this
AUTO_AGING_INITIAL = 512.0  # auto rate, tokens/s, before the first prefill step is measured
_DECAY = 0.9  # per observed step: weight of the throughput measured so far


class AgingRate:
    """The aging rate in prompt tokens per second: `fixed`, or (fixed None) auto, from the
    prefill throughput of recent steps (prefill tokens over forward seconds, both decayed by
    _DECAY per step, so long steps weigh by their time). Owned by the scheduler's loop."""

    def __init__(self, fixed: float | None) -> None:
        if fixed is not None and fixed <= 0:
            raise ValueError(f"aging rate must be > 0 tokens/s, got {fixed}")
        self._fixed = fixed
        self._tokens = 0.0  # decayed prefill tokens of observed steps
        self._seconds = 0.0  # decayed forward seconds of those steps

    def observe(self, num_prefill_tokens: int, forward_s: float) -> None:
        """One engine step that fed `num_prefill_tokens` prompt tokens (ignored if none)."""
        if num_prefill_tokens <= 0 or forward_s <= 0:
            return
        self._tokens = self._tokens * _DECAY + num_prefill_tokens
        self._seconds = self._seconds * _DECAY + forward_s

    @property
    def is_auto(self) -> bool:
        return self._fixed is None

    @property
    def tokens_per_s(self) -> float:
        if self._fixed is not None:
            return self._fixed
        if self._seconds <= 0:
            return AUTO_AGING_INITIAL
        return self._tokens / self._seconds / AUTO_AGING_SLOWDOWN


def order_key(
    order: PrefillOrder,
    *,
    priority: int,
    admitted_at: float,
    admission_order: int,
    tokens_left: int,
    aging_tokens_per_s: float,
) -> OrderKey:
    """Sort key of one request: higher priority first, then (COST) the earliest virtual
    deadline or (FIFO) the earliest admission."""
    if order is PrefillOrder.FIFO:
        return (-priority, 0.0, admission_order)
    return (-priority, admitted_at + tokens_left / aging_tokens_per_s, admission_order)


def estimate_tokens_left(
    prompt: np.ndarray,
    slots: Iterable[tuple[np.ndarray, int]],
    checkpoints: Iterable[CheckpointMatch],
) -> int:
    """Prompt tokens a request would prefill if routed now: its length minus the most any slot
    record (tokens int32 [n], the slot's rewind floor) or checkpoint match could supply, with
    the router's rules (the last prompt token is always refed; no cut below a ring's floor).
    An estimate: it ignores which slot would be free and what the requests ahead will take."""
    n = int(prompt.shape[0])
    best = 0
    for tokens, floor in slots:
        held = int(tokens.shape[0])
        if held <= best:
            continue
        best = max(best, usable_len(common_prefix_len(prompt, tokens), held, n, floor))
    for m in checkpoints:
        best = max(best, usable_len(m.common, m.num_tokens, n, m.min_truncate_len))
    return n - best
