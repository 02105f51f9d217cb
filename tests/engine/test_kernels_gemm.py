"""The matmul kernel (gemm) on the block and float types: the `_generic` reference against
NumPy, AVX2 against it at row counts and sizes that hit the SIMD tails, every variant's rows
independent of how they are grouped, and avx512vnni bit-identical to avx2. Each comparison
reports its largest difference and checks it against a named tolerance."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from kernel_support import (
    ALL_VARIANTS,
    BLOCK_TYPES,
    FLOAT_TYPES,
    SUM_RTOL,
    assert_close,
    assert_gemm_rows_independent,
    dequantized_activations,
    needs_avx2,
    needs_vnni,
    rng,
    weight_bytes,
)
from slotserve.engine_ext import _engine


@pytest.mark.parametrize("type_name", BLOCK_TYPES + FLOAT_TYPES)
@pytest.mark.parametrize("n_out, k", [(8, 32), (37, 96), (67, 32 * 19)])
def test_gemm_generic_matches_numpy(generic, type_name, n_out, k):
    """The reference itself: exact products of the dequantized operands (float64 NumPy)."""
    raw, w = weight_bytes(type_name, n_out, k, seed=n_out)
    x = rng(k).standard_normal((5, k)).astype(np.float32)
    q = generic.quantize_q8a(x)
    xa = dequantized_activations(q) if type_name in BLOCK_TYPES else x.astype(np.float64)
    want = xa @ w.T
    scale = np.abs(xa) @ np.abs(w).T
    for grouped in (True, False):
        got = generic.gemm(int(GGMLQuantizationType[type_name]), raw, n_out, x, quantized=q, grouped=grouped)
        assert_close(got, want, scale, SUM_RTOL, f"generic {type_name} grouped={grouped}")


@needs_avx2
@pytest.mark.parametrize("type_name", BLOCK_TYPES + FLOAT_TYPES)
@pytest.mark.parametrize("n_out, k", [(8, 32), (37, 96), (67, 32 * 19), (16, 32 * 48)])
@pytest.mark.parametrize("n_rows", [1, 3, 4, 9])
def test_gemm_avx2_matches_generic(generic, avx2, type_name, n_out, k, n_rows):
    raw, w = weight_bytes(type_name, n_out, k, seed=k)
    x = rng(n_rows).standard_normal((n_rows, k)).astype(np.float32)
    q = generic.quantize_q8a(x)
    xa = dequantized_activations(q) if type_name in BLOCK_TYPES else x.astype(np.float64)
    scale = np.abs(xa) @ np.abs(w).T
    t = int(GGMLQuantizationType[type_name])
    for grouped in (True, False):
        want = generic.gemm(t, raw, n_out, x, quantized=q, grouped=grouped)
        got = avx2.gemm(t, raw, n_out, x, quantized=q, grouped=grouped)
        assert_close(got, want, scale, SUM_RTOL, f"avx2 vs generic {type_name} grouped={grouped}")


@needs_avx2
@pytest.mark.parametrize("float_k", [1, 7, 33, 100])
def test_gemm_float_odd_k(generic, avx2, float_k):
    for type_name in FLOAT_TYPES:
        raw, w = weight_bytes(type_name, 13, float_k)
        x = rng(float_k).standard_normal((6, float_k)).astype(np.float32)
        t = int(GGMLQuantizationType[type_name])
        want = x.astype(np.float64) @ w.T
        scale = np.abs(x).astype(np.float64) @ np.abs(w).T
        for kt in (generic, avx2):
            assert_close(kt.gemm(t, raw, 13, x), want, scale, SUM_RTOL, f"{kt.name} {type_name} k={float_k}")


@pytest.mark.parametrize("variant", ALL_VARIANTS)
@pytest.mark.parametrize("type_name", BLOCK_TYPES + FLOAT_TYPES)
@pytest.mark.parametrize("n_rows", [7, 19])
def test_gemm_rows_independent_of_grouping(variant, type_name, n_rows):
    """Row independence (kernels.h NOTE): a row's outputs are bit-identical whether it is
    computed alone, in a tile with others, or in an output sub-range (19 rows: two full tiles
    of 8 on avx512vnni and a rest of 3)."""
    kt = _engine.KernelTable(variant)
    n_out, k = 43, 96
    raw, _ = weight_bytes(type_name, n_out, k)
    x = rng(3).standard_normal((n_rows, k)).astype(np.float32)
    q = kt.quantize_q8a(x)
    t = int(GGMLQuantizationType[type_name])
    assert_gemm_rows_independent(kt, t, raw, n_out, x, q)


@needs_vnni
@pytest.mark.parametrize("type_name", BLOCK_TYPES)
@pytest.mark.parametrize("n_out, k", [(8, 32), (43, 96), (69, 576), (280, 2304)])
def test_vnni_gemm_identical_to_avx2(type_name, n_out, k):
    """avx512vnni (x86_gemm_x8.h with vpdpbusd) gives the avx2 variant's results bit for bit:
    the same exact integer sums, the same float operations per row. Every tile width 1..9 rows
    (Q8_0: up to 8 rows on biased weights, 9 with the signs moved), and 17 and 29 rows: a prefill
    chunk's 512-bit tiles over pairs of groups (x86_gemm_z16.h), two and three tiles of 8 and a
    rest; row groups, a group left over from the pairs and the rows past them (n_out % 8), an
    output sub-range starting at an odd group, accumulate; 280 x 2304: more pairs than one
    block of outputs of the 512-bit tiles (Z_OB) and rows of three slices (Z_KS)."""
    avx2, vnni = _engine.KernelTable("avx2"), _engine.KernelTable("avx512vnni")
    raw, _ = weight_bytes(type_name, n_out, k, seed=n_out)
    if type_name == "Q8_0":
        raw[2:6] = [0x80, 0x7F, 0x80, 0x81]  # -128, 127, -128, -127: the int8 range's ends
    t = int(GGMLQuantizationType[type_name])
    for n_rows in (*range(1, 10), 17, 29):
        x = rng(n_rows).standard_normal((n_rows, k)).astype(np.float32) * np.float32(4.0)
        x[0, :32] = 127.0  # a block at the activation range's end: largest integer sums
        q = avx2.quantize_q8a(x)
        want, got = avx2.gemm(t, raw, n_out, x, quantized=q), vnni.gemm(t, raw, n_out, x, quantized=q)
        assert np.array_equal(got, want), f"{n_rows} rows: largest difference {np.abs(got - want).max()}"
        base = rng(1).standard_normal((n_rows, n_out)).astype(np.float32)
        want = avx2.gemm(t, raw, n_out, x, quantized=q, y=base.copy(), o0=8, o1=n_out)
        got = vnni.gemm(t, raw, n_out, x, quantized=q, y=base.copy(), o0=8, o1=n_out)
        assert np.array_equal(got, want), f"{n_rows} rows, o0=8, accumulate"
