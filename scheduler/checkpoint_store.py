"""In-memory checkpoint store: KV snapshots keyed by their exact token prefix.

Design: an entry is (tokens, snapshot bytes, capture rule). Its key is a digest of the tokens,
but a digest is only a lookup aid: `find` narrows candidates by a hash of their first HEAD_TOKENS
tokens, then compares the actual tokens (vectorised) to get the common prefix. The store keeps a
byte budget; eviction takes the lowest rule class first (prompt-end captures go before hinted
ones), least recently used within a class. An insert only displaces entries of its own class or
lower, so a flood of prompt-end captures never pushes out a system-prompt checkpoint.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .policy import CheckpointMatch, CheckpointTier
from .prefix import common_prefix_len

HEAD_TOKENS = 32  # candidates must share this many leading tokens (or the whole short entry)

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


class CaptureRule(str, enum.Enum):
    HINT = "hint"  # the gateway's prefix hint: where the system turn ends
    COMMON_PREFIX = "common_prefix"  # common prefix of two successive prompts without a live slot
    PROMPT_END = "prompt_end"  # the whole prompt after its prefill
    EVICT = "evict"  # a slot's record saved before it was overwritten
    INTERVAL = "interval"  # every K tokens of a long prefill (a ring cannot rewind that far)

    @property
    def keep_class(self) -> int:
        """Eviction order: lower classes are evicted first."""
        return _KEEP_CLASS[self]


_KEEP_CLASS = {
    CaptureRule.PROMPT_END: 0,
    CaptureRule.INTERVAL: 0,
    CaptureRule.EVICT: 1,
    CaptureRule.COMMON_PREFIX: 2,
    CaptureRule.HINT: 2,
}


def tokens_key(tokens: np.ndarray) -> str:
    """Digest naming an exact token sequence (int32)."""
    t = np.ascontiguousarray(tokens, dtype=np.int32)
    return hashlib.blake2b(t.tobytes(), digest_size=16).hexdigest() + f"-{t.shape[0]}"


def head_hash(tokens: np.ndarray) -> tuple[int, bytes]:
    """(head length, digest of the first HEAD_TOKENS tokens): the lookup aid of both tiers."""
    head = np.ascontiguousarray(tokens[:HEAD_TOKENS], dtype=np.int32)
    return head.shape[0], hashlib.blake2b(head.tobytes(), digest_size=8).digest()


@dataclass(slots=True)
class CheckpointEntry:
    key: str
    tokens: np.ndarray  # int32 [n] exact prefix the snapshot holds
    data: bytes  # the pool's snapshot
    rule: CaptureRule
    num_bytes: int
    last_used: int = 0  # store clock tick of the last insert/use
    head: tuple[int, bytes] = field(default=(0, b""))

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])


class MemoryCheckpointStore:
    def __init__(self, budget_bytes: int, restored_floor: RestoredFloor = no_floor) -> None:
        self.budget_bytes = budget_bytes
        self._floor = restored_floor
        self.bytes_used = 0
        self._entries: dict[str, CheckpointEntry] = {}
        self._by_head: dict[tuple[int, bytes], set[str]] = {}
        self._head_lens: dict[int, int] = {}  # head length -> entries using it
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

    def find(self, prompt: np.ndarray) -> CheckpointMatch | None:
        """The entry that supplies the most prompt tokens (`usable_len`: with a ring, an entry
        longer than the common prefix may be unable to be cut back to it); ties: the shorter
        entry. None if no entry supplies any."""
        best: tuple[int, int, str, int] | None = None
        L = int(prompt.shape[0])
        for hl in self._head_lens:
            if hl > L:
                continue
            for key in self._by_head.get(head_hash(prompt[:hl]), ()):
                e = self._entries[key]
                c = common_prefix_len(prompt, e.tokens)
                u = usable_len(c, e.num_tokens, L, self._floor(e.num_tokens))
                cand = (u, -e.num_tokens, key, c)
                if best is None or cand[:2] > best[:2]:
                    best = cand
        if best is None or best[0] == 0:
            return None
        e = self._entries[best[2]]
        n = e.num_tokens
        return CheckpointMatch(CheckpointTier.MEMORY, e.key, n, best[3], self._floor(n))

    def can_fit(self, num_bytes: int, rule: CaptureRule) -> bool:
        """Whether an entry of this size and rule would be accepted (evicting what it may)."""
        if num_bytes > self.budget_bytes:
            return False
        free = self.budget_bytes - self.bytes_used
        if free >= num_bytes:
            return True
        evictable = sum(e.num_bytes for e in self._entries.values() if e.rule.keep_class <= rule.keep_class)
        return free + evictable >= num_bytes

    def insert(self, tokens: np.ndarray, data: bytes, rule: CaptureRule) -> list[CheckpointEntry] | None:
        """Add a checkpoint; return the entries evicted to make room, or None if it does not fit
        (then nothing changed). Re-inserting the same tokens refreshes the entry (keeping the
        higher rule class)."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int32).copy()
        key = tokens_key(tokens)
        num_bytes = memoryview(data).nbytes
        old = self._entries.get(key)
        if old is not None and np.array_equal(old.tokens, tokens):
            if rule.keep_class > old.rule.keep_class:
                old.rule = rule
            old.last_used = next(self._clock)
            return []
        if not self.can_fit(num_bytes, rule):
            return None
        evicted: list[CheckpointEntry] = []
        if old is not None:  # digest collision with different tokens: replace
            evicted.append(self._remove(key))
        while self.bytes_used + num_bytes > self.budget_bytes:
            victim = min(
                (e for e in self._entries.values() if e.rule.keep_class <= rule.keep_class),
                key=lambda e: (e.rule.keep_class, e.last_used),
            )
            evicted.append(self._remove(victim.key))
        for old_key in self._superseded(tokens):
            evicted.append(self._remove(old_key))
        e = CheckpointEntry(key, tokens, data, rule, num_bytes, next(self._clock), head_hash(tokens))
        self._entries[key] = e
        self._by_head.setdefault(e.head, set()).add(key)
        self._head_lens[e.head[0]] = self._head_lens.get(e.head[0], 0) + 1
        self.bytes_used += num_bytes
        return evicted

    def _superseded(self, tokens: np.ndarray) -> list[str]:
        """Prompt-end entries that are strict prefixes of `tokens`: a longer entry serves every
        prompt they serve (restore, then truncate), so they only waste budget. Not with a ring
        that cannot cut the longer entry back that far."""
        out: list[str] = []
        floor = self._floor(int(tokens.shape[0]))
        for hl in self._head_lens:
            if hl > tokens.shape[0]:
                continue
            for key in self._by_head.get(head_hash(tokens[:hl]), ()):
                e = self._entries[key]
                if (
                    e.rule is CaptureRule.PROMPT_END
                    and e.num_tokens < tokens.shape[0]
                    and floor <= self._floor(e.num_tokens)  # cut back as far as e can be
                    and common_prefix_len(tokens, e.tokens) == e.num_tokens
                ):
                    out.append(key)
        return out

    def remove(self, key: str) -> CheckpointEntry | None:
        return self._remove(key) if key in self._entries else None

    def _remove(self, key: str) -> CheckpointEntry:
        e = self._entries.pop(key)
        keys = self._by_head[e.head]
        keys.discard(key)
        if not keys:
            del self._by_head[e.head]
        self._head_lens[e.head[0]] -= 1
        if self._head_lens[e.head[0]] == 0:
            del self._head_lens[e.head[0]]
        self.bytes_used -= e.num_bytes
        return e

    def check_integrity(self) -> None:
        assert self.bytes_used == sum(e.num_bytes for e in self._entries.values())
        assert self.bytes_used <= self.budget_bytes
        for key, e in self._entries.items():
            assert key == e.key == tokens_key(e.tokens)
            assert key in self._by_head[e.head]
        assert sum(len(v) for v in self._by_head.values()) == len(self._entries)
        assert sum(self._head_lens.values()) == len(self._entries)
