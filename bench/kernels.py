"""`slotserve bench kernels`: single-thread matmul speed per weight type, in GB/s of weights.

Decode streams every weight matrix once per step for a handful of activation rows, so its
speed is the rate at which a matmul reads weight bytes. For each type this times one kernel
call (KernelTable.gemm, the engine's row-group layout) of a weight matrix larger than the
last-level cache against 1, 4 and 64 activation rows:

    GB/s      weight bytes (file layout) / seconds per call      (1 and 4 rows: decode)
    GMAC/s    n_out * n_in * rows / seconds per call             (64 rows: prefill)
    of peak   GMAC/s x64 / the variant's peak (below)            (block types)

The peak: one thread's rate of int8 products in the instruction mix a variant's prefill tiles
are built on, on independent accumulators (KernelTable-free `_engine.peak_macs`, kernels.h
kernel_peak_macs): vpdpbusd on 512-bit vectors (avx512vnni, the prefill tiles), on 256-bit
vectors (its decode tiles), and AVX2's vpmaddubsw + vpaddw. "of peak" is then how much of the
machine a GEMM uses; what it loses is weight unpacking, scales and float work around the dot
products. One more mix, avx2+fma, prices that float work: the avx2 pairs each beside one FMA
(its products not counted), so it equals avx2 where FMAs issue apart from vpmaddubsw and falls
toward half of it where they share the multiply pipes (on Zen 5 with AVX2 they do: 0.57).

Validated first: on a small matrix the kernel variant's output must agree with the portable
reference within a float32 summation tolerance.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

# Types in the order of the table; block types' f16 scale offsets inside a block.
TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16")
_F16_AT = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q8_0": (0,),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
}
ROWS = (1, 4, 64)
PEAK_MIXES = ("vnni512", "vnni256", "avx2", "avx2+fma")
PREFILL_MIX = {"avx512vnni": "vnni512", "avx2": "avx2"}  # the mix of each variant's prefill tiles
CHECK_RTOL = 1e-5  # |variant - reference| <= CHECK_RTOL * max|reference| on the check matrix


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--types", nargs="+", choices=TYPES, default=list(TYPES), help="weight types to time")
    parser.add_argument("--n-in", type=int, default=4096, help="row length (a multiple of 256)")
    parser.add_argument(
        "--n-out",
        type=int,
        default=16384,
        help="rows of the weight matrix (default: Q4_K 38 MB, past a 32 MB L3)",
    )
    parser.add_argument("--kernels", default="auto", help="kernel variant: auto, scalar, avx2, avx512vnni")
    parser.add_argument("--min-time", type=float, default=0.5, help="CPU seconds of timed calls per figure")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def weight_bytes(type_name: str, n_out: int, n_in: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 file-layout bytes of a random [n_out, n_in] weight (finite, small scales)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if type_name in ("F16", "BF16"):
        values = rng.standard_normal((n_out, n_in)).astype(np.float32)
        if type_name == "F16":
            return values.astype(np.float16).view(np.uint8).reshape(-1)
        return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(-1)
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    raw = rng.integers(0, 256, (n_out * n_in // block, block_bytes), dtype=np.uint8)
    scale = np.full(len(raw), 0.01, np.float16).view(np.uint8).reshape(-1, 2)
    for at in _F16_AT[type_name]:
        raw[:, at : at + 2] = scale
    return raw.reshape(-1)


def seconds_per_call(call: Any, min_time: float) -> float:
    """Median over 3 rounds of (time of 1 + n calls - time of 1 call) / n, n sized to min_time.

    NOTE: CPU time of this thread (the kernels run in it), not wall time: on a shared machine
    the wall clock also counts the time the thread waited for a core."""
    call(1)  # warm: pages, caches, the packed groups' first touch
    start = time.thread_time()
    call(1)
    one = time.thread_time() - start
    n = max(2, int(min_time / 3 / max(one, 1e-6)))
    rounds = []
    for _ in range(3):
        start = time.thread_time()
        call(1 + n)
        total = time.thread_time() - start
        start = time.thread_time()
        call(1)
        rounds.append(max(total - (time.thread_time() - start), 1e-9) / n)
    return float(np.median(rounds))


def peak_gmacs(mix: str, min_time: float) -> float:
    """One thread's peak of an instruction mix (PEAK_MIXES) in G int8 products per CPU second,
    0.0 if this CPU lacks it: the median of 3 rounds, each sized to a third of min_time."""
    from slotserve.engine_ext import _engine

    iters = 1 << 16
    if _engine.peak_macs(mix, 1) == 0:
        return 0.0
    while True:
        start = time.thread_time()
        _engine.peak_macs(mix, iters)
        if time.thread_time() - start >= min_time / 3 or iters >= 1 << 34:
            break
        iters *= 4
    rounds = []
    for _ in range(3):
        start = time.thread_time()
        macs = _engine.peak_macs(mix, iters)
        rounds.append(macs / max(time.thread_time() - start, 1e-9) / 1e9)
    return float(np.median(rounds))


def check(kt: Any, ref: Any, type_id: int, type_name: str, n_in: int, rng: np.random.Generator) -> None:
    raw = weight_bytes(type_name, 21, n_in, rng)
    x = rng.standard_normal((3, n_in)).astype(np.float32)
    q = ref.quantize_q8a(x)
    want = ref.gemm(type_id, raw, 21, x, quantized=q)
    got = kt.gemm(type_id, raw, 21, x, quantized=q)
    diff = float(np.abs(got - want).max())
    if not diff <= CHECK_RTOL * float(np.abs(want).max()):
        raise SystemExit(f"bench kernels: {kt.name} {type_name} disagrees with the reference by {diff:.3g}")


def run(args: argparse.Namespace) -> int:
    from gguf import GGMLQuantizationType
    from slotserve.bench.machine import machine
    from slotserve.engine_ext import _engine

    if args.n_in % 256 or args.n_in < 256 or args.n_out < 8:
        raise SystemExit("bench kernels: --n-in must be a positive multiple of 256 and --n-out >= 8")
    kt, ref = _engine.KernelTable(args.kernels), _engine.KernelTable("scalar")
    peaks = {mix: peak_gmacs(mix, args.min_time) for mix in PEAK_MIXES}
    peak = peaks.get(PREFILL_MIX.get(kt.name, ""), 0.0)
    rng = np.random.default_rng(0)
    results: dict[str, dict[str, float]] = {}
    for type_name in args.types:
        t = int(GGMLQuantizationType[type_name])
        check(kt, ref, t, type_name, args.n_in, rng)
        raw = weight_bytes(type_name, args.n_out, args.n_in, rng)
        row: dict[str, float] = {"MB": raw.nbytes / 1e6}
        for n_rows in ROWS:
            x = rng.standard_normal((n_rows, args.n_in)).astype(np.float32)
            q = kt.quantize_q8a(x)
            out = np.zeros((n_rows, args.n_out), np.float32)

            def call(n: int, x=x, q=q, out=out, t=t, raw=raw) -> None:
                kt.gemm(t, raw, args.n_out, x, quantized=q, y=out, repeat=n)

            sec = seconds_per_call(call, args.min_time)
            if n_rows < 64:
                row[f"GB/s x{n_rows}"] = raw.nbytes / sec / 1e9
            else:
                row[f"GMAC/s x{n_rows}"] = args.n_out * args.n_in * n_rows / sec / 1e9
        if peak > 0 and type_name not in ("F16", "BF16"):
            row["of peak"] = row[f"GMAC/s x{ROWS[-1]}"] / peak
        results[type_name] = row
    report = {
        "machine": machine(),
        "kernels": kt.name,
        "shape": [args.n_out, args.n_in],
        "peak_gmacs": peaks,
        "peak_mix": PREFILL_MIX.get(kt.name),
        "results": results,
    }
    if args.json:
        print(json.dumps(report))
        return 0
    m = report["machine"]
    print(f"{m.get('cpu', '')}  kernels={kt.name}  weight {args.n_out} x {args.n_in}, one thread")
    print("peak GMAC/s (int8 products, one thread): " + "  ".join(f"{k} {v:.1f}" for k, v in peaks.items()))
    cols = ["MB", "GB/s x1", "GB/s x4", "GMAC/s x64", "of peak"]
    print(f"{'type':<6}" + "".join(f"{c:>12}" for c in cols))
    for type_name, row in results.items():
        print(f"{type_name:<6}" + "".join(f"{row[c]:>12.2f}" if c in row else f"{'-':>12}" for c in cols))
    return 0
