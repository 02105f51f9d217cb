"""In-memory checkpoint store: KV snapshots keyed by their exact token prefix.

Design: an entry is (tokens, snapshot bytes, capture rule). Its key is a digest of the tokens,
but a digest is only a lookup aid: a PrefixIndex (prefix_index.py) keeps the entries in token
order, so `find` compares the actual tokens (vectorised) of the entries next to the prompt's
place in that order, best first, and stops once the rest cannot share more: any entry that
shares a prefix with the prompt is found, however short the prefix or the prompt. The store keeps a
byte budget; eviction takes the lowest rule class first (prompt-end captures go before hinted
ones), least recently used within a class. An insert only displaces entries of its own class or
lower, so a flood of prompt-end captures never pushes out a system-prompt checkpoint.

The budget holds distinct state, never the same rows twice (`covering` is "holds these tokens
first and a restored slot can be cut back to them", so it respects a ring's reach):
- an insert that an entry already covers stores nothing; the covering entry takes the higher
  rule class of the two (a hint inside a saved conversation protects that conversation);
- an insert drops the entries it covers (a conversation's earlier turn, its hint), taking the
  highest rule class among them;
- an entry that a live slot covers (a prompt-end copy of a running or idle slot) is a duplicate
  while that slot lives: the caller passes the live records, and such entries are evicted first,
  whatever their class (when the slot is overwritten, its evict capture saves the rows again).
"""

from __future__ import annotations

import enum
import hashlib
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .policy import CheckpointMatch, CheckpointTier
from .prefix_index import PrefixIndex

# n -> shortest length a slot restored from a snapshot of n tokens can be cut back to
# (the pool's `restored_min_truncate_len`; 0 for full KV)
RestoredFloor = Callable[[int], int]


def no_floor(n: int) -> int:
    """Full KV: a restored checkpoint can be cut back to any length."""
    return 0


def usable_len(common: int, num_tokens: int, prompt_len: int, floor: int) -> int:
    """Prompt tokens a checkpoint of num_tokens sharing `common` can supply (policy._usable):
    the last prompt token is always refed, and a cut below `floor` is impossible."""
    u = min(common, prompt_len - 1)
    return 0 if u < num_tokens and u < floor else max(u, 0)


MAX_TIES = 16  # entries a lookup compares after its best that can only tie with it (see best_match)


def best_match(
    index: PrefixIndex, prompt: np.ndarray, floor: RestoredFloor, least: int = 1
) -> tuple[str, int, int] | None:
    """(key, tokens it holds, common prefix) of the entry in `index` that supplies the most
    prompt tokens (`usable_len` under `floor`), ties: the shorter entry; None if none that
    shares at least `least` tokens with the prompt supplies any. Both tiers' `find`.

    The entries come in order of their common prefix c with the prompt, longest first
    (`PrefixIndex.sharing`); an entry supplies 0 or min(c, L - 1). So once one supplies u > 0,
    no later entry supplies more: the walk stops at an entry sharing less than u, or after
    MAX_TIES more entries that did not beat it (then a shorter tie further on may be missed: it
    would restore fewer bytes, nothing more). Before any entry supplies something (a ring: longer
    entries cannot be cut back to c), each new c first tries the entry that is exactly the
    prompt's first c tokens (a hint at the end of a system prompt, say), found by its key: it
    supplies what any entry sharing c tokens could. Entries sharing fewer than `least` tokens
    are never compared."""
    L = int(prompt.shape[0])
    best: tuple[int, int, str, int] | None = None  # (usable, -num_tokens, key, common)
    level, ties = -1, 0

    def consider(key: str, c: int) -> None:
        nonlocal best, ties
        n = int(index.tokens(key).shape[0])
        u = usable_len(c, n, L, floor(n))
        cand = (u, -n, key, c)
        if u > 0 and (best is None or cand[:2] > best[:2]):
            best, ties = cand, 0
        elif best is not None:
            ties += 1  # can only tie with the best, or supplies nothing

    for key, c in index.sharing(prompt):
        if c < max(least, 1) or (best is not None and (c < best[0] or ties >= MAX_TIES)):
            break
        if best is None and c != level:
            level = c
            exact = tokens_key(prompt[:c])
            if exact != key and exact in index and np.array_equal(index.tokens(exact), prompt[:c]):
                consider(exact, c)
        consider(key, c)
    if best is None:
        return None
    return best[2], -best[1], best[3]


# (a live slot's record int32 [n], the shortest length it can be cut back to)
LiveRecord = tuple[np.ndarray, int]


def covers(holder: np.ndarray, floor: int, tokens: np.ndarray) -> bool:
    """Whether a record or checkpoint `holder`, which can be cut back to `floor` at the
    shortest, supplies exactly `tokens` (it starts with them and can be cut back to them)."""
    n = int(tokens.shape[0])
    if holder.shape[0] < n or (n < holder.shape[0] and n < floor):
        return False
    return bool(np.array_equal(holder[:n], tokens))


class CaptureRule(str, enum.Enum):
    HINT = "hint"  # the gateway's prefix hint: where the system turn ends
    COMMON_PREFIX = "common_prefix"  # common prefix of two successive prompts without a live slot
    PROMPT_END = "prompt_end"  # the whole prompt after its prefill
    EVICT = "evict"  # a slot's record saved before it was overwritten
    INTERVAL = "interval"  # every K tokens of a long prefill (a ring cannot rewind that far)
    TURN = "turn"  # where a turn starts as the template renders it (rings, recurrent state)

    @property
    def keep_class(self) -> int:
        """Eviction order: lower classes are evicted first."""
        return _KEEP_CLASS[self]


_KEEP_CLASS = {
    CaptureRule.PROMPT_END: 0,
    CaptureRule.INTERVAL: 0,
    CaptureRule.EVICT: 1,
    CaptureRule.TURN: 1,
    CaptureRule.COMMON_PREFIX: 2,
    CaptureRule.HINT: 2,
}


def tokens_key(tokens: np.ndarray) -> str:
    """Digest naming an exact token sequence (int32)."""
    t = np.ascontiguousarray(tokens, dtype=np.int32)
    return hashlib.blake2b(t.tobytes(), digest_size=16).hexdigest() + f"-{t.shape[0]}"


@dataclass(slots=True)
class CheckpointEntry:
    key: str
    tokens: np.ndarray  # int32 [n] exact prefix the snapshot holds
    data: bytes  # the pool's snapshot
    rule: CaptureRule
    num_bytes: int
    last_used: int = 0  # store clock tick of the last insert/use

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])


@dataclass(frozen=True, slots=True)
class Inserted:
    """What an insert did."""

    stored: bool  # False: an entry already covered the tokens (it was refreshed instead)
    evicted: list[CheckpointEntry]  # displaced to make room
    superseded: list[CheckpointEntry]  # covered by the new entry (their rows are in it)


def _highest(rule: CaptureRule, entries: Iterable[CheckpointEntry]) -> CaptureRule:
    """The rule of the highest class among `rule` and the entries' (ties: `rule`)."""
    for e in entries:
        if e.rule.keep_class > rule.keep_class:
            rule = e.rule
    return rule


class MemoryCheckpointStore:
    def __init__(self, budget_bytes: int, restored_floor: RestoredFloor = no_floor) -> None:
        self.budget_bytes = budget_bytes
        self._floor = restored_floor
        self.bytes_used = 0
        self._entries: dict[str, CheckpointEntry] = {}
        self._index = PrefixIndex()  # the entries' tokens, for prefix lookups
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[CheckpointEntry]:
        return list(self._entries.values())

    def get(self, key: str) -> CheckpointEntry | None:
        """The entry under `key`, marked as used; None if gone."""
        e = self._entries.get(key)
        if e is not None:
            e.last_used = next(self._clock)
        return e

    def contains_prefix(self, tokens: np.ndarray) -> bool:
        """True if an entry holds exactly `tokens`."""
        e = self._entries.get(tokens_key(tokens))
        return e is not None and np.array_equal(e.tokens, tokens)

    def find(self, prompt: np.ndarray, least: int = 1) -> CheckpointMatch | None:
        """The entry that supplies the most prompt tokens (`usable_len`: with a ring, an entry
        longer than the common prefix may be unable to be cut back to it); ties: the shorter
        entry. None if no entry sharing at least `least` tokens with the prompt supplies any.
        Compares only the entries next to the prompt in token order (`best_match`)."""
        found = best_match(self._index, prompt, self._floor, least)
        if found is None:
            return None
        key, n, common = found
        return CheckpointMatch(CheckpointTier.MEMORY, key, n, common, self._floor(n))

    def covering(self, tokens: np.ndarray) -> CheckpointEntry | None:
        """An entry that holds `tokens` first and that a restored slot can be cut back to them
        from (the exact entry, or a longer one within the ring's reach); None if none does."""
        for key in self._index.starting_with(tokens):
            e = self._entries[key]
            if covers(e.tokens, self._floor(e.num_tokens), tokens):
                return e
        return None

    def promote(self, key: str, rule: CaptureRule) -> None:
        """Give the entry under `key` the class of `rule` if that is higher (a capture under
        `rule` found its rows already held there)."""
        e = self._entries.get(key)
        if e is not None and rule.keep_class > e.rule.keep_class:
            e.rule = rule

    def can_fit(
        self,
        num_bytes: int,
        rule: CaptureRule,
        *,
        tokens: np.ndarray | None = None,
        live: Sequence[LiveRecord] = (),
    ) -> bool:
        """Whether an entry of this size and rule (of these tokens, if given: the entries it
        covers make room too) would be accepted, evicting what it may; `live` as for insert."""
        if num_bytes > self.budget_bytes:
            return False
        free = self.budget_bytes - self.bytes_used
        if free >= num_bytes:
            return True
        covered = self._superseded(tokens) if tokens is not None else []
        rule = _highest(rule, covered)
        gone = {e.key for e in covered}
        shadowed = self.shadowed(live)
        evictable = sum(
            e.num_bytes
            for e in self._entries.values()
            if e.key in gone or e.key in shadowed or e.rule.keep_class <= rule.keep_class
        )
        return free + evictable >= num_bytes

    def shadowed(self, live: Sequence[LiveRecord]) -> set[str]:
        """Keys of the entries a live slot covers (`live`: each slot's record and the shortest
        length it can be cut back to)."""
        out: set[str] = set()
        for rec, floor in live:
            for key in self._index.prefixes_of(rec):
                if key not in out and covers(rec, floor, self._entries[key].tokens):
                    out.add(key)
        return out

    def insert(
        self,
        tokens: np.ndarray,
        data: bytes,
        rule: CaptureRule,
        live: Sequence[LiveRecord] = (),
    ) -> Inserted | None:
        """Add a checkpoint, or None if it does not fit (then nothing changed). An entry that
        already covers `tokens` takes the higher class instead and nothing is stored. Entries the
        new one covers are dropped (`superseded`) and lend it their highest class. To make room,
        entries a live slot covers (`live`: each slot's record and its min_truncate_len) go
        first, then the lowest class, least recently used; only entries of the new one's class
        or lower, or live-covered ones, are displaced (`evicted`)."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int32).copy()
        key = tokens_key(tokens)
        num_bytes = memoryview(data).nbytes
        holder = self.covering(tokens)
        if holder is not None:
            self.promote(holder.key, rule)
            holder.last_used = next(self._clock)
            return Inserted(stored=False, evicted=[], superseded=[])
        covered = self._superseded(tokens)
        rule = _highest(rule, covered)
        if not self.can_fit(num_bytes, rule, tokens=tokens, live=live):
            return None
        superseded = [self._remove(e.key) for e in covered]
        evicted: list[CheckpointEntry] = []
        if key in self._entries:  # digest collision with different tokens: replace
            evicted.append(self._remove(key))
        shadowed = self.shadowed(live) if self.bytes_used + num_bytes > self.budget_bytes else set()
        while self.bytes_used + num_bytes > self.budget_bytes:
            victim = min(
                (
                    e
                    for e in self._entries.values()
                    if e.key in shadowed or e.rule.keep_class <= rule.keep_class
                ),
                key=lambda e: (e.key not in shadowed, e.rule.keep_class, e.last_used),
            )
            evicted.append(self._remove(victim.key))
        e = CheckpointEntry(key, tokens, data, rule, num_bytes, next(self._clock))
        self._entries[key] = e
        self._index.add(key, tokens)
        self.bytes_used += num_bytes
        return Inserted(stored=True, evicted=evicted, superseded=superseded)

    def _superseded(self, tokens: np.ndarray) -> list[CheckpointEntry]:
        """Entries that are strict prefixes of `tokens` and that a slot restored from `tokens`
        can be cut back to: the longer entry serves every prompt they serve."""
        out: list[CheckpointEntry] = []
        n = int(tokens.shape[0])
        floor = self._floor(n)
        for key in self._index.prefixes_of(tokens):
            e = self._entries[key]
            if e.num_tokens < n and floor <= e.num_tokens:
                out.append(e)
        return out

    def remove(self, key: str) -> CheckpointEntry | None:
        return self._remove(key) if key in self._entries else None

    def _remove(self, key: str) -> CheckpointEntry:
        e = self._entries.pop(key)
        self._index.remove(key)
        self.bytes_used -= e.num_bytes
        return e

    def check_integrity(self) -> None:
        assert self.bytes_used == sum(e.num_bytes for e in self._entries.values())
        assert self.bytes_used <= self.budget_bytes
        for key, e in self._entries.items():
            assert key == e.key == tokens_key(e.tokens)
            assert key in self._index
        assert len(self._index) == len(self._entries)
        self._index.check_integrity()
