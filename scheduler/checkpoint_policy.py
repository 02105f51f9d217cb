"""Checkpoint policy: both tiers and the six capture rules, behind one object.

Design: the scheduler asks two questions and reports two facts. `matches(prompt)` gives the
routing its checkpoint candidates; `wants(...)` says whether a snapshot of given tokens is worth
taking now (not stored yet, and there is room in memory or a disk tier to take it). It reports
each routed request with `record_routed(...)`, which remembers the prompt (rule common_prefix
compares successive unmatched prompts) and answers at which prompt offsets to snapshot it (rules
hint / common_prefix / prompt_end / interval / turn); `keep(...)` files a snapshot that was taken.
Captures on evict are decided by the routing (`RouteDecision.evicts`) and filed here the same
way. The memory tier holds distinct rows (checkpoint_store.py): `live_records` tells it which
entries duplicate a live slot, so those are evicted first. Every capture except prompt_end,
interval and turn ones is written through to the disk tier, and every memory eviction except
prompt_end and interval ones goes there too (turn captures reach disk only that way).

Rule interval matters for pools that keep sliding-window layers in a ring: such a slot can only
be cut back about one step, so a prompt that diverges from a live conversation far behind its
end (an edited early turn) needs a checkpoint at or below the divergence. Every multiple of
`interval_tokens` that a prefill crosses is snapshotted; the restore then prefills at most
interval_tokens of gap. `auto_interval_tokens` sizes it from the window and the memory budget.

Recurrent state (interface.py: a slot extends only, a checkpoint restores only its own length)
is the extreme case: no live slot can be cut back at all, so every point a later prompt may
diverge at needs its own checkpoint at or below it. Besides the rules above:
- rule turn: the prompt offsets where turns start as the chat template renders them (the
  request's `turn_offsets`: the last user message, each assistant turn), on any pool whose
  restored checkpoints cannot be cut back (rings too): an edited or regenerated turn diverges
  there; kept in memory, spilled to disk when memory evicts them;
- rule prompt_end takes L - 1 instead of L (a checkpoint of the whole prompt could not serve a
  resend of it: the last prompt token is always refed) and is taken even when the prompt was
  mostly reused (its live source cannot be cut back to it later);
- rule interval is on by default, K sized from the snapshot's bytes (tens of MiB for a real
  Qwen3.5 state) and the budget, with no window to respect.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence

import numpy as np

from .checkpoint_store import (
    CaptureRule,
    LiveRecord,
    MemoryCheckpointStore,
    RestoredFloor,
    no_floor,
    tokens_key,
    usable_len,
)
from .config import SchedulerConfig
from .disk_store import DiskCheckpointStore
from .divergence import Evicted, EvictionLog
from .policy import CheckpointMatch, CheckpointTier, RouteAction, RouteDecision
from .prefix import common_prefix_len
from .stats import CheckpointEventKind

# (kind, tier, rule, num_bytes, num_tokens) -> None: forwarded to StatsSink.on_checkpoint
EmitFn = Callable[[CheckpointEventKind, CheckpointTier, CaptureRule | None, int, int], None]

# never sent to disk: per-request captures, many and large; evict captures save what matters
_MEMORY_ONLY = frozenset({CaptureRule.PROMPT_END, CaptureRule.INTERVAL})
# not written through (one or more per request), but sent to disk when memory evicts them: a
# turn start is what no live slot can give back, so it outlives memory pressure and restarts
_SPILL_ONLY = frozenset({CaptureRule.TURN})


def is_recurrent(restored_floor: RestoredFloor) -> bool:
    """Whether the pool keeps state that cannot be rewound at all: a restored checkpoint of even
    one token cannot be cut back (interface.py; a ring answers 0 within its window)."""
    return restored_floor(1) >= 1


def auto_interval_tokens(
    *,
    kv_window: int | None,
    num_slots: int,
    ctx_len: int,
    budget_bytes: int,
    snapshot_nbytes: Callable[[int], int],
    min_tokens: int,
    restored_floor: RestoredFloor = no_floor,
) -> int:
    """Rule interval's K when the operator did not set one: 0 (off) for full KV, which can be
    cut back anywhere; for a ring (at least the window) or recurrent state, large enough that
    every slot's conversation at full context, checkpointed every K tokens, fits in half the
    memory budget (ctx_len / K checkpoints of ctx_len / 2 tokens on average per slot). With
    snapshots of tens of MiB that K can exceed ctx_len: then the budget holds no grid and the
    other rules' captures are all there is."""
    recurrent = is_recurrent(restored_floor)
    if (kv_window is None and not recurrent) or budget_bytes <= 0:
        return 0
    per_slot = ctx_len * snapshot_nbytes(max(1, ctx_len // 2))
    k = math.ceil(2 * num_slots * per_slot / budget_bytes)
    return max(kv_window or 0, min_tokens, k)


class CheckpointPolicy:
    def __init__(
        self,
        config: SchedulerConfig,
        *,
        can_snapshot: bool,
        fingerprint: str,
        snapshot_nbytes: Callable[[int], int],
        emit: EmitFn,
        restored_floor: RestoredFloor = no_floor,
        interval_tokens: int = 0,
        live_records: Callable[[], Sequence[LiveRecord]] = tuple,
    ) -> None:
        self._config = config
        self.enabled = can_snapshot and config.reuse_enabled
        self.memory = MemoryCheckpointStore(
            config.checkpoint_memory_bytes if self.enabled else 0, restored_floor
        )
        self.disk: DiskCheckpointStore | None = None
        if config.kv_disk_dir is not None and self.enabled:
            self.disk = DiskCheckpointStore(
                config.kv_disk_dir, config.kv_disk_space_bytes, fingerprint, restored_floor
            )
        self._snapshot_nbytes = snapshot_nbytes
        self._floor = restored_floor
        self.recurrent = is_recurrent(restored_floor)  # prompt_end at L - 1, turn captures
        # restored checkpoints cannot be cut back to an earlier turn: rings and recurrent state
        self.capture_turns = self.recurrent or restored_floor(1 << 30) > 0
        self.interval_tokens = interval_tokens  # rule interval's K; 0: off
        self._emit = emit
        self._live = live_records  # every slot's record and min_truncate_len, as planned
        self._last_unmatched: np.ndarray | None = None  # last prompt that found no live slot
        # prefixes the server let go: evicted or refused captures here, overwritten slots by
        # admission (divergence.py tells a user's miss from them)
        self.evictions = EvictionLog()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the disk tier (its index is rebuilt in the background)."""
        if self.disk is None:
            return

        def on_disk_event(kind: str, rule: str, num_bytes: int, n: int) -> None:
            event = CheckpointEventKind(kind)
            loop.call_soon_threadsafe(
                self._emit, event, CheckpointTier.DISK, _capture_rule(rule), num_bytes, n
            )

        self.disk.on_event = on_disk_event
        self.disk.start()

    async def wait_ready(self) -> None:
        if self.disk is not None:
            await asyncio.to_thread(self.disk.index_ready.wait)

    async def aclose(self) -> None:
        if self.disk is not None:
            await asyncio.to_thread(self.disk.close)

    @property
    def disk_bytes(self) -> int:
        return self.disk.bytes_used if self.disk is not None else 0

    # -- routing side ----------------------------------------------------------------------
    def matches(self, prompt: np.ndarray, staged: tuple[np.ndarray, bytes] | None) -> list[CheckpointMatch]:
        """Best candidate of each tier for `prompt`. A disk checkpoint already loaded for this
        request (`staged`) stands in for the disk tier, under its disk key. A candidate that
        supplies fewer than min_checkpoint_tokens tokens is left out: prefilling that few costs
        less than restoring a snapshot (the stores find any shared prefix, down to a BOS token
        every prompt starts with)."""
        if not self.enabled:
            return []
        least = self._config.min_checkpoint_tokens
        found: list[CheckpointMatch | None] = [self.memory.find(prompt, least)]
        if staged is not None:
            tokens, _ = staged
            c = common_prefix_len(prompt, tokens)
            n = len(tokens)
            found.append(CheckpointMatch(CheckpointTier.DISK, tokens_key(tokens), n, c, self._floor(n)))
        elif self.disk is not None:
            found.append(self.disk.find(prompt, self._floor, least))
        L = int(prompt.shape[0])
        return [
            m
            for m in found
            if m is not None and usable_len(m.common, m.num_tokens, L, m.min_truncate_len) >= least
        ]

    def record_routed(
        self, prompt: np.ndarray, hint: int | None, d: RouteDecision, turns: Sequence[int] = ()
    ) -> list[tuple[int, CaptureRule]]:
        """Note that `prompt` was routed by `d`, and return the prompt offsets to snapshot once
        the request's slot holds them, in ascending order (`turns`: where the template's turns
        start, rule turn). Not a pure query: a prompt that found no live slot becomes the one
        the next unmatched prompt is compared with."""
        if not self.enabled:
            return []
        cfg = self._config
        L = int(prompt.shape[0])
        points: dict[int, CaptureRule] = {}
        if hint is not None and hint >= cfg.min_checkpoint_tokens:
            points[hint] = CaptureRule.HINT
        if d.action not in (RouteAction.REWIND, RouteAction.COPY):  # found no live slot
            last, self._last_unmatched = self._last_unmatched, prompt
            if last is not None:
                c = common_prefix_len(prompt, last)
                if c >= cfg.min_checkpoint_tokens and c > d.reuse_len:
                    points.setdefault(c, CaptureRule.COMMON_PREFIX)
        # NOTE: a prompt mostly reused from a live slot or checkpoint is not captured again at
        # its end: its source still holds it, and capture-on-evict saves the slot when needed.
        # A snapshot copies every row of the prompt, so this keeps captures to fresh work.
        if self.capture_turns:  # no slot or checkpoint of this prompt can be cut back to them
            for t in turns:
                if d.reuse_len < t < L and t >= cfg.min_checkpoint_tokens:
                    points.setdefault(t, CaptureRule.TURN)
        if not cfg.capture_prompt_end:
            pass
        elif self.recurrent:  # L - 1: a resend refeeds the last token; its source cannot rewind
            if L - 1 > d.reuse_len and L - 1 >= cfg.min_checkpoint_tokens:
                points.setdefault(L - 1, CaptureRule.PROMPT_END)
        elif L >= cfg.min_checkpoint_tokens and L - d.reuse_len >= d.reuse_len:
            points.setdefault(L, CaptureRule.PROMPT_END)
        k = self.interval_tokens
        if k > 0:
            first = max(k * (d.reuse_len // k + 1), k * math.ceil(cfg.min_checkpoint_tokens / k))
            for p in range(first, L + 1, k):
                points.setdefault(p, CaptureRule.INTERVAL)
        return sorted(points.items())

    # -- capture side ----------------------------------------------------------------------
    def wants(self, tokens: np.ndarray, rule: CaptureRule) -> bool:
        """Whether a snapshot of exactly `tokens` is worth taking now: not held by a memory
        checkpoint already (exactly, or as the start of a longer one a restored slot can be cut
        back from), and room for it in memory (entries a live slot duplicates count as room) or
        on disk. Not a pure query: a memory checkpoint that already holds the rows takes the
        higher class of its rule and `rule`."""
        n = int(tokens.shape[0])
        if not self.enabled or n < self._config.min_checkpoint_tokens:
            return False
        holder = self.memory.covering(tokens)
        if holder is not None:
            self.memory.promote(holder.key, rule)
            return False
        if self.memory.can_fit(self._snapshot_nbytes(n), rule, tokens=tokens, live=self._live()):
            return True
        if (
            self.disk is not None
            and self.disk.is_usable
            and rule not in _MEMORY_ONLY
            and rule not in _SPILL_ONLY
        ):
            return True
        self.evictions.add(Evicted.NOT_TAKEN, tokens)
        return False

    def keep(self, tokens: np.ndarray, data: bytes, rule: CaptureRule) -> None:
        """File a snapshot taken for `tokens` under `rule`."""
        done = self.memory.insert(tokens, data, rule, live=self._live())
        if done is not None and done.stored:
            nbytes = memoryview(data).nbytes
            self._emit(CheckpointEventKind.CAPTURE, CheckpointTier.MEMORY, rule, nbytes, len(tokens))
            for e in done.superseded:  # their rows are in the new entry: nothing to save
                self._emit(
                    CheckpointEventKind.EVICT, CheckpointTier.MEMORY, e.rule, e.num_bytes, e.num_tokens
                )
            for e in done.evicted:
                self._emit(
                    CheckpointEventKind.EVICT, CheckpointTier.MEMORY, e.rule, e.num_bytes, e.num_tokens
                )
                if self.disk is not None and e.rule not in _MEMORY_ONLY:
                    self.disk.put(e.tokens, e.data, e.rule.value)
                else:
                    self.evictions.add(Evicted.CHECKPOINT, e.tokens)
        if self.disk is not None and rule not in _MEMORY_ONLY and rule not in _SPILL_ONLY:
            # Write-through for shared or evicted content, so it survives a restart.
            self.disk.put(tokens, data, rule.value)

    def drop_memory(self, key: str, num_tokens: int) -> None:
        """Remove a memory checkpoint the pool refused to restore (damaged)."""
        e = self.memory.remove(key)
        if e is not None:
            self._emit(CheckpointEventKind.DROP, CheckpointTier.MEMORY, e.rule, e.num_bytes, num_tokens)

    def drop_disk(self, key: str, why: Exception) -> None:
        """Remove a disk checkpoint the pool refused to restore (it verified on disk, but e.g.
        holds more tokens than this pool's ctx_len): otherwise it would be reloaded forever."""
        if self.disk is not None:
            self.disk.drop(key, why)


def _capture_rule(name: str) -> CaptureRule | None:
    """The rule a disk file's header names; None for a file of unknown origin (no or bad rule)."""
    try:
        return CaptureRule(name)
    except ValueError:
        return None
