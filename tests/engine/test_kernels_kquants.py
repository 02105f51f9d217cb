"""The kernels of the quant_k.h types (Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16): row decoding against
the gguf package's own dequantizers on random valid blocks, the portable matmul against float64
NumPy, the AVX2 matmul against the portable one, and row independence; at sizes that hit SIMD
tails, row-group tails (n_out not a multiple of 8) and several super-blocks."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quantize
from gguf_fixtures import random_blocks
from kernel_support import (
    VARIANTS,
    assert_close,
    assert_gemm_rows_independent,
    dequantized_activations,
    needs_avx2,
    needs_vnni,
)
from slotserve.engine_ext import _engine

K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
Q5_TYPES = ("Q5_0", "Q5_1")
BLOCK_TYPES = K_TYPES + Q5_TYPES

# Variants differ only in float summation order: a few float32 ulps of the magnitudes summed.
SUM_RTOL = 2e-6
# Row decoding: the same products as gguf's dequantizers, in float32.
DEQUANT_RTOL = 1e-6

# The types whose matmuls the avx512vnni variant runs on vpdpbusd (Q2_K, Q3_K stay on AVX2).
VNNI_TYPES = ("Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def weight(type_name: str, n_out: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(file-layout bytes of a random [n_out, k] weight, its float64 values by gguf.quants)."""
    qtype = GGMLQuantizationType[type_name]
    if type_name == "BF16":
        raw = quantize(rng(seed).standard_normal((n_out, k)).astype(np.float32), qtype).view(np.uint8)
    else:
        raw = random_blocks(type_name, n_out, k, rng(seed))
    values = dequantize(raw, qtype).reshape(n_out, k).astype(np.float64)
    return np.ascontiguousarray(raw).reshape(-1), values


def type_id(type_name: str) -> int:
    return int(GGMLQuantizationType[type_name])


def test_random_blocks_are_valid_and_spread():
    for type_name in BLOCK_TYPES:
        _, values = weight(type_name, 4, 512, seed=1)
        assert np.isfinite(values).all() and 0.5 < values.std() < 2.0, type_name
        assert abs(values.mean()) < 0.3, type_name


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("type_name", BLOCK_TYPES + ("BF16",))
def test_dequantize_row_matches_gguf(variant, type_name):
    kt = _engine.KernelTable(variant)
    block = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][0]
    k = 3 * 256 if block == 256 else 32 * 5
    raw, values = weight(type_name, 3, k, seed=7)
    row_bytes = len(raw) // 3
    for r in range(3):
        got = kt.dequantize_row(type_id(type_name), raw[r * row_bytes : (r + 1) * row_bytes], k)
        assert_close(
            got, values[r], np.abs(values[r]) + 1e-30, DEQUANT_RTOL, f"{variant} {type_name} row {r}"
        )


def test_dequantize_row_refuses_partial_super_blocks():
    kt = _engine.KernelTable("scalar")
    raw, _ = weight("Q4_K", 1, 256)
    with pytest.raises(ValueError):
        kt.dequantize_row(type_id("Q4_K"), raw, 128)


def shapes(type_name: str) -> list[tuple[int, int]]:
    """(n_out, k): whole row groups, group tails, several (super-)blocks."""
    if type_name in K_TYPES:
        return [(8, 256), (37, 512), (19, 256 * 5)]
    if type_name in Q5_TYPES:
        return [(8, 32), (37, 96), (67, 32 * 19)]
    return [(8, 32), (13, 33), (37, 100)]


@pytest.mark.parametrize("type_name", BLOCK_TYPES + ("BF16",))
def test_gemm_generic_matches_numpy(type_name):
    """The reference itself: exact products of the dequantized operands (float64 NumPy)."""
    kt = _engine.KernelTable("scalar")
    for n_out, k in shapes(type_name):
        raw, w = weight(type_name, n_out, k, seed=n_out)
        x = rng(k).standard_normal((5, k)).astype(np.float32)
        if type_name == "BF16":
            q, xa = None, x.astype(np.float64)
        else:
            q = kt.quantize_q8a(x)
            xa = dequantized_activations(q)
        want, scale = xa @ w.T, np.abs(xa) @ np.abs(w).T
        for grouped in (True, False):
            got = kt.gemm(type_id(type_name), raw, n_out, x, quantized=q, grouped=grouped)
            assert_close(got, want, scale, SUM_RTOL, f"generic {type_name} {n_out}x{k} grouped={grouped}")


@needs_avx2
@pytest.mark.parametrize("type_name", BLOCK_TYPES + ("BF16",))
@pytest.mark.parametrize("n_rows", [1, 3, 4, 9])
def test_gemm_avx2_matches_generic(type_name, n_rows):
    generic, avx2 = _engine.KernelTable("scalar"), _engine.KernelTable("avx2")
    for n_out, k in shapes(type_name):
        raw, w = weight(type_name, n_out, k, seed=k)
        x = rng(n_rows).standard_normal((n_rows, k)).astype(np.float32)
        q = None if type_name == "BF16" else generic.quantize_q8a(x)
        xa = x.astype(np.float64) if q is None else dequantized_activations(q)
        scale = np.abs(xa) @ np.abs(w).T
        t = type_id(type_name)
        for grouped in (True, False):
            want = generic.gemm(t, raw, n_out, x, quantized=q, grouped=grouped)
            got = avx2.gemm(t, raw, n_out, x, quantized=q, grouped=grouped)
            assert_close(
                got, want, scale, SUM_RTOL, f"avx2 vs generic {type_name} {n_out}x{k} grouped={grouped}"
            )


@needs_vnni
@pytest.mark.parametrize("type_name", VNNI_TYPES)
def test_gemm_vnni_identical_to_avx2(type_name):
    """avx512vnni (x86_gemm_k.h's vpdpbusd tiles) gives the avx2 variant's results bit for bit:
    every tile width 1..9 rows, and 17 and 29 (a prefill chunk's 512-bit tiles over pairs of
    groups, x86_gemm_z16.h: two and three tiles of 8 and a rest), row groups, a group left over
    from the pairs and the rows past them, weights without row groups, an output sub-range with accumulate, activation blocks at
    the int8 range's ends, 2-8 rows of 1280 (read interleaved, 5-8 in two passes), more pairs than one block of outputs on rows of three slices (280 x
    2304); Q6_K also on rows of 8192 (eight slices)."""
    avx2, vnni = _engine.KernelTable("avx2"), _engine.KernelTable("avx512vnni")
    t = type_id(type_name)
    cases = [(n_out, k, n_rows) for n_out, k in shapes(type_name) for n_rows in (*range(1, 10), 17, 29)]
    # three whole groups and a tail: the decode-size kernels (x86_vnni_rows.c) run groups in
    # pairs and an odd last one alone, 5-8 rows in two passes over each pair
    cases += [(29, 512, n_rows) for n_rows in range(1, 10)]
    # 2-4 rows of 1280, longer than the 1024 elements up to which rows were once read as given:
    # the decode-size kernels read every call of 2+ rows interleaved (x86_vnni_rows.c)
    cases += [(37, 1280, n_rows) for n_rows in range(1, 10)]
    # more pairs than one block of outputs (Z_OB) and rows longer than a slice (Z_KS: 1024,
    # 1024, then 256 elements), the 512-bit tiles' stash between slices
    cases.append((280, 2304, 17))
    if type_name == "Q6_K":
        cases.append((19, 256 * 32, 40))
    for n_out, k, n_rows in cases:
        raw, _ = weight(type_name, n_out, k, seed=n_out + n_rows)
        x = rng(n_rows).standard_normal((n_rows, k)).astype(np.float32)
        x[0, :32] = 127.0  # a block of +127s, then one of -127s: the largest integer sums
        x[-1, 32:64] = -127.0
        q = avx2.quantize_q8a(x)
        for grouped in (True, False):
            want = avx2.gemm(t, raw, n_out, x, quantized=q, grouped=grouped)
            got = vnni.gemm(t, raw, n_out, x, quantized=q, grouped=grouped)
            what = f"{type_name} {n_out}x{k}, {n_rows} rows, grouped={grouped}"
            assert np.array_equal(got, want), f"{what}: largest difference {np.abs(got - want).max()}"
        base = rng(1).standard_normal((n_rows, n_out)).astype(np.float32)
        want = avx2.gemm(t, raw, n_out, x, quantized=q, y=base.copy(), o0=8, o1=n_out)
        got = vnni.gemm(t, raw, n_out, x, quantized=q, y=base.copy(), o0=8, o1=n_out)
        assert np.array_equal(got, want), f"{type_name} {n_out}x{k}, {n_rows} rows, o0=8, accumulate"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("type_name", BLOCK_TYPES + ("BF16",))
@pytest.mark.parametrize("n_rows", [7, 19])
def test_gemm_rows_independent_of_grouping(variant, type_name, n_rows):
    """Row independence (kernels.h NOTE): a row's outputs are bit-identical whether it is
    computed alone, in a tile with others, or in an output sub-range (19 rows: the prefill tiles
    of both x86 variants, a full tile of 16 and a rest of 3 padded, against each row alone on
    the row-group kernels; rows of 1280 on the avx2 tiles' two slices)."""
    kt = _engine.KernelTable(variant)
    n_out, k = 43, (512 if type_name in K_TYPES else 96)
    if n_rows > 9:
        k = 1280
    raw, _ = weight(type_name, n_out, k)
    x = rng(3).standard_normal((n_rows, k)).astype(np.float32)
    q = None if type_name == "BF16" else kt.quantize_q8a(x)
    t = type_id(type_name)
    assert_gemm_rows_independent(kt, t, raw, n_out, x, q)


@needs_avx2
def test_q6_K_tiles_at_the_int16_bounds():
    """The avx2 Q6_K tiles (x86_avx2_tiles.c tg_q6_K) sum a sub-block's products in int16
    modulo 2^16 and take 32 x the activations' sums off: exact only because the result, a dot
    product of q - 32, is within 8 * 32 * 127. At the bounds (all quants 0 or all 63, against
    blocks of +127 and of -127) a row in a tile of 16 equals itself alone on the row-group
    kernels (x86_gemm_k.h: signs moved onto the activations, no wrap) bit for bit."""
    kt, t = _engine.KernelTable("avx2"), type_id("Q6_K")
    n_out, k, n_rows = 43, 512, 17
    raw, _ = weight("Q6_K", n_out, k, seed=5)
    blocks = raw.reshape(n_out, k // 256, 210)
    blocks[:16, :, :192] = 0  # ql and qh: quants 0, i.e. -32
    blocks[16:32, :, :192] = 0xFF  # quants 63, i.e. +31
    x = np.where(rng(7).random((n_rows, k)) < 0.5, -1.0, 1.0).astype(np.float32)
    x[:, :64] = 1.0  # whole blocks of one sign too: +127 x 8 bytes a lane
    x[1::2, :64] = -1.0
    q = kt.quantize_q8a(x)
    assert np.abs(q[0]).max() == 127
    before = _engine.avx2_tile_pairs(t)
    assert_gemm_rows_independent(kt, t, raw.reshape(-1), n_out, x, q)
    assert _engine.avx2_tile_pairs(t) > before  # the tiles ran (a tile of 16 rows, 40 outputs)


def test_gemm_refuses_partial_super_blocks():
    kt = _engine.KernelTable("scalar")
    raw, _ = weight("Q6_K", 8, 256)
    x = np.ones((1, 128), np.float32)
    with pytest.raises(ValueError):
        kt.gemm(type_id("Q6_K"), raw[: len(raw) // 2], 8, x, quantized=kt.quantize_q8a(x))


@needs_avx2
def test_q5_0_at_the_int16_bounds():
    """Q5_0's integer is dot(q - 16, a), exact in every variant. The avx2 kernels (x86_avx2_tiles.c
    tg_q5, x86_gemm_k.h tile_q5) sum an int16 lane's 8 runs of unsigned products modulo 2^16 and
    take 16 x the activation bytes it multiplied off: exact only because the result is within 16 *
    16 * 127. At the bounds (all quants 0 or all 31, against blocks of +127 and of -127, where a
    lane's raw sum wraps) a row in a tile of 16 equals itself alone on the row-group kernels bit
    for bit, both equal the float64 products of the dequantized operands within rounding, and the
    vnni variant (16 x the block sums taken off in int32) gives the same bits."""
    kt, t = _engine.KernelTable("avx2"), type_id("Q5_0")
    n_out, k, n_rows = 43, 128, 17
    raw, _ = weight("Q5_0", n_out, k, seed=5)
    blocks = raw.reshape(n_out, k // 32, 22)
    blocks[:16, :, 2:] = 0  # qh and qs: quants 0, i.e. -16
    blocks[16:32, :, 2:] = 0xFF  # quants 31, i.e. +15
    w = dequantize(blocks.reshape(-1), GGMLQuantizationType.Q5_0).reshape(n_out, k).astype(np.float64)
    x = np.where(rng(7).random((n_rows, k)) < 0.5, -1.0, 1.0).astype(np.float32)
    x[:, :64] = 1.0  # whole blocks of one sign too: +-127 x 16 bytes a lane
    x[1::2, :64] = -1.0
    q = kt.quantize_q8a(x)
    assert np.abs(q[0]).max() == 127
    flat = blocks.reshape(-1)
    before = _engine.avx2_tile_pairs(t)
    assert_gemm_rows_independent(kt, t, flat, n_out, x, q)
    assert _engine.avx2_tile_pairs(t) > before  # the tiles ran (a tile of 16 rows, 40 outputs)
    got = kt.gemm(t, flat, n_out, x, quantized=q)
    xa = dequantized_activations(q)
    assert_close(got, xa @ w.T, np.abs(xa) @ np.abs(w).T, SUM_RTOL, "avx2 Q5_0 at the bounds")
    if _engine.avx512vnni_supported():
        vnni = _engine.KernelTable("avx512vnni")
        for n in (1, 2, 5, n_rows):  # the 256-bit tiles, the decode pairs, the 512-bit tiles
            xn, qn = x[:n].copy(), tuple(p[:n].copy() for p in q)
            for grouped in (True, False):
                want = kt.gemm(t, flat, n_out, xn, quantized=qn, grouped=grouped)
                got = vnni.gemm(t, flat, n_out, xn, quantized=qn, grouped=grouped)
                assert np.array_equal(got, want), f"vnni vs avx2, {n} rows, grouped={grouped}"
