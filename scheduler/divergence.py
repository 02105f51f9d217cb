"""Why a prompt reused what it did: the divergence point and the reason for any shortfall.

Design: routing (policy.route) already values every source; this module turns its decision into
an answer a user can act on. Two lengths frame it:

    prompt   |==========================|------------------|
             0        reused            shared_len        L
                      (what the request did not compute)  (longest common prefix with anything
                                                           the server holds now: live slots and
                                                           checkpoints of both tiers)

- `shared_len` is where the prompt diverged from the best source held; the gateway maps that
  offset to the rendered part it falls in (system, tools, message i, generation prompt).
- When the request reused less than it shares (minus the last prompt token, always refed), the
  reason is the server's: a sliding-window ring or recurrent state that cannot be cut back that
  far (`WINDOW`, `RECURRENT`), a busy slot that cannot be copied (`BUSY`), or reuse turned off.
- When nothing held shares more, either the server once held more and let it go
  (`EvictionLog`: a slot overwritten, a checkpoint evicted or not taken for the byte budget), or
  the prompt itself changed there (`PROMPT_CHANGED`), or nothing ever shared it (`COLD`).

The eviction log is bounded (total tokens, oldest out first) and holds token ids only, the ones
the scheduler already had; it only answers how long a prefix of a prompt it once held.
"""

from __future__ import annotations

import enum
import itertools
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .prefix_index import PrefixIndex

MAX_LOGGED_TOKENS = 1 << 20  # token ids kept by the eviction log (4 MiB)


class MissReason(str, enum.Enum):
    """Why a request reused less than its whole prompt (but its last token)."""

    NONE = "none"  # reused all the prompt but its last token
    PROMPT_CHANGED = "prompt_changed"  # the prompt differs from everything held at `shared_len`
    COLD = "cold"  # nothing held shares any of it (first sight, or a restart without a disk tier)
    WINDOW = "window"  # a live slot shared more, but its sliding-window ring cannot be cut back
    RECURRENT = "recurrent"  # a live slot shared more, but its recurrent state cannot be cut back
    BUSY = "busy"  # a slot held by another request shared more and this pool cannot copy it
    EVICTED = "evicted"  # the server held more of it once: a slot overwritten or a checkpoint evicted
    BUDGET = "budget"  # a checkpoint that would have held more was not taken: no room in the budget
    REUSE_OFF = "reuse_off"  # --no-reuse


class Evicted(str, enum.Enum):
    """What the eviction log remembers of a prefix the server let go."""

    SLOT = "slot"  # a slot's record overwritten by another conversation
    CHECKPOINT = "checkpoint"  # a memory checkpoint evicted and not written to disk
    NOT_TAKEN = "not_taken"  # a capture refused for want of room


_REASON_OF = {
    Evicted.SLOT: MissReason.EVICTED,
    Evicted.CHECKPOINT: MissReason.EVICTED,
    Evicted.NOT_TAKEN: MissReason.BUDGET,
}


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a prompt diverged from what the server held, and why less was reused."""

    shared_len: int  # longest common prefix with any source held when it was routed
    reused_len: int  # prompt tokens the request did not compute
    reason: MissReason
    evicted_len: int = 0  # longest common prefix with what the server let go (EVICTED / BUDGET)


class EvictionLog:
    """Prefixes the server let go, for `longest(prompt)`: at most `max_tokens` token ids, the
    oldest forgotten first. Not thread-safe (the scheduler's loop owns it)."""

    def __init__(self, max_tokens: int = MAX_LOGGED_TOKENS) -> None:
        self.max_tokens = max_tokens
        self.num_tokens = 0
        self._index = PrefixIndex()
        self._kinds: OrderedDict[str, Evicted] = OrderedDict()  # key -> kind, oldest first
        self._keys = (f"e{i}" for i in itertools.count())

    def __len__(self) -> int:
        return len(self._kinds)

    def add(self, kind: Evicted, tokens: np.ndarray) -> None:
        """Remember that the server let `tokens` go (kept: a copy)."""
        n = int(tokens.shape[0])
        if n == 0 or n > self.max_tokens:
            return
        if next(self._index.starting_with(tokens), None) is not None:
            return  # an entry logged already holds all of it
        for key in self._index.prefixes_of(tokens):  # the new entry covers them
            self._forget(key)
        while self._kinds and self.num_tokens + n > self.max_tokens:
            self._forget(next(iter(self._kinds)))
        key = next(self._keys)
        self._index.add(key, np.array(tokens, dtype=np.int32, copy=True))
        self._kinds[key] = kind
        self.num_tokens += n

    def _forget(self, key: str) -> None:
        self.num_tokens -= int(self._index.tokens(key).shape[0])
        self._index.remove(key)
        del self._kinds[key]

    def longest(self, prompt: np.ndarray) -> tuple[int, Evicted | None]:
        """The longest common prefix of `prompt` with a logged entry, and that entry's kind."""
        for key, common in self._index.sharing(prompt):
            return common, self._kinds[key]
        return 0, None


def explain(
    *,
    prompt_len: int,
    reused_len: int,
    shared_len: int,
    refused_by: MissReason | None,
    evicted: tuple[int, Evicted | None],
    reuse_enabled: bool = True,
) -> Divergence:
    """The divergence of a routed prompt (module docstring). `refused_by`: WINDOW, RECURRENT or
    BUSY when routing saw a live slot share more than it could supply (policy.RouteDecision)."""
    want = max(0, prompt_len - 1)
    evicted_len, kind = evicted
    if not reuse_enabled:
        return Divergence(shared_len, reused_len, MissReason.REUSE_OFF)
    if reused_len >= want:
        return Divergence(shared_len, reused_len, MissReason.NONE)
    if reused_len < min(shared_len, want) and refused_by is not None:
        return Divergence(shared_len, reused_len, refused_by)
    if kind is not None and evicted_len > max(shared_len, reused_len):
        return Divergence(shared_len, reused_len, _REASON_OF[kind], evicted_len)
    if shared_len == 0:
        return Divergence(shared_len, reused_len, MissReason.COLD)
    return Divergence(shared_len, reused_len, MissReason.PROMPT_CHANGED)
