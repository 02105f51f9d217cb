"""Routing: where a request's prompt prefix comes from and which slot it overwrites.

Design: pure functions over plain views (no pool, no locks), so routing is unit- and
property-testable. Two choices are made separately:

1. Source (what is reused): the most prompt tokens any source can supply, over every slot's live
   record (idle or busy) and the checkpoint matches handed in. A source supplies
   min(common prefix, prompt_len - 1) tokens: the last prompt token is always refed to get its
   logits, which is the exact-prefix rule (prompt equal to or a prefix of a record costs 1 token).
2. Destination (what is lost): among free slots, the one whose overwrite destroys the least.
   Rewinding the source slot itself keeps `reuse_len` tokens; its cut tail counts as lost unless
   it is no longer than what is kept (then it is a discarded reply or an edited last turn of the
   same conversation). Every other destination loses its whole record. Losses are discounted by
   how long the slot has been idle (half-life), so a stale conversation yields to a fresh one.
   Ties prefer a rewind (no copy), then fewer raw tokens lost, then the longest idle slot.

A request whose prefix is still being prefilled by another request waits for it
(`RouteAction.WAIT_SHARED`) instead of computing the same rows twice.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .prefix import common_prefix_len
from .request import ReuseSource


class RouteAction(enum.Enum):
    REWIND = "rewind"  # truncate the destination slot to reuse_len (it is the source)
    COPY = "copy"  # copy reuse_len rows from src_slot into the destination
    RESTORE_MEMORY = "checkpoint_memory"  # restore an in-memory checkpoint, truncate to reuse_len
    RESTORE_DISK = "checkpoint_disk"  # load a disk checkpoint first, then restore it
    COLD = "cold"  # clear the destination and prefill the whole prompt
    WAIT_SHARED = "wait_shared"  # another request is prefilling more of this prompt: wait for it
    WAIT_SLOT = "wait_slot"  # no free slot

    @property
    def reuse_source(self) -> ReuseSource:
        return _SOURCE_OF[self]


_SOURCE_OF = {
    RouteAction.REWIND: ReuseSource.REWIND,
    RouteAction.COPY: ReuseSource.COPY,
    RouteAction.RESTORE_MEMORY: ReuseSource.CHECKPOINT_MEMORY,
    RouteAction.RESTORE_DISK: ReuseSource.CHECKPOINT_DISK,
    RouteAction.COLD: ReuseSource.NONE,
    RouteAction.WAIT_SHARED: ReuseSource.NONE,
    RouteAction.WAIT_SLOT: ReuseSource.NONE,
}


class CheckpointTier(enum.Enum):
    MEMORY = "memory"  # in-process store
    DISK = "disk"  # opt-in disk tier


@dataclass(frozen=True, slots=True)
class SlotCandidate:
    slot: int
    tokens: np.ndarray  # int32 [n] the slot's live record (read only)
    is_free: bool  # no request holds the slot
    idle_s: float  # seconds since the slot was last used (0 while busy)
    prefill_target: np.ndarray | None = None  # int32 [m] prompt a running prefill computes toward


@dataclass(frozen=True, slots=True)
class CheckpointMatch:
    tier: CheckpointTier
    key: str  # store key
    num_tokens: int  # tokens the checkpoint holds
    common: int  # common prefix with the prompt


@dataclass(frozen=True, slots=True)
class Capabilities:
    can_truncate: bool = True
    can_copy: bool = True
    can_snapshot: bool = True


@dataclass(frozen=True, slots=True)
class RouteDecision:
    action: RouteAction
    dest: int | None  # slot to use; None for the WAIT actions
    reuse_len: int  # prompt tokens the source supplies (not computed)
    common: int  # raw common prefix with the source (before the prompt_len - 1 cap)
    live_len: int  # tokens the source held (slot record or checkpoint); dest's for COLD
    src_slot: int | None = None  # COPY source, WAIT_SHARED leader
    checkpoint: CheckpointMatch | None = None
    lost_tokens: int = 0  # tokens of the destination's record destroyed
    evicts: bool = False  # the loss counts: worth a checkpoint capture before overwriting


def _usable(common: int, held: int, prompt_len: int, can_truncate: bool) -> int:
    """Prompt tokens a source holding `held` tokens, sharing `common`, can supply."""
    u = min(common, prompt_len - 1)
    if not can_truncate and u != held:
        return 0  # would need cutting the source's tail
    return max(u, 0)


def route(
    prompt: np.ndarray,
    slots: Sequence[SlotCandidate],
    checkpoints: Sequence[CheckpointMatch] = (),
    *,
    caps: Capabilities = Capabilities(),
    idle_half_life_s: float = 600.0,
    reuse_enabled: bool = True,
) -> RouteDecision:
    """Decide where `prompt` (int32 [L], L >= 1) runs. See the module docstring."""
    L = int(prompt.shape[0])
    commons = {s.slot: (common_prefix_len(prompt, s.tokens) if reuse_enabled else 0) for s in slots}
    rewind_u = {
        s.slot: _usable(commons[s.slot], int(s.tokens.shape[0]), L, caps.can_truncate)
        for s in slots
        if s.is_free
    }
    # External sources, best first: (reuse_len, rank, tie, source); rank orders equal reuse:
    # a free slot, a busy slot, a memory checkpoint, a disk checkpoint.
    sources: list[tuple[int, int, int, object]] = []
    if caps.can_copy:
        for s in slots:
            u = min(commons[s.slot], L - 1)
            if u > 0:
                sources.append((u, 0 if s.is_free else 1, s.slot, s))
    if reuse_enabled and caps.can_snapshot:
        for i, m in enumerate(checkpoints):
            u = _usable(m.common, m.num_tokens, L, caps.can_truncate)
            if u > 0:
                sources.append((u, 2 if m.tier is CheckpointTier.MEMORY else 3, i, m))
    sources.sort(key=lambda t: (-t[0], t[1], t[2]))
    best_u = max([sources[0][0] if sources else 0, *rewind_u.values()])

    # In-flight sharing: a running prefill will hold more of this prompt than anything now.
    if reuse_enabled and caps.can_copy:
        for s in slots:
            if s.prefill_target is None:
                continue
            future = min(common_prefix_len(prompt, s.prefill_target), L - 1)
            if future > best_u:
                return RouteDecision(
                    RouteAction.WAIT_SHARED,
                    None,
                    0,
                    future,
                    int(s.tokens.shape[0]),
                    src_slot=s.slot,
                )

    free = [s for s in slots if s.is_free]
    if not free:
        return RouteDecision(RouteAction.WAIT_SLOT, None, 0, 0, 0)

    def plan_for(d: SlotCandidate):
        """(sort key, reuse_len, source or None for a rewind, lost, counts) for destination d."""
        ext = next((t for t in sources if not (t[1] <= 1 and t[3].slot == d.slot)), None)
        u_ext = ext[0] if ext else 0
        u_rw = rewind_u[d.slot]
        held = int(d.tokens.shape[0])
        if u_rw > 0 and u_rw >= u_ext:
            saved, source, kept = u_rw, None, u_rw
        else:
            saved, source, kept = u_ext, ext, 0
        lost = held - kept
        counts = lost > 0 and not (kept > 0 and lost <= kept)
        effective = lost * 0.5 ** (d.idle_s / idle_half_life_s) if counts else 0.0
        key = (effective, -saved, 0 if kept else 1, lost, -d.idle_s, d.slot)
        return key, saved, source, lost, counts

    key, saved, source, lost, counts = min((plan_for(d) for d in free), key=lambda t: t[0])
    dest = key[-1]
    dest_len = int(next(s for s in free if s.slot == dest).tokens.shape[0])
    if saved == 0:
        return RouteDecision(
            RouteAction.COLD,
            dest,
            0,
            commons.get(dest, 0),
            dest_len,
            lost_tokens=lost,
            evicts=counts,
        )
    if source is None:
        return RouteDecision(
            RouteAction.REWIND,
            dest,
            saved,
            commons[dest],
            dest_len,
            lost_tokens=lost,
            evicts=counts,
        )
    src = source[3]
    if source[1] <= 1:
        return RouteDecision(
            RouteAction.COPY,
            dest,
            saved,
            commons[src.slot],
            int(src.tokens.shape[0]),
            src_slot=src.slot,
            lost_tokens=lost,
            evicts=counts,
        )
    action = RouteAction.RESTORE_MEMORY if src.tier is CheckpointTier.MEMORY else RouteAction.RESTORE_DISK
    return RouteDecision(
        action,
        dest,
        saved,
        src.common,
        src.num_tokens,
        checkpoint=src,
        lost_tokens=lost,
        evicts=counts,
    )
