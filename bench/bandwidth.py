"""Memory bandwidth and the bound it puts on decode (`slotserve bench serve`'s part 3, and
`bench versus --probe`): a triad a = b + s*c over float64 arrays far larger than any cache, in
chunks so the two NumPy passes of each chunk meet in cache and memory sees 3 arrays (read b,
read c, write a; the write-allocate read of a is not counted, as in STREAM); a read pass (the
engine's C read loop, `_engine.read_sum`), as a decode step reads its weights; each the best
of BANDWIDTH_REPS on `threads` threads, each a contiguous share (NumPy and read_sum release the
GIL). `decode_weight_bytes` is what one decode step reads: bandwidth / it bounds one slot's
decode tokens/s."""

from __future__ import annotations

import time
from typing import Any

BANDWIDTH_REPS = 5
BANDWIDTH_CHUNK = 1 << 15  # float64 elements per triad chunk (256 KiB: three fit in L2)


def triad_bandwidth(mib: int, reps: int = BANDWIDTH_REPS, threads: int = 1) -> float:
    """Best-of-`reps` bytes/s of a = b + s*c over three float64 arrays of `mib` MiB each on
    `threads` threads, counting 3 arrays of traffic per pass (module docstring)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    n = mib * 1024 * 1024 // 8
    a, b, c = np.zeros(n), np.ones(n), np.full(n, 2.0)  # touched now: no page faults while timed
    share = -(-n // threads)  # elements per thread, rounded up

    def triad(lo: int, hi: int) -> None:
        for i in range(lo, hi, BANDWIDTH_CHUNK):
            j = min(i + BANDWIDTH_CHUNK, hi)
            np.multiply(c[i:j], 3.0, out=a[i:j])
            np.add(a[i:j], b[i:j], out=a[i:j])

    best = float("inf")
    with ThreadPoolExecutor(threads) as workers:
        for _ in range(reps):
            a[:] = 0.0
            t = time.perf_counter()
            list(workers.map(lambda k: triad(k * share, min(n, (k + 1) * share)), range(threads)))
            best = min(best, time.perf_counter() - t)
    if not (a == 7.0).all():  # 1 + 3 * 2: the threads covered the arrays
        raise AssertionError("triad produced a wrong value")
    return 3 * n * 8 / best


def read_bandwidth(mib: int, reps: int = BANDWIDTH_REPS, threads: int = 1) -> float:
    """Best-of-`reps` bytes/s of reading one array of `mib` MiB on `threads` threads, each a
    contiguous share read once in order by the engine's C read loop (`_engine.read_sum`: 32-byte
    loads, no GIL), as a decode step reads its weights."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from ..engine_ext import _engine

    n = mib * 1024 * 1024 // 8
    words = np.ones(n, dtype=np.uint64)  # touched now: no page faults while timed
    raw = words.view(np.uint8)
    share = -(-n // threads)

    def read(lo: int, hi: int) -> int:
        return int(_engine.read_sum(raw[8 * lo : 8 * hi])) if hi > lo else 0

    best = float("inf")
    with ThreadPoolExecutor(threads) as workers:
        for _ in range(reps):
            t = time.perf_counter()
            total = sum(workers.map(lambda k: read(k * share, min(n, (k + 1) * share)), range(threads)))
            best = min(best, time.perf_counter() - t)
            if total != n:  # every word read once
                raise AssertionError(f"read pass summed {total}, expected {n}")
    return n * 8 / best


def decode_weight_bytes(model: Any) -> int:
    """Bytes of weights one decode step reads: every tensor but token_embd, which a step reads
    one row of, unless the output matrix is tied to it."""
    total = sum(t.data.nbytes for t in model.tensors.values())
    if not model.config.tied_output:
        total -= model.tensors["token_embd.weight"].data.nbytes
    return int(total)
