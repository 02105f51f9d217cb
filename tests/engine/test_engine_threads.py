"""The thread pool's step protocol under a fast mix of step shapes (engine.c, threadpool.h).

A worker that lost the CPU may still be walking a step's phases after the caller finished them
(any subset of threads completes a phase). engine_forward returns only once every worker has
left the step, so nothing a caller does between calls (the next step's shape, a snapshot, a
restore, another thread count's engine) can meet a late worker. These tests alternate steps of
different shapes, slots and thread counts quickly, with more threads than this machine's cores
(so workers are descheduled mid-step), and check after every call that no worker is still
inside, and that every logits row equals a one-thread engine's fed the same schedule (==).
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_support import make_pool, random_tokens

N_VOCAB = 299
CTX = 96
SLOTS = 3
STEPS = 60


@pytest.fixture(scope="module", params=("Q4_1", "lfm2", "qwen35", "granitehybrid"))
def path(request, tiny_model_factory, arch_model_factory, qwen35_model_factory, granite_model_factory):
    if request.param == "qwen35":
        return qwen35_model_factory("Q8_0")
    if request.param == "granitehybrid":
        return granite_model_factory("Q8_0")
    if request.param == "lfm2":
        return arch_model_factory("lfm2")
    return tiny_model_factory(request.param)


def schedule(seed: int) -> list[list[tuple[int, np.ndarray, int, bool]]]:
    """STEPS forward batches over SLOTS slots: one-slot decode, several slots' decode, prefill
    chunks of 2-24 tokens, and mixes of these, each slot restarting from 0 when it would pass
    CTX (an item at position 0 is an empty slot's first chunk)."""
    rng = np.random.default_rng(seed)
    lens = [0] * SLOTS
    batches = []
    for _ in range(STEPS):
        kind = rng.integers(0, 4)
        slots = (
            [int(rng.integers(0, SLOTS))]
            if kind < 2
            else list(rng.permutation(SLOTS)[: rng.integers(2, SLOTS + 1)])
        )
        batch = []
        for s in slots:
            n = 1 if kind in (0, 2) else int(rng.integers(2, 25))
            if lens[s] + n > CTX:
                lens[s] = 0
            batch.append((s, random_tokens(n, N_VOCAB, seed=int(rng.integers(1 << 30))), lens[s], True))
            lens[s] += n
        batches.append(batch)
    return batches


def run(pool, batches) -> list[np.ndarray]:
    outs = []
    for batch in batches:
        for s, _, start, _ in batch:
            if start == 0 and pool.slot_len(s):
                pool.truncate(s, 0)
        outs.append(pool.forward(batch))
        # NOTE: read at once, before any other call: a worker still walking the step shows here
        assert pool._engine.workers_busy() == 0, "forward returned while a worker was inside the step"
    return outs


def test_alternating_shapes_and_thread_counts_leave_no_worker_behind(path):
    batches = schedule(seed=5)
    want = run(make_pool(path, SLOTS, CTX, threads=1), batches)
    # several engines with different pools, called in turn (2-4 threads on a 2-core machine)
    pools = {t: make_pool(path, SLOTS, CTX, threads=t) for t in (2, 3, 4)}
    got: dict[int, list[np.ndarray]] = {t: [] for t in pools}
    for i, batch in enumerate(batches):
        for t in (2, 4, 3) if i % 2 else (3, 2, 4):
            got[t] += run(pools[t], [batch])
    for t, outs in got.items():
        for i, (a, b) in enumerate(zip(outs, want, strict=True)):
            assert np.array_equal(a, b), f"{t} threads, step {i}: largest difference {np.abs(a - b).max()}"


def test_snapshot_between_steps_of_other_shapes(path):
    """A snapshot and a restore right after each forward (what the scheduler does between steps)
    read and write the slot a late worker would still be near."""
    batches = schedule(seed=11)[:30]
    want = run(make_pool(path, SLOTS, CTX, threads=1), batches)
    pool = make_pool(path, SLOTS, CTX, threads=4)
    for i, batch in enumerate(batches):
        got = run(pool, [batch])[0]
        assert np.array_equal(got, want[i]), f"step {i}"
        s = batch[0][0]
        n = pool.slot_len(s)
        blob = pool.snapshot(s, n)
        assert pool._engine.workers_busy() == 0
        pool.restore(s, blob)
        assert pool.slot_len(s) == n
