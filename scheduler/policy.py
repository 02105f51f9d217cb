"""Routing: where a request's prompt prefix comes from and which slot it overwrites.

Design: pure functions over plain views (no pool, no locks), so routing is unit- and
property-testable. Two choices are made separately:

1. Source (what is reused): the most prompt tokens any source can supply, over every slot's live
   record (idle or busy) and the checkpoint matches handed in. A source supplies
   min(common prefix, prompt_len - 1) tokens: the last prompt token is always refed to get its
   logits, which is the exact-prefix rule (prompt equal to or a prefix of a record costs 1 token).
   Equal supply prefers, in order (`SourceRank`): a free slot, a busy slot, a memory checkpoint,
   a disk checkpoint; then the lower slot number or the earlier checkpoint match.
2. Destination (what is lost): among free slots, the one whose overwrite destroys the least.
   Rewinding the source slot itself keeps `reuse_len` tokens; its cut tail counts as lost unless
   it is no longer than what is kept (then it is a discarded reply or an edited last turn of the
   same conversation). Every other destination loses its whole record. Losses are discounted by
   how long the slot has been idle (half-life), so a stale conversation yields to a fresh one.
   Equal discounted losses prefer, in order: more reused tokens, a rewind (no copy), fewer raw
   tokens lost, the request's own session's slot, the longest idle slot, the lowest slot number.

Session affinity: clients name their conversation (`prompt_cache_key`, `metadata.user_id`,
session headers; the gateway hashes them). It is a tie-breaker and an eviction weight, never a
reason to reuse less: among sources supplying equally many tokens the session's own slot wins,
and overwriting a slot that holds another session's conversation counts OTHER_SESSION_WEIGHT
times its discounted loss, so named conversations outlive anonymous traffic.

A request whose prefix is still being prefilled by another request waits for it
(`RouteAction.WAIT_SHARED`) instead of computing the same rows twice.

Rewind reach: a slot whose sliding-window layers live in a ring can only be cut back to its
`min_truncate_len`, and a restored checkpoint only to the pool's `restored_min_truncate_len` of
its length (candidates and matches carry both). A source that would have to be cut deeper
supplies nothing: each source is valued by what it can really supply now, so such a prompt
restores the best checkpoint at or below its common prefix, or goes cold. The decision records
what the window cost: tokens a live slot shared but no source could supply (`window_lost_tokens`).

Recurrent state (interface.py) is the same rule at its limit: a slot's floor is its length and a
restored checkpoint's is its own length, so a live slot supplies only when its whole record is a
prefix of the prompt (an exact extension; REWIND then cuts to the slot's own length, a no-op),
a checkpoint only when it ends at or below the divergence, and a COPY takes a whole slot.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .divergence import MissReason
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


class RestoreReason(str, enum.Enum):
    """Why a request restored a checkpoint instead of reusing a live slot."""

    WINDOW = "window"  # a live slot shared as much, but its ring cannot be cut back that far
    EVICTED = "evicted"  # no live slot shares as much (overwritten, or before a restart)


class CheckpointTier(str, enum.Enum):
    MEMORY = "memory"  # in-process store
    DISK = "disk"  # opt-in disk tier


class Affinity(enum.Enum):
    """A slot's session against the request's (the clients' session keys, hashed by the gateway)."""

    NONE = "none"  # either has no session key
    SAME = "same"  # the slot's last request had the request's key
    OTHER = "other"  # the slot holds another session's conversation


OTHER_SESSION_WEIGHT = 2.0  # an overwrite of another session's conversation counts this much more


@dataclass(frozen=True, slots=True)
class SlotCandidate:
    slot: int
    tokens: np.ndarray  # int32 [n] the slot's live record (read only)
    is_free: bool  # no request holds the slot
    idle_s: float  # seconds since the slot was last used (0 while busy)
    prefill_target: np.ndarray | None = None  # int32 [m] prompt a running prefill computes toward
    min_truncate_len: int = 0  # shortest length the slot can be cut back to (pool's ring reach)
    affinity: Affinity = Affinity.NONE  # tie-breaker and eviction weight only (module docstring)


@dataclass(frozen=True, slots=True)
class CheckpointMatch:
    tier: CheckpointTier
    key: str  # store key
    num_tokens: int  # tokens the checkpoint holds
    common: int  # common prefix with the prompt
    min_truncate_len: int = 0  # shortest length a slot restored from it can be cut back to


@dataclass(frozen=True, slots=True)
class Capabilities:
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
    window_refused: bool = False  # a live slot shared more than its ring could be cut back to
    window_lost_tokens: int = 0  # prompt tokens a live slot shared but no source could supply
    restore_reason: RestoreReason | None = None  # for RESTORE_*: why not a live slot
    shared_len: int = 0  # longest raw common prefix with any slot or checkpoint match (divergence.py)
    refused_by: MissReason | None = (
        None  # WINDOW / RECURRENT / BUSY: a live slot shared more than it supplied
    )


class SourceRank(enum.IntEnum):
    """Order among sources that supply equally many tokens: cheapest first."""

    FREE_SLOT = 0
    BUSY_SLOT = 1
    MEMORY_CHECKPOINT = 2
    DISK_CHECKPOINT = 3


@dataclass(frozen=True, slots=True)
class _Source:
    """A source other than rewinding the destination itself: a slot to copy, or a checkpoint."""

    reuse_len: int  # prompt tokens it supplies
    rank: SourceRank
    slot: SlotCandidate | None = None  # the slot to copy from
    checkpoint: CheckpointMatch | None = None  # or the checkpoint to restore
    match_index: int = 0  # position among the checkpoint matches (tie order)

    def sort_key(self) -> tuple[int, SourceRank, bool, int]:
        """Most tokens first, then the cheaper kind, then the request's own session's slot, then
        the lower slot or earlier match."""
        tie = self.slot.slot if self.slot is not None else self.match_index
        other = self.slot is None or self.slot.affinity is not Affinity.SAME
        return (-self.reuse_len, self.rank, other, tie)


@dataclass(frozen=True, slots=True)
class _Option:
    """Running the prompt in one free destination slot: what it reuses and what it loses."""

    dest: SlotCandidate
    reuse_len: int
    source: _Source | None  # None: rewind dest itself (or cold, with nothing to reuse)
    kept: int  # tokens of dest's record kept (> 0 only for a rewind)
    lost: int  # raw tokens of dest's record destroyed
    counts: bool  # the loss counts (not a discarded tail no longer than what is kept)
    effective_loss: float  # lost, discounted by dest's idle time; 0 when it does not count

    def sort_key(self) -> tuple[float, int, bool, int, bool, float, int]:
        """Least discounted loss; then more reuse, a rewind, fewer raw tokens lost, the request's
        own session's slot, the longest idle slot, the lowest slot number (the module docstring
        states the same order)."""
        return (
            self.effective_loss,
            -self.reuse_len,
            self.kept == 0,  # False (a rewind) sorts first
            self.lost,
            self.dest.affinity is not Affinity.SAME,
            -self.dest.idle_s,
            self.dest.slot,
        )


def _usable(common: int, held: int, prompt_len: int, floor: int) -> int:
    """Prompt tokens a source holding `held` tokens, sharing `common`, can supply when it can
    be cut back to `floor` at the shortest."""
    u = min(common, prompt_len - 1)
    if u < held and u < floor:
        return 0  # would need cutting the source deeper than its state allows
    return max(u, 0)


def _refusal(
    prompt: np.ndarray,
    slots: Sequence[SlotCandidate],
    commons: dict[int, int],
    caps: Capabilities,
    best_u: int,
) -> MissReason | None:
    """Why a live slot that shares more than the best source supplied could not supply it: its
    state cannot be cut back that far (a ring: WINDOW; recurrent state, whose floor is its
    length: RECURRENT), or it is busy and this pool cannot copy (BUSY). None if none did."""
    L = int(prompt.shape[0])
    reason: MissReason | None = None
    for s in slots:
        raw = min(commons[s.slot], L - 1)
        if raw <= best_u:
            continue
        held = int(s.tokens.shape[0])
        if not s.is_free and not caps.can_copy:
            reason = reason or MissReason.BUSY
        elif _usable(commons[s.slot], held, L, s.min_truncate_len) < raw:
            return MissReason.RECURRENT if s.min_truncate_len >= held else MissReason.WINDOW
    return reason


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
        s.slot: _usable(commons[s.slot], int(s.tokens.shape[0]), L, s.min_truncate_len)
        for s in slots
        if s.is_free
    }
    # What live slots share, ignoring their rings (full KV would supply this much).
    live_raw = max([0, *(min(commons[s.slot], L - 1) for s in slots if s.is_free or caps.can_copy)])
    # Sources other than a rewind, best first.
    sources: list[_Source] = []
    if caps.can_copy:
        for s in slots:
            u = _usable(commons[s.slot], int(s.tokens.shape[0]), L, s.min_truncate_len)
            if u > 0:
                rank = SourceRank.FREE_SLOT if s.is_free else SourceRank.BUSY_SLOT
                sources.append(_Source(u, rank, slot=s))
    live_ok = max([0, *(c.reuse_len for c in sources), *rewind_u.values()])
    if reuse_enabled and caps.can_snapshot:
        for i, m in enumerate(checkpoints):
            u = _usable(m.common, m.num_tokens, L, m.min_truncate_len)
            if u > 0:
                is_memory = m.tier is CheckpointTier.MEMORY
                rank = SourceRank.MEMORY_CHECKPOINT if is_memory else SourceRank.DISK_CHECKPOINT
                sources.append(_Source(u, rank, checkpoint=m, match_index=i))
    sources.sort(key=_Source.sort_key)
    best_u = max([sources[0].reuse_len if sources else 0, *rewind_u.values()])
    refused = live_raw > live_ok  # a ring kept a live slot from supplying all it shares
    window_lost = max(0, live_raw - best_u)  # ... and no other source made up for it
    shared = max([0, *commons.values(), *(m.common for m in checkpoints)]) if reuse_enabled else 0
    refused_by = _refusal(prompt, slots, commons, caps, best_u)

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

    def option(d: SlotCandidate) -> _Option:
        # The best source that is not d itself (copying a slot onto itself is a rewind).
        ext = next((c for c in sources if c.slot is None or c.slot.slot != d.slot), None)
        u_ext = ext.reuse_len if ext is not None else 0
        u_rw = rewind_u[d.slot]
        held = int(d.tokens.shape[0])
        source: _Source | None
        if u_rw > 0 and u_rw >= u_ext:
            saved, source, kept = u_rw, None, u_rw
        else:
            saved, source, kept = u_ext, ext, 0
        lost = held - kept
        counts = lost > 0 and not (kept > 0 and lost <= kept)
        effective = lost * 0.5 ** (d.idle_s / idle_half_life_s) if counts else 0.0
        if d.affinity is Affinity.OTHER:
            effective *= OTHER_SESSION_WEIGHT
        return _Option(d, saved, source, kept, lost, counts, effective)

    best = min((option(d) for d in free), key=_Option.sort_key)
    dest = best.dest.slot
    dest_len = int(best.dest.tokens.shape[0])

    def decided(
        action: RouteAction,
        reuse_len: int,
        common: int,
        live_len: int,
        *,
        src_slot: int | None = None,
        checkpoint: CheckpointMatch | None = None,
        restore_reason: RestoreReason | None = None,
    ) -> RouteDecision:
        """A decision onto `dest`, with what each of them reports of the choice: the
        destination's loss, the window's refusals and the longest prefix shared."""
        return RouteDecision(
            action,
            dest,
            reuse_len,
            common,
            live_len,
            src_slot=src_slot,
            checkpoint=checkpoint,
            lost_tokens=best.lost,
            evicts=best.counts,
            window_refused=refused,
            window_lost_tokens=window_lost,
            shared_len=shared,
            refused_by=refused_by,
            restore_reason=restore_reason,
        )

    if best.reuse_len == 0:
        return decided(RouteAction.COLD, 0, commons.get(dest, 0), dest_len)
    src = best.source
    if src is None:
        return decided(RouteAction.REWIND, best.reuse_len, commons[dest], dest_len)
    if src.slot is not None:
        return decided(
            RouteAction.COPY,
            best.reuse_len,
            commons[src.slot.slot],
            int(src.slot.tokens.shape[0]),
            src_slot=src.slot.slot,
        )
    ck = src.checkpoint
    assert ck is not None
    action = RouteAction.RESTORE_MEMORY if ck.tier is CheckpointTier.MEMORY else RouteAction.RESTORE_DISK
    return decided(
        action,
        best.reuse_len,
        ck.common,
        ck.num_tokens,
        checkpoint=ck,
        restore_reason=RestoreReason.WINDOW if live_raw >= best.reuse_len else RestoreReason.EVICTED,
    )
