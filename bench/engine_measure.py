"""The figures `slotserve bench engine` times on a pool (engine.py's module doc says what each
is): prefill and decode tokens/s (measure, and measure_depth after N tokens, as llama-bench -d),
decode_rate (also `bench serve`'s engine figure), milliseconds per step of 1-8 slots (step_ms),
4 slots against one (batch_ratio), and the NumPy implementation's figures (measure_numpy)."""

from __future__ import annotations

import statistics
import time
from typing import Any

DECODE_STEPS = 128
DEPTH = 2048
PREFILL_SIZES = (128, 512, 2048)
DEPTH_PREFILL = 512  # --depth: ppN after the depth, as llama-bench -p 512 -d N


def decode_rate(
    pool: Any, slots: list[int], steps: int, rng: Any, n_vocab: int, forward_only: bool = False
) -> float:
    """Aggregate tokens/s of `steps` greedy decode steps of `slots` in one batch per step,
    each slot continuing from wherever it stands (a random first token). forward_only: count
    only the time inside pool.forward (the engine and its Python entry), not this loop's own
    batch building and argmax over every slot's logits (~0.1-0.2 ms a step at 4 slots here,
    work a server does elsewhere). Side effect: every slot in `slots` grows by `steps` tokens
    (the caller truncates and sizes ctx_len)."""
    import numpy as np

    last = {s: int(rng.integers(0, n_vocab)) for s in slots}
    inside = 0.0
    t = time.perf_counter()
    for _ in range(steps):
        batch = [(s, np.array([last[s]], np.int32), pool.slot_len(s), True) for s in slots]
        t_forward = time.perf_counter()
        logits = pool.forward(batch)
        inside += time.perf_counter() - t_forward
        last = {s: int(np.argmax(row)) for s, row in zip(slots, logits)}
    return len(slots) * steps / (inside if forward_only else time.perf_counter() - t)


STEP_CONTEXT = 16  # tokens each slot holds before its timed steps (--step-ms)
STEP_COUNT = 24  # timed steps per round (--step-ms)
STEP_ROUNDS = 3  # rounds; the best round's median counts (--step-ms)


def step_ms(pool: Any, n_vocab: int, batch_sizes: tuple[int, ...], rng: Any) -> dict[int, float]:
    """Milliseconds per decode step of n slots (n in batch_sizes, each at most pool.num_slots),
    timed around pool.forward alone: every slot prefilled with STEP_CONTEXT random tokens, then
    STEP_COUNT steps of one random token each; the median step, best of STEP_ROUNDS rounds
    (rounds alternate the sizes, so a busy moment on a shared machine hits one round, not one
    size). Side effect: truncates and refills slots 0 .. max(batch_sizes) - 1."""
    import numpy as np

    best: dict[int, float] = {}
    for _ in range(STEP_ROUNDS):
        for n in batch_sizes:
            for s in range(n):
                pool.truncate(s, 0)
                pool.forward([(s, rng.integers(0, n_vocab, STEP_CONTEXT).astype(np.int32), 0, False)])
            times = []
            for i in range(STEP_COUNT):
                batch = [
                    (s, rng.integers(0, n_vocab, 1).astype(np.int32), STEP_CONTEXT + i, True)
                    for s in range(n)
                ]
                t = time.perf_counter()
                pool.forward(batch)
                times.append(time.perf_counter() - t)
            best[n] = min(best.get(n, float("inf")), statistics.median(times) * 1e3)
    return best


RATIO_SLOTS = 4  # --batch-ratio: the batch measured against one slot
RATIO_CONTEXT = 64  # --batch-ratio: tokens each slot holds before the first pair
RATIO_WARMUP = 4  # --batch-ratio: untimed pairs first (the pool's scratch pages, the weights' TLB)
RATIO_BLOCK = 10  # --batch-ratio: pairs per block of the spread


def batch_ratio(pool: Any, n_vocab: int, pairs: int, rng: Any) -> dict[str, Any]:
    """4 slots decoding against one: `pairs` pairs of a one-slot step (slot 0) and a
    RATIO_SLOTS-slot step (slots 0 .. RATIO_SLOTS - 1), timed around pool.forward alone, after
    RATIO_WARMUP untimed pairs. Every slot is prefilled with RATIO_CONTEXT random tokens and
    decodes greedily; both steps of pair i run at position RATIO_CONTEXT + i with the same
    tokens (slot 0 is cut back by the one token its lone step added, so the batch step rewrites
    that row), so both sizes see the same depth and KV; the order within a pair alternates, so
    neither size always follows the other. Returns the median step of each size (ms), the
    per-token speed-up RATIO_SLOTS x t1 / t4 of those medians, and the same ratio over each
    block of RATIO_BLOCK consecutive pairs (its spread on a shared machine). Side effect:
    refills slots 0 .. RATIO_SLOTS - 1."""
    import numpy as np

    slots = list(range(RATIO_SLOTS))
    last = []
    for s in slots:
        pool.truncate(s, 0)
        prompt = rng.integers(0, n_vocab, RATIO_CONTEXT).astype(np.int32)
        last.append(int(np.argmax(pool.forward([(s, prompt, 0, True)])[0])))
    t1: list[float] = []
    t4: list[float] = []
    for i in range(RATIO_WARMUP + pairs):
        pos = RATIO_CONTEXT + i
        one = [(0, np.array(last[:1], np.int32), pos, True)]
        batch = [(s, np.array([last[s]], np.int32), pos, True) for s in slots]
        for lone in (True, False) if i % 2 == 0 else (False, True):
            pool.truncate(0, pos)
            t = time.perf_counter()
            logits = pool.forward(one if lone else batch)
            (t1 if lone else t4).append(time.perf_counter() - t)
            if not lone:
                last = [int(np.argmax(row)) for row in logits]
    del t1[:RATIO_WARMUP], t4[:RATIO_WARMUP]

    def ratio(a: list[float], b: list[float]) -> float:
        return RATIO_SLOTS * statistics.median(a) / statistics.median(b)

    blocks = [
        round(ratio(t1[i : i + RATIO_BLOCK], t4[i : i + RATIO_BLOCK]), 2)
        for i in range(0, pairs - RATIO_BLOCK + 1, RATIO_BLOCK)
    ]
    return {
        "pairs": pairs,
        "positions": [RATIO_CONTEXT + RATIO_WARMUP, RATIO_CONTEXT + RATIO_WARMUP + pairs - 1],
        "step_ms_1": round(statistics.median(t1) * 1e3, 3),
        f"step_ms_{RATIO_SLOTS}": round(statistics.median(t4) * 1e3, 3),
        "ratio": round(ratio(t1, t4), 3),
        "blocks": blocks,
    }


def measure(
    pool: Any,
    n_vocab: int,
    reps: int,
    prefill_sizes: tuple[int, ...] = PREFILL_SIZES,
    steps: int = DECODE_STEPS,
    depth: int = DEPTH,
    batch_sizes: tuple[int, ...] = (4,),
) -> dict[str, float]:
    """Figures of the module docstring on `pool` (slots 0 .. max(batch_sizes) - 1 are used)."""
    import numpy as np

    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    for n in prefill_sizes:
        rates = []
        for rep in range(reps + 1):  # rep 0: the untimed warm-up (as llama-bench's)
            prompt = rng.integers(0, n_vocab, n).astype(np.int32)
            pool.truncate(0, 0)
            t = time.perf_counter()
            pool.forward([(0, prompt, 0, True)])
            if rep:
                rates.append(n / (time.perf_counter() - t))
        out[f"pp{n}"] = statistics.fmean(rates)

    def decode(slots: list[int]) -> float:
        return decode_rate(pool, slots, steps, rng, n_vocab, forward_only=True)

    pool.truncate(0, 0)
    out[f"tg{steps}"] = decode([0])
    pool.truncate(0, 0)
    pool.forward([(0, rng.integers(0, n_vocab, depth).astype(np.int32), 0, False)])
    out[f"tg{steps}_d{depth}"] = decode([0])
    for n in batch_sizes:
        for s in range(n):
            pool.truncate(s, 0)
        out[f"tg{steps}_x{n}"] = decode(list(range(n)))
    return out


def measure_depth(
    pool: Any,
    n_vocab: int,
    reps: int,
    depths: list[int],
    prefill: int = DEPTH_PREFILL,
    steps: int = DECODE_STEPS,
) -> dict[str, float]:
    """pp{prefill}_dN and tg{steps}_dN for each depth N on slot 0 (module docstring)."""
    import numpy as np

    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    for depth in depths:
        pool.truncate(0, 0)
        if depth:
            pool.forward([(0, rng.integers(0, n_vocab, depth).astype(np.int32), 0, False)])
        rates = []
        for rep in range(reps + 1):  # rep 0: the untimed warm-up
            prompt = rng.integers(0, n_vocab, prefill).astype(np.int32)
            pool.truncate(0, depth)
            t = time.perf_counter()
            pool.forward([(0, prompt, depth, True)])
            if rep:
                rates.append(prefill / (time.perf_counter() - t))
        out[f"pp{prefill}_d{depth}"] = statistics.fmean(rates)
        pool.truncate(0, depth)
        out[f"tg{steps}_d{depth}"] = decode_rate(pool, [0], steps, rng, n_vocab, forward_only=True)
    return out


def measure_numpy(reference_factory: Any, n_vocab: int) -> dict[str, float]:
    import numpy as np

    rng = np.random.default_rng(0)
    ref = reference_factory()
    t = time.perf_counter()
    ref.forward(rng.integers(0, n_vocab, 128))
    pp = 128 / (time.perf_counter() - t)
    ref = reference_factory()
    steps, token = 16, int(rng.integers(0, n_vocab))
    t = time.perf_counter()
    for _ in range(steps):
        token = int(np.argmax(ref.forward(np.array([token]))))
    return {"pp128": pp, "tg16": steps / (time.perf_counter() - t)}
