"""Longest common prefix of token arrays, vectorised.

Design: a comparison is done in growing blocks (64, then 4096, then the rest) so that the
common case of an early mismatch touches only a few cache lines, while a 100k-token match is
one numpy pass. The first mismatch is found with `argmax` on the boolean comparison (several
times faster than `flatnonzero`, which materialises every index). No Python loop runs per token.
"""

from __future__ import annotations

import numpy as np

_BLOCKS = (64, 4096)


def _first_diff(a: np.ndarray, b: np.ndarray) -> int:
    """Index of the first differing element of equal-length arrays, or len(a)."""
    n = a.shape[0]
    if n == 0:
        return 0
    ne = a != b  # bool [n]
    i = int(ne.argmax())  # first True; 0 when none
    return i if ne[i] else n


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Number of leading positions where int32 arrays `a` and `b` agree."""
    n = min(int(a.shape[0]), int(b.shape[0]))
    start = 0
    for stop in (*_BLOCKS, n):
        stop = min(stop, n)
        if stop <= start:
            continue
        d = _first_diff(a[start:stop], b[start:stop])
        if d < stop - start:
            return start + d
        start = stop
        if start == n:
            break
    return n
