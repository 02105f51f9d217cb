"""PrefixIndex: token sequences kept for prefix queries, the lookup of both checkpoint tiers.

Design: two views of one set of (key, tokens) entries.

- Sorted order. The keys sorted by their tokens, compared lexicographically (a sequence sorts
  before every longer sequence it starts). For a query q whose insertion point is i, the common
  prefix of q with the entries is largest next to i and shrinks (never grows) walking away from
  i in either direction, so `sharing(q)` yields entries in order of non-increasing common
  prefix by merging the two outward walks: a caller that wants the best match stops as soon as
  the common prefix falls below what it already has, however many entries share a shorter
  prefix (say, a BOS token and a chat header) with q. Entries that start with q are the
  contiguous run from i (`starting_with`). Finding i costs O(log n) vectorised comparisons;
  adding or removing an entry is one binary search and one list insert/delete.

      sorted:   [5 1]  [5 1 7]  [5 1 7 2 9]  [5 1 8]  [6]      q = [5 1 7 4]
                           ^ walk left       ^ i: walk right     common: 3, 2 | 2, 2, 0

- Head hashes. Each entry is also filed under a digest of its first min(n, HEAD_TOKENS) tokens;
  the entries that are prefixes of t (`prefixes_of`: what an insert of t supersedes, or what a
  live record covers) share all their tokens with t, so one lookup per distinct head length
  finds them, where in sorted order they need not be contiguous.

Not thread-safe: the owner serialises calls (the disk tier under its index lock).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np

from .prefix import common_prefix_len

HEAD_TOKENS = 32  # head-hash length (entries shorter than this are filed under all their tokens)


def head_hash(tokens: np.ndarray) -> tuple[int, bytes]:
    """(head length, digest of the first HEAD_TOKENS tokens)."""
    head = np.ascontiguousarray(tokens[:HEAD_TOKENS], dtype=np.int32)
    return head.shape[0], hashlib.blake2b(head.tobytes(), digest_size=8).digest()


def compare(a: np.ndarray, b: np.ndarray) -> int:
    """-1, 0 or 1 as token sequence `a` sorts before, equal to or after `b` (lexicographic; a
    proper prefix sorts first)."""
    c = common_prefix_len(a, b)
    na, nb = int(a.shape[0]), int(b.shape[0])
    if c == na or c == nb:
        return (na > nb) - (na < nb)
    return -1 if a[c] < b[c] else 1


class PrefixIndex:
    def __init__(self) -> None:
        self._tokens: dict[str, np.ndarray] = {}  # key -> int32 [n] (the owner's array, not copied)
        self._sorted: list[str] = []  # keys in token order
        self._by_head: dict[tuple[int, bytes], set[str]] = {}
        self._head_lens: dict[int, int] = {}  # head length -> entries filed under it

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, key: object) -> bool:
        return key in self._tokens

    def tokens(self, key: str) -> np.ndarray:
        """The tokens filed under `key` (KeyError if none)."""
        return self._tokens[key]

    def _insertion_point(self, q: np.ndarray) -> int:
        """The first position whose entry does not sort before `q`."""
        lo, hi = 0, len(self._sorted)
        while lo < hi:
            mid = (lo + hi) // 2
            if compare(self._tokens[self._sorted[mid]], q) < 0:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def add(self, key: str, tokens: np.ndarray) -> None:
        """File `tokens` (int32, not modified afterwards) under `key`; replaces the key's entry.
        ValueError if another key holds the same tokens (keys name token sequences)."""
        if key in self._tokens:
            self.remove(key)
        i = self._insertion_point(tokens)
        if i < len(self._sorted) and compare(self._tokens[self._sorted[i]], tokens) == 0:
            raise ValueError(f"{self._sorted[i]!r} already holds these tokens")
        self._tokens[key] = tokens
        self._sorted.insert(i, key)
        head = head_hash(tokens)
        self._by_head.setdefault(head, set()).add(key)
        self._head_lens[head[0]] = self._head_lens.get(head[0], 0) + 1

    def remove(self, key: str) -> bool:
        """Forget `key`; False if it was not filed."""
        tokens = self._tokens.get(key)
        if tokens is None:
            return False
        i = self._insertion_point(tokens)
        assert self._sorted[i] == key, "sorted order out of step with the entries"
        del self._sorted[i]
        del self._tokens[key]
        head = head_hash(tokens)
        keys = self._by_head[head]
        keys.discard(key)
        if not keys:
            del self._by_head[head]
        self._head_lens[head[0]] -= 1
        if self._head_lens[head[0]] == 0:
            del self._head_lens[head[0]]
        return True

    def sharing(self, q: np.ndarray) -> Iterator[tuple[str, int]]:
        """(key, common prefix with q) for every entry, in order of non-increasing common
        prefix (module doc). Lazy: each step costs one comparison. Do not modify the index
        while iterating."""
        i = self._insertion_point(q)
        left, right = i - 1, i
        c_left = common_prefix_len(q, self._tokens[self._sorted[left]]) if left >= 0 else -1
        c_right = common_prefix_len(q, self._tokens[self._sorted[right]]) if right < len(self._sorted) else -1
        while c_left >= 0 or c_right >= 0:
            if c_right >= c_left:
                yield self._sorted[right], c_right
                right += 1
                c_right = (
                    common_prefix_len(q, self._tokens[self._sorted[right]])
                    if right < len(self._sorted)
                    else -1
                )
            else:
                yield self._sorted[left], c_left
                left -= 1
                c_left = common_prefix_len(q, self._tokens[self._sorted[left]]) if left >= 0 else -1

    def starting_with(self, t: np.ndarray) -> Iterator[str]:
        """Keys of the entries whose tokens start with `t` (`t` itself included)."""
        n = int(t.shape[0])
        for j in range(self._insertion_point(t), len(self._sorted)):
            key = self._sorted[j]
            if common_prefix_len(t, self._tokens[key]) < n:
                return
            yield key

    def prefixes_of(self, t: np.ndarray) -> list[str]:
        """Keys of the entries that are prefixes of `t` (`t` itself included)."""
        n = int(t.shape[0])
        out = []
        for hl in self._head_lens:
            if hl > n:
                continue
            for key in self._by_head.get(head_hash(t[:hl]), ()):
                e = self._tokens[key]
                if e.shape[0] <= n and np.array_equal(t[: e.shape[0]], e):
                    out.append(key)
        return out

    def check_integrity(self) -> None:
        assert sorted(self._sorted) == sorted(self._tokens) and len(self._sorted) == len(self._tokens)
        for a, b in zip(self._sorted, self._sorted[1:], strict=False):
            assert compare(self._tokens[a], self._tokens[b]) < 0, "sorted order broken"
        assert sum(len(v) for v in self._by_head.values()) == len(self._tokens)
        assert sum(self._head_lens.values()) == len(self._tokens)
        for head, keys in self._by_head.items():
            assert all(head_hash(self._tokens[k]) == head for k in keys)
