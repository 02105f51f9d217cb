"""`slotserve bench engine`: prefill and decode tokens/s of the C engine, next to plain NumPy.

Outputs are validated before anything is timed: on a llama model the engine's greedy
continuation of a short prompt must agree with the NumPy implementation (bench/engine_numpy.py,
float weights, no activation quantization) over its first tokens (and, on the default model,
begin " Paris"); on every architecture (gemma3, qwen2, qwen3 included)
chunked prefill and a 4-slot batch must reproduce the single-chunk, single-slot results
exactly. Then, per thread count:

    pp128, pp512, pp2048   prefill of N prompt tokens into an empty slot (one forward call)
    tg128                  128 greedy decode steps from an empty context
    tg128_d2048            128 decode steps after a 2048-token prompt
    tg128_x4, tg128_x8     4 (8) slots decoding in one batch per step (aggregate tokens/s;
                           x8 not with --synthetic)

`--depth N` (repeatable) measures at depth instead, as llama-bench's `-d N`: the slot is first
filled with N random tokens (untimed, once per depth), then

    pp512_dN               512 more prompt tokens prefilled after the N (mean of --reps after
                           a warm-up run, the slot cut back to N tokens before each run)
    tg128_dN               128 decode steps after the N

and nothing else (the depth-0 figures and batches are skipped: a depth run is long).
`--batch-ratio PAIRS` measures only 4 slots decoding against one slot (batch_ratio): PAIRS
one-slot and 4-slot steps alternating at the same positions and tokens, greedy, after untimed
warm-up pairs; the per-token speed-up 4 x t1 / t4 of the median steps, and its spread over
blocks of 10 pairs.
`--kv-type f16|q8_0` sets the KV element type of every pool (as `serve --kv-type`).

Prefill figures are the mean of --reps timed runs after one untimed warm-up run of the same size
on the same pool, as llama-bench times pp (its warm-up run, then the mean of -r runs): the first
forward of a fresh pool also pays for the first touch of its KV and scratch pages, which one run
of two must not carry. Decode figures time all 128 steps, counting
the time inside pool.forward only (decode_rate's forward_only), and the text output adds each
batch's speed-up over one slot (tg128_x4 / tg128).

`--synthetic NAME` benchmarks a real architecture's shape instead (bench/synthetic.py: qwen2-0.5b,
qwen2-1.5b, llama3-8b, lfm2-350m, qwen3.5-0.8b with random Q4_K_M weights), written once into --synthetic-dir and kept
there for llama.cpp (the llama-bench command is printed). Random weights have no right answer:
only the exactness checks run (on a 40-token prompt), and the sizes are the preset's
(`synthetic.BENCH_SIZES`, e.g. pp64, tg16, tg16_d64 and tg16_x4 at 8B).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import time
from typing import Any

PROMPT = "The capital of France is"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
VALIDATE_TOKENS = 8
MIN_AGREED = 3  # greedy tokens that must match the NumPy implementation
DECODE_STEPS = 128
DEPTH = 2048
PREFILL_SIZES = (128, 512, 2048)
DEPTH_PREFILL = 512  # --depth: ppN after the depth, as llama-bench -p 512 -d N
KV_TYPES = ("f16", "q8_0")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        metavar="NAME|PATH",
        help="a known model's short name (`slotserve pull --list`) or a GGUF path "
        "(default: the default model, pulled if missing)",
    )
    parser.add_argument(
        "--threads", type=int, action="append", help="thread count to measure (repeatable; default: 1 and 2)"
    )
    parser.add_argument(
        "--reps", type=int, default=3, help="timed prefill runs per size, after one warm-up (mean reported)"
    )
    parser.add_argument("--no-numpy", action="store_true", help="skip the NumPy comparison figures")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--synthetic",
        metavar="NAME",
        help="benchmark a random-weight Q4_K_M model of a real shape instead of --model "
        "(qwen2-0.5b, qwen2-1.5b, llama3-8b); written once and kept for llama.cpp",
    )
    parser.add_argument(
        "--synthetic-dir",
        metavar="DIR",
        help="where --synthetic files are written and reused (default: $TMPDIR/slotserve-synthetic)",
    )
    parser.add_argument(
        "--step-ms",
        action="store_true",
        help="also print milliseconds per decode step of 1, 2, 4 and 8 slots (pool.forward alone)",
    )
    parser.add_argument(
        "--batch-ratio",
        type=int,
        metavar="PAIRS",
        help=f"measure only 4 slots decoding against one slot: PAIRS one-slot and {RATIO_SLOTS}-slot steps "
        "alternating at the same depths, per-token speed-up of the median steps and its spread",
    )
    parser.add_argument(
        "--depth",
        type=int,
        action="append",
        metavar="N",
        help=f"measure pp{DEPTH_PREFILL} and tg after N tokens already in the slot, as llama-bench -d N "
        "(repeatable; only these figures are measured)",
    )
    parser.add_argument("--kv-type", choices=KV_TYPES, default="f16", help="KV element type (default f16)")
    parser.add_argument(
        "--swa-full",
        action="store_true",
        help="sliding-window layers keep every row instead of a ring (more KV memory)",
    )


def machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d"),
    }


def _greedy(pool: Any, slot: int, prompt: list[int], n: int) -> list[int]:
    import numpy as np

    pool.truncate(slot, 0)
    logits = pool.forward([(slot, np.array(prompt, np.int32), 0, True)])[0]
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = pool.forward([(slot, np.array(out[-1:], np.int32), pool.slot_len(slot), True)])[0]
    return out


def validate(
    model: Any, tokenizer: Any, pool: Any, reference: Any, is_default: bool, long_len: int = 300
) -> dict[str, Any]:
    """Raise SystemExit with the reason if the engine's outputs are wrong (chunked prefill is
    checked on a random prompt of long_len >= 10 tokens, in three chunks)."""
    import numpy as np

    prompt = tokenizer.encode(PROMPT, add_bos=tokenizer.add_bos_token)
    ours = _greedy(pool, 0, prompt, VALIDATE_TOKENS)
    result: dict[str, Any] = {"prompt": PROMPT, "engine": tokenizer.decode(ours), "engine_ids": ours}
    if reference is not None:
        logits = reference.forward(np.array(prompt))
        theirs = []
        for _ in range(VALIDATE_TOKENS):
            theirs.append(int(np.argmax(logits)))
            logits = reference.forward(np.array(theirs[-1:]))
        agreed = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), VALIDATE_TOKENS)
        result.update(numpy=tokenizer.decode(theirs), agreed_tokens=agreed)
        if agreed < MIN_AGREED:
            raise SystemExit(
                f"validation failed: engine {result['engine']!r} vs NumPy {result['numpy']!r} "
                f"agree over {agreed} < {MIN_AGREED} tokens"
            )
    if is_default and not result["engine"].startswith(" Paris"):
        raise SystemExit(f"validation failed: {PROMPT!r} continued as {result['engine']!r}, not ' Paris'")
    # exactness: chunked prefill and a batch of 4 reproduce single-chunk, single-slot results
    long_prompt = np.random.default_rng(1).integers(0, model.config.n_vocab, long_len).astype(np.int32)
    pool.truncate(0, 0)
    one = pool.forward([(0, long_prompt, 0, True)])[0]
    pool.truncate(1, 0)
    cut = 7 + 2 * (long_len - 7) // 3  # 300 -> chunks of 7, 200, 93
    for at, size in ((0, 7), (7, cut - 7), (cut, long_len - cut)):
        chunked = pool.forward([(1, long_prompt[at : at + size], at, True)])[0]
    if not np.array_equal(one, chunked):
        raise SystemExit("validation failed: chunked prefill differs from one-chunk prefill")
    seq = np.array(prompt + ours, np.int32)
    for s in range(4):
        pool.truncate(s, 0)
        pool.forward([(s, seq[: s + 2], 0, False)])
    batched = pool.forward([(s, seq[s + 2 : s + 3], s + 2, True) for s in range(4)])
    for s in range(4):
        pool.truncate(0, 0)
        single = pool.forward([(0, seq[: s + 3], 0, True)])[0]
        if not np.array_equal(single, batched[s]):
            raise SystemExit(f"validation failed: slot {s} decoded in a batch of 4 differs from alone")
    result["exact_chunking_and_batching"] = True
    return result


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


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import numpy as np
    from slotserve.engine_ext import SlotPool
    from slotserve.engine_ext.loader import read_model
    from slotserve.engine_ext.model_cache import resolve_model

    from . import synthetic
    from .engine_numpy import NumpyLlama

    threads = args.threads or [1, 2]
    if any(t < 1 for t in threads) or args.reps < 1:
        raise SystemExit("--threads and --reps must be >= 1")
    depths = args.depth or []
    if any(d < 0 for d in depths):
        raise SystemExit("--depth must be >= 0")
    pairs = args.batch_ratio
    if pairs is not None and (pairs < 1 or depths):
        raise SystemExit("--batch-ratio takes a number of pairs >= 1, and not with --depth")
    sizes = synthetic.BenchSizes(PREFILL_SIZES, DECODE_STEPS, DEPTH)
    long_len = 300
    if args.synthetic:
        if args.model:
            raise SystemExit("--synthetic and --model are exclusive")
        sizes = synthetic.BENCH_SIZES[args.synthetic] if args.synthetic in synthetic.BENCH_SIZES else sizes
        if not args.json:
            print(f"synthetic {args.synthetic}: writing or reusing its file ...", flush=True)
        path, written = synthetic.ensure_synthetic(args.synthetic, args.synthetic_dir)
        long_len = 40
        if not args.json:
            print(
                f"{'wrote' if written else 'reusing'} {path} ({path.stat().st_size / 1e9:.2f} GB; kept: "
                f"delete it when done)\nllama.cpp on the same file: "
                f"{synthetic.llama_bench_command(path, max(threads), sizes)}",
                flush=True,
            )
    else:
        # a model that cannot be opened raises ModelOpenError: one line and exit 2 from the CLI
        path = Path(resolve_model(args.model, progress=False))
    model, tokenizer = read_model(path)
    ctx_len = max(*sizes.prefill, sizes.depth + sizes.decode_steps, long_len) + 16
    if depths:
        ctx_len = max(max(depths) + DEPTH_PREFILL, long_len) + 16
    if pairs:
        ctx_len = max(RATIO_CONTEXT + RATIO_WARMUP + pairs, long_len) + 16
    info: dict[str, Any] = {"model": str(path), "machine": machine(), "command": "slotserve bench engine"}
    if args.synthetic:
        info["synthetic"] = args.synthetic
        info["llama_bench"] = synthetic.llama_bench_command(path, max(threads), sizes)

    # NOTE: the NumPy implementation is llama's; other architectures are validated by the
    # exactness checks alone (their float reference is tests/reference.py); random weights have
    # no float answer worth the time (the NumPy model dequantizes every weight to float32)
    use_numpy = not args.no_numpy and model.config.arch == "llama" and not args.synthetic
    ref_factory = (lambda: NumpyLlama(model, 512)) if use_numpy else None
    kv = {"swa_full": args.swa_full, "kv_dtype": args.kv_type}
    t_load = time.perf_counter()
    pool = SlotPool(model, 4, ctx_len, threads=max(threads), **kv)
    info["load_s"] = round(time.perf_counter() - t_load, 1)  # weights repacked, KV allocated
    info["kernel_variant"] = pool.kernel_variant
    info["kv_type"] = args.kv_type
    info["kv_bytes_per_slot"] = pool.kv_bytes // 4
    info["validation"] = validate(
        model,
        tokenizer,
        pool,
        ref_factory() if ref_factory else None,
        path.name == DEFAULT_MODEL_NAME,
        long_len,
    )
    batch_sizes = (4,) if args.synthetic or pairs else (4, 8)  # 8 slots of an 8B model's KV: too much memory
    # the validated pool is the one measured when it would be the same (one thread count; 4 slots,
    # or a depth run, which uses slot 0): a big model is then loaded once
    validated: Any = pool if len(threads) == 1 and (max(batch_sizes) == 4 or depths) else None
    del pool
    if not args.json:
        print(
            f"model {path.name} | {info['machine']['cpu']}, {info['machine']['cpus']} CPUs | "
            f"kernels {info['kernel_variant']} | KV {args.kv_type}, "
            f"{info['kv_bytes_per_slot'] / 2**20:.1f} MiB a slot of {ctx_len} tokens | "
            f"loaded in {info['load_s']:.1f} s | validated (chunking and batching exact): "
            f"{info['validation']['engine']!r} = ids {info['validation']['engine_ids']}"
        )

    info["results"] = {}
    for t in threads:
        if pairs:
            pool = (
                validated if validated is not None else SlotPool(model, RATIO_SLOTS, ctx_len, threads=t, **kv)
            )
            validated = None
            ratio = batch_ratio(pool, model.config.n_vocab, pairs, np.random.default_rng(0))
            del pool
            info["results"][f"threads={t}"] = {"batch_ratio": ratio}
            if not args.json:
                blocks = ratio["blocks"] or [ratio["ratio"]]
                print(
                    f"threads {t}: {RATIO_SLOTS} slots vs 1, {pairs} pairs alternating at positions "
                    f"{ratio['positions'][0]}-{ratio['positions'][1]}: median step {ratio['step_ms_1']:.2f} / "
                    f"{ratio[f'step_ms_{RATIO_SLOTS}']:.2f} ms, {ratio['ratio']:.2f}x per token "
                    f"(blocks of {RATIO_BLOCK} pairs: {min(blocks):.2f}-{max(blocks):.2f}x)"
                )
            continue
        if depths:
            pool = validated if validated is not None else SlotPool(model, 1, ctx_len, threads=t, **kv)
            validated = None
            figures = measure_depth(pool, model.config.n_vocab, args.reps, depths)
            del pool
            info["results"][f"threads={t}"] = {k: round(v, 1) for k, v in figures.items()}
            if not args.json:
                print(f"threads {t}: " + "  ".join(f"{k} {v:.1f}" for k, v in figures.items()) + "  tokens/s")
            continue
        if validated is None:
            validated = SlotPool(model, max(batch_sizes), ctx_len, threads=t, **kv)
        pool, validated = validated, None
        figures = measure(
            pool,
            model.config.n_vocab,
            args.reps,
            sizes.prefill,
            sizes.decode_steps,
            sizes.depth,
            batch_sizes,
        )
        result: dict[str, Any] = {k: round(v, 1) for k, v in figures.items()}
        info["results"][f"threads={t}"] = result
        ms: dict[int, float] = {}
        if args.step_ms:
            sizes_ms = tuple(n for n in (1, 2, 4, 8) if n <= max(batch_sizes))
            ms = step_ms(pool, model.config.n_vocab, sizes_ms, np.random.default_rng(1))
            result["step_ms"] = {str(n): round(v, 2) for n, v in ms.items()}
        del pool
        if not args.json:
            one = figures[f"tg{sizes.decode_steps}"]
            ratios = "  ".join(
                f"x{n}/x1 {figures[f'tg{sizes.decode_steps}_x{n}'] / one:.2f}" for n in batch_sizes
            )
            print(
                f"threads {t}: "
                + "  ".join(f"{k} {v:.1f}" for k, v in figures.items())
                + f"  tokens/s  ({ratios})"
            )
            if ms:
                print(
                    f"threads {t}: ms/step "
                    + "  ".join(f"{n} slots {v:.2f} ({n * ms[1] / v:.2f}x)" for n, v in ms.items())
                )
    if ref_factory is not None:
        info["numpy"] = {k: round(v, 2) for k, v in measure_numpy(ref_factory, model.config.n_vocab).items()}
        if not args.json:
            print(
                "numpy (float32, BLAS threads): "
                + "  ".join(f"{k} {v:.2f}" for k, v in info["numpy"].items())
                + "  tokens/s"
            )
    info["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    info["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        print(f"peak RSS {info['peak_rss_gib']:.2f} GiB")
    return 0
