"""Helpers for kernel tests: the CPU-feature skips (needs_avx2, needs_vnni), the kernel variants
this CPU runs (VARIANTS) and all of them with their skips (ALL_VARIANTS), the weight types
and the shared tolerance, random weights in file layout (weight_bytes), tolerance checks that
name the largest difference, and the float64 values of 8-bit activation blocks."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from slotserve.engine_ext import _engine

needs_avx2 = pytest.mark.skipif(not _engine.avx2_supported(), reason="this CPU has no AVX2/FMA/F16C")
needs_vnni = pytest.mark.skipif(not _engine.avx512vnni_supported(), reason="this CPU has no AVX512-VNNI")
# The kernel tables this CPU can run, portable first (names for _engine.KernelTable).
VARIANTS = (
    ["scalar"]
    + (["avx2"] if _engine.avx2_supported() else [])
    + (["avx512vnni"] if _engine.avx512vnni_supported() else [])
)
# Every kernel table, for parametrize: the same test ids on every CPU, those it lacks skipped.
ALL_VARIANTS = (
    pytest.param("scalar"),
    pytest.param("avx2", marks=needs_avx2),
    pytest.param("avx512vnni", marks=needs_vnni),
)

BLOCK_TYPES = ("Q8_0", "Q4_0", "Q4_1")
FLOAT_TYPES = ("F32", "F16")

# Tolerances. Variants differ only in float summation order (and exp's polynomial), so they
# agree to a few float32 ulps of the magnitudes summed.
SUM_RTOL = 2e-6  # |difference| <= SUM_RTOL * sum(|terms|) for dot products, norms, attention


def assert_close(
    got: np.ndarray, want: np.ndarray, scale: np.ndarray | float, rtol: float, what: str
) -> None:
    """|got - want| <= rtol * scale elementwise; the message names the largest difference."""
    diff = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
    bound = rtol * np.broadcast_to(np.asarray(scale, np.float64), diff.shape) + 1e-30
    worst = np.unravel_index(np.argmax(diff / bound), diff.shape)
    assert np.all(diff <= bound), (
        f"{what}: largest difference {diff.max():.3g} (at {worst}: {diff[worst]:.3g} > bound {bound[worst]:.3g})"
    )


def dequantized_activations(q: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """float64 [n, k] values of quantize_q8a's (qs, d, s)."""
    qs, d, _ = q
    n, k = qs.shape
    return (qs.reshape(n, k // 32, 32).astype(np.float64) * d[:, :, None]).reshape(n, k)


def assert_gemm_rows_independent(kt, t: int, raw: np.ndarray, n_out: int, x: np.ndarray, q) -> None:
    """Row independence (kernels.h NOTE) of kt.gemm on weight `raw` [n_out, k] (n_out > 40) and
    float32 rows x [n, k] with their quantize_q8a blocks q (None for a float weight): each row's
    outputs equal, bit for bit, the same row computed alone, the output sub-ranges 0..16, 16..40,
    40..n_out computed apart, and an accumulate into ones minus one."""
    together = kt.gemm(t, raw, n_out, x, quantized=q)
    for r in range(x.shape[0]):
        one = None if q is None else (q[0][r : r + 1], q[1][r : r + 1], q[2][r : r + 1])
        alone = kt.gemm(t, raw, n_out, x[r : r + 1].copy(), quantized=one)
        assert np.array_equal(alone[0], together[r]), f"row {r}"
    parts = np.zeros_like(together)
    for o0, o1 in ((0, 16), (16, 40), (40, n_out)):
        kt.gemm(t, raw, n_out, x, quantized=q, y=parts, o0=o0, o1=o1)
    assert np.array_equal(parts, together)
    acc = kt.gemm(t, raw, n_out, x, quantized=q, y=np.ones_like(together))
    assert np.array_equal(acc, together + np.float32(1.0))


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def weight_bytes(type_name: str, n_out: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(raw file-layout bytes of a random [n_out, k] weight, its dequantized float64 values)."""
    w = rng(seed).standard_normal((n_out, k)).astype(np.float32)
    qtype = GGMLQuantizationType[type_name]
    if type_name == "F32":
        raw = w
    elif type_name == "F16":
        raw = w.astype(np.float16)
    else:
        raw = quantize(w, qtype)
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    values = dequantize(raw.reshape(n_out, -1), qtype).reshape(n_out, k).astype(np.float64)
    return raw, values
