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

Modules: engine_validate.py the output checks, engine_measure.py the timed figures (the sizes,
decode_rate, measure, measure_depth, step_ms, batch_ratio, measure_numpy), machine.py the
machine every report names.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from typing import Any

from .engine_measure import (
    DECODE_STEPS,
    DEPTH,
    DEPTH_PREFILL,
    PREFILL_SIZES,
    RATIO_BLOCK,
    RATIO_CONTEXT,
    RATIO_SLOTS,
    RATIO_WARMUP,
    batch_ratio,
    measure,
    measure_depth,
    measure_numpy,
    step_ms,
)
from .engine_validate import validate
from .machine import machine

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
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


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import numpy as np
    from slotserve.engine_ext import SlotPool
    from slotserve.engine_ext.errors import ModelOpenError
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
    try:
        pool = SlotPool(model, 4, ctx_len, threads=max(threads), **kv)
    except ValueError as exc:  # e.g. --kv-type q8_0 on heads not a multiple of 32: one line, as `serve`
        raise ModelOpenError(f"{path}: {exc}") from None
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
