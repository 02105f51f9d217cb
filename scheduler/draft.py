"""Speculative drafts from the conversation itself (prompt lookup / n-gram drafting), and the
cost gate that decides how many draft rows a slot gets.

Design: a draft is a guess of the next tokens, taken from the slot's own history (prompt +
generated): the most recent earlier occurrence of the history's last n tokens (n from
`NGRAM_MAX` down to `NGRAM_MIN`) and what followed it. Producing one costs a few vectorised
compares over the history; nothing is kept between calls, so a rewind, restore or preemption
cannot leave stale draft state behind. An optional `NgramPool` shared by all slots remembers the
continuations of n-grams from histories the scheduler hands it (each request's slot record when
it lets the slot go): a slot whose own history has no long match may still find one there (a
regenerated or resent turn drafts what the last answer said).

Whether a draft is worth its rows is the cost gate's question (`CostModel`, `SpecState`). A
verification step that carries k draft rows for one slot costs about `row_cost` more (seconds,
measured online) than the plain step; the slot then emits on average 1 + a + a^2 + ... + a^k
tokens instead of 1, where a is the request's measured per-token acceptance. The k-th draft
token adds a^k expected tokens at the price of one row, worth `row_cost * B / step_time`
tokens of the batch's plain throughput (B slots per step). So k is the largest with
a^k > that price (`choose_draft_len`), 0 when even the first does not pay: on free text, where
drafts are seldom right, a falls and drafting stops (a request that stopped drafting probes
again every `PROBE_EVERY` steps, so a later copy phase is noticed).

Thread use: `ngram_draft` is pure. A `SpecState` belongs to its request and is used by one
thread at a time, like its Sampler (the worker while a decode chain runs, else the loop).
`CostModel` is written by the loop (`observe`) and read by either; a torn read costs at most a
poorer estimate for one step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

NGRAM_MAX = 4  # longest suffix looked up first (a longer match predicts better)
NGRAM_MIN = 2  # shortest suffix tried (1-grams match almost anything in a long history)
PROBE_EVERY = 16  # steps without a draft (gate closed) before a request tries one again
_PRIOR_ACCEPTED = 1.0  # Beta-like prior of the acceptance estimate: a = 1/(1 + 1) = 0.5
_PRIOR_REJECTED = 1.0
_DECAY = 0.9  # per verification: older steps weigh less (a request moves between copy and free text)
_EMA = 0.2  # weight of a new observation in the cost model's averages
_PRIOR_ROW_FRACTION = 0.05  # an extra row's cost as a fraction of a plain step, until measured


def ngram_draft(
    history: np.ndarray, max_len: int, ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN
) -> np.ndarray:
    """int32 [<= max_len] tokens that followed the most recent earlier occurrence of the last n
    tokens of `history` (int32 [L]), trying n = ngram_max down to ngram_min; empty if none.

    The match may overlap the suffix itself (a repeated pattern drafts its own continuation)."""
    h = np.asarray(history)
    length = int(h.shape[0])
    if max_len <= 0:
        return np.zeros(0, dtype=np.int32)
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        hits = _matches(h, n)
        if hits.size:
            e = int(hits[-1])
            return np.array(h[e + 1 : e + 1 + max_len], dtype=np.int32)
    return np.zeros(0, dtype=np.int32)


def _matches(h: np.ndarray, n: int) -> np.ndarray:
    """End positions e < len(h) - 1 where h[e - n + 1 .. e] equals the last n tokens."""
    length = int(h.shape[0])
    m = h[n - 1 : length - 1] == h[length - 1]
    for j in range(1, n):
        m &= h[n - 1 - j : length - 1 - j] == h[length - 1 - j]
    return np.flatnonzero(m) + (n - 1)


class NgramPool:
    """Continuations of n-grams seen in other requests' histories, shared by every slot.

    `add(history)` indexes each NGRAM_MAX-gram of a finished history (its latest occurrence
    wins) up to `capacity` entries, oldest dropped first; `draft(history, max_len)` looks up
    the history's last NGRAM_MAX tokens. Loop thread only."""

    def __init__(self, capacity: int = 65536, span: int = 16) -> None:
        self._capacity = capacity
        self._span = span  # tokens kept after each n-gram
        self._table: dict[bytes, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._table)

    def add(self, history: np.ndarray) -> None:
        h = np.ascontiguousarray(history, dtype=np.int32)
        n = NGRAM_MAX
        for e in range(n - 1, int(h.shape[0]) - 1):
            key = h[e - n + 1 : e + 1].tobytes()
            self._table.pop(key, None)  # re-inserted: now the newest
            self._table[key] = h[e + 1 : e + 1 + self._span].copy()
        while len(self._table) > self._capacity:
            del self._table[next(iter(self._table))]

    def draft(self, history: np.ndarray, max_len: int) -> np.ndarray:
        h = np.ascontiguousarray(history, dtype=np.int32)
        if max_len <= 0 or h.shape[0] < NGRAM_MAX:
            return np.zeros(0, dtype=np.int32)
        got = self._table.get(h[-NGRAM_MAX:].tobytes())
        return np.zeros(0, dtype=np.int32) if got is None else got[:max_len].copy()


def choose_draft_len(acceptance: float, row_price: float, available: int, draft_max: int) -> int:
    """The largest k <= min(available, draft_max) whose k-th draft token still pays:
    acceptance**k > row_price (expected extra tokens against the price of one more row, in
    tokens of plain throughput). 0 if none does."""
    limit = min(available, draft_max)
    if limit <= 0 or acceptance <= 0:
        return 0
    if acceptance >= 1:
        return limit
    if row_price <= 0:
        return limit
    if row_price >= 1:
        return 0 if acceptance <= row_price else limit
    k = math.floor(math.log(row_price) / math.log(acceptance) - 1e-12)
    return max(0, min(limit, k))


@dataclass(slots=True)
class SpecState:
    """One request's drafting state: its acceptance estimate and the steps since its last draft."""

    accepted: float = _PRIOR_ACCEPTED  # decayed count of accepted draft tokens
    rejected: float = _PRIOR_REJECTED  # decayed count of verifications that rejected a token
    idle_steps: int = 0  # decode steps without a draft since the last one
    num_drafted: int = 0  # draft tokens this request had verified
    num_accepted: int = 0  # of those, accepted

    @property
    def acceptance(self) -> float:
        """Estimated probability that the next draft token is right, given the previous ones were."""
        return self.accepted / (self.accepted + self.rejected)

    def observe(self, drafted: int, accepted: int) -> None:
        """A verification of `drafted` tokens accepted the first `accepted` of them."""
        self.num_drafted += drafted
        self.num_accepted += accepted
        self.accepted = self.accepted * _DECAY + accepted
        self.rejected = self.rejected * _DECAY + (1 if accepted < drafted else 0)
        self.idle_steps = 0

    def probe_due(self) -> bool:
        """A request whose gate stayed closed PROBE_EVERY steps drafts once more (1 token at least)."""
        return self.idle_steps >= PROBE_EVERY


@dataclass(slots=True)
class CostModel:
    """Online step costs: a plain decode step's time per batch size, and one extra row's.

    Fed with every decode-only step (`observe`); `row_price(batch)` is one extra row's cost in
    tokens of that batch's plain throughput (row_cost * batch / step_time)."""

    step_s: dict[int, float] = field(default_factory=dict)  # batch size -> EMA of a plain step
    row_s: float | None = None  # EMA of one extra row's cost, seconds
    num_plain: int = 0
    num_drafted: int = 0

    def observe(self, batch: int, rows: int, seconds: float) -> None:
        """A decode-only step of `batch` slots and `rows` rows (batch + draft rows) took `seconds`."""
        if batch <= 0 or seconds <= 0:
            return
        extra = rows - batch
        if extra == 0:
            old = self.step_s.get(batch)
            self.step_s[batch] = seconds if old is None else old + _EMA * (seconds - old)
            self.num_plain += 1
            return
        base = self._plain(batch)
        if base is None:
            return
        sample = max(0.0, (seconds - base) / extra)
        self.row_s = sample if self.row_s is None else self.row_s + _EMA * (sample - self.row_s)
        self.num_drafted += 1

    def _plain(self, batch: int) -> float | None:
        got = self.step_s.get(batch)
        if got is not None:
            return got
        if not self.step_s:
            return None
        # the nearest measured batch size, scaled as if the step cost grew with the batch
        near = min(self.step_s, key=lambda b: abs(b - batch))
        return self.step_s[near]

    def row_price(self, batch: int) -> float:
        """One extra row in tokens of plain throughput at this batch size (0 before any plain
        step was measured: the first steps may draft, which is how the row cost gets measured)."""
        base = self._plain(batch)
        if base is None or base <= 0:
            return 0.0
        row = self.row_s if self.row_s is not None else _PRIOR_ROW_FRACTION * base
        return row * batch / base


class Drafter:
    """The scheduler's drafting policy: for one decoding request, the draft tokens of its next
    step (possibly none), from its history, the shared pool and the cost gate.

    `draft_max`: the most draft tokens one step carries per slot (keep draft_max + 1 within the
    pool's rows per step, so a sliding-window ring can take the rejected rows back).
    `gate`: False drafts whenever a match exists (tests; measurements of the gate itself)."""

    def __init__(self, draft_max: int, *, gate: bool = True, pool: NgramPool | None = None) -> None:
        if draft_max < 1:
            raise ValueError(f"draft_max={draft_max} must be >= 1")
        self.draft_max = draft_max
        self.gate = gate
        self.pool = pool
        self.cost = CostModel()

    def draft(self, state: SpecState, history: np.ndarray, room: int, batch: int) -> np.ndarray:
        """int32 [k] draft tokens to verify after `history` (the slot's tokens and the pending
        token), k <= room (the tokens the request and the slot still have room for, minus one
        for the token the last row yields); empty: a plain step. Counts the step in `state`."""
        limit = min(room, self.draft_max)
        if self.gate and limit > 0:
            k = choose_draft_len(state.acceptance, self.cost.row_price(batch), limit, limit)
            if k == 0 and state.probe_due():
                k = min(2, limit)
            limit = k
        got = np.zeros(0, dtype=np.int32)
        if limit > 0:
            # the own history's longest matches first, then the shared pool's (as long), then
            # the own history's shorter ones
            got = ngram_draft(history, limit, ngram_min=NGRAM_MAX)
            if got.size == 0 and self.pool is not None:
                got = self.pool.draft(history, limit)
            if got.size == 0:
                got = ngram_draft(history, limit, ngram_max=NGRAM_MAX - 1)
        if got.size == 0:
            state.idle_steps += 1
        return got
