"""Every kernel's AVX2 variant against its portable `_generic` reference (and that reference
against NumPy), at sizes that hit the SIMD tails. Each comparison reports its largest
difference and checks it against a named tolerance."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from engine_support import make_pool, random_tokens
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from gguf_fixtures import K_DIMS, WEIGHT_MIXES
from kernel_support import assert_close, assert_gemm_rows_independent, dequantized_activations
from slotserve.engine_ext import _engine

needs_avx2 = pytest.mark.skipif(not _engine.avx2_supported(), reason="this CPU has no AVX2/FMA/F16C")
needs_vnni = pytest.mark.skipif(not _engine.avx512vnni_supported(), reason="this CPU has no AVX512-VNNI")

BLOCK_TYPES = ("Q8_0", "Q4_0", "Q4_1")
FLOAT_TYPES = ("F32", "F16")

# Tolerances. Variants differ only in float summation order (and exp's polynomial), so they
# agree to a few float32 ulps of the magnitudes summed.
SUM_RTOL = 2e-6  # |difference| <= SUM_RTOL * sum(|terms|) for dot products, norms, attention
EXP_RTOL = 4e-7  # vector exp against expf: ~2 ulp
SILU_RTOL = 1e-6


@pytest.fixture(scope="module")
def generic() -> _engine.KernelTable:
    return _engine.KernelTable("scalar")


@pytest.fixture(scope="module")
def avx2() -> _engine.KernelTable:
    if not _engine.avx2_supported():
        pytest.skip("this CPU has no AVX2/FMA/F16C")
    return _engine.KernelTable("avx2")


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


# ---- quantization and decoding ----------------------------------------------------------------


@needs_avx2
@pytest.mark.parametrize("k", [32, 96, 32 * 19])
def test_quantize_q8a_variants_identical(generic, avx2, k):
    x = rng(k).standard_normal((5, k)).astype(np.float32) * np.float32(3.0)
    x[1, :32] = 0.0  # an all-zero block: scale 0
    x[2, 5] = 1e6  # one huge value dominating its block
    want, got = generic.quantize_q8a(x), avx2.quantize_q8a(x)
    for name, a, b in zip(("qs", "d", "s"), got, want):
        assert np.array_equal(a, b), f"{name}: largest difference {np.abs(a.astype(np.float64) - b).max()}"


@pytest.mark.parametrize("k", [32, 96, 32 * 19])
def test_quantize_q8a_generic_round_trip(generic, k):
    x = rng(k).standard_normal((3, k)).astype(np.float32)
    qs, d, s = generic.quantize_q8a(x)
    err = np.abs(dequantized_activations((qs, d, s)) - x)
    # each value is within half a step of its block's scale
    assert np.all(err <= np.repeat(d, 32, axis=1) * 0.5 * (1 + 1e-6)), err.max()
    assert np.all(np.abs(qs.astype(int)) <= 127)
    sums = qs.reshape(3, k // 32, 32).astype(np.int64).sum(axis=2)
    assert np.allclose(s, d * sums, rtol=1e-6, atol=0)


@pytest.mark.parametrize("type_name", BLOCK_TYPES + FLOAT_TYPES)
def test_dequantize_row(generic, type_name):
    k = 32 * 5
    raw, values = weight_bytes(type_name, 2, k)
    row = raw[: len(raw) // 2]
    tables = [generic] + ([_engine.KernelTable("avx2")] if _engine.avx2_supported() else [])
    for kt in tables:
        got = kt.dequantize_row(int(GGMLQuantizationType[type_name]), row, k)
        assert_close(got, values[0], np.abs(values[0]), 1e-7, f"{kt.name} {type_name}")


@needs_avx2
def test_f16_conversions_bit_exact(generic, avx2):
    r = rng(1)
    x = np.concatenate(
        [
            r.standard_normal(37).astype(np.float32) * 10,
            np.array(
                [
                    0.0,
                    -0.0,
                    65504,
                    65519,
                    65520,
                    1e9,
                    -1e9,
                    np.inf,
                    -np.inf,
                    6e-8,
                    3e-8,
                    2.9e-8,
                    1e-5,
                    -6.1e-5,
                    5.96e-8 * 1.5,
                ],
                np.float32,
            ),
            (r.standard_normal(19) * 1e-6).astype(np.float32),
        ]
    )
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    for kt in (generic, avx2):
        got = kt.f32_to_f16(x)
        assert np.array_equal(got, want), f"{kt.name}: {np.flatnonzero(got != want)}"
        back = kt.f16_to_f32(want)
        assert np.array_equal(back, want.view(np.float16).astype(np.float32)), kt.name
    nan = avx2.f32_to_f16(np.array([np.nan] * 9, np.float32))
    assert np.all(np.isnan(nan.view(np.float16))) and np.all(
        np.isnan(generic.f32_to_f16(np.array([np.nan], np.float32)).view(np.float16))
    )


# ---- matmul ------------------------------------------------------------------------------------


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


@pytest.mark.parametrize("variant", ["scalar", "avx2", "avx512vnni"])
@pytest.mark.parametrize("type_name", BLOCK_TYPES + FLOAT_TYPES)
@pytest.mark.parametrize("n_rows", [7, 19])
def test_gemm_rows_independent_of_grouping(variant, type_name, n_rows):
    """Row independence (kernels.h NOTE): a row's outputs are bit-identical whether it is
    computed alone, in a tile with others, or in an output sub-range (19 rows: two full tiles
    of 8 on avx512vnni and a rest of 3)."""
    if variant == "avx2" and not _engine.avx2_supported():
        pytest.skip("no AVX2")
    if variant == "avx512vnni" and not _engine.avx512vnni_supported():
        pytest.skip("no AVX512-VNNI")
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


# ---- attention -----------------------------------------------------------------------------


def attention_numpy(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    pos0: int,
    group: int,
    head_dim: int,
    scale: float,
    window: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(output, bound scale): float64 causal attention of query rows at pos0.. over k, v; with a
    window, row at pos sees keys pos-window+1..pos only."""
    n_q = q.shape[0]
    kf, vf = k.astype(np.float64), v.astype(np.float64)
    out = np.zeros((n_q, group * head_dim))
    mag = np.zeros_like(out)
    for i in range(n_q):
        n = pos0 + i + 1
        lo = max(0, n - window) if window else 0
        for g in range(group):
            qh = q[i, g * head_dim : (g + 1) * head_dim].astype(np.float64)
            s = kf[lo:n] @ qh * scale
            p = np.exp(s - s.max())
            p /= p.sum()
            out[i, g * head_dim : (g + 1) * head_dim] = p @ vf[lo:n]
            mag[i, g * head_dim : (g + 1) * head_dim] = p @ np.abs(vf[lo:n]) * (1 + np.abs(s).max())
    return out, mag


def q8_0_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes [n, head_dim / 32 * 34], their dequantized values float32): each row as blocks of an
    f16 scale max|x| / 127 and 32 int8 values (engine_ext/csrc/kv_q8.h)."""
    n, hd = x.shape
    b = x.reshape(n, hd // 32, 32).astype(np.float32)
    d = (np.abs(b).max(axis=2, keepdims=True) / 127).astype(np.float16)
    inv = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d.astype(np.float32)))
    qv = np.clip(np.round(b * inv), -127, 127).astype(np.int8)
    raw = np.concatenate([d.view(np.uint8).reshape(n, hd // 32, 2), qv.view(np.uint8)], axis=2)
    return raw.reshape(n, -1), (qv.astype(np.float32) * d.astype(np.float32)).reshape(n, hd)


def q8_0_queries(q: np.ndarray) -> np.ndarray:
    """The queries as the q8_0 kernels score them (kv_q8.h kv_q8_quantize_query): per block of 32,
    an f32 scale d = max|x| / 127 and round(x * (1 / d)) (half away from zero), dequantized."""
    b = q.reshape(q.shape[0], -1, 32).astype(np.float32)
    d = np.abs(b).max(axis=2, keepdims=True) / np.float32(127)
    inv = np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, np.float32(1), d)).astype(
        np.float32
    )
    y = (b * inv).astype(np.float32).astype(np.float64)
    qv = np.sign(y) * np.floor(np.abs(y) + 0.5)
    return (qv * d.astype(np.float64)).reshape(q.shape)


@pytest.mark.parametrize("head_dim, group", [(32, 4), (64, 3), (96, 1), (256, 2), (256, 4)])
@pytest.mark.parametrize(
    "pos0, n_q, window",
    [(0, 1, 0), (5, 3, 0), (31, 2, 0), (70, 5, 0), (600, 2, 0), (300, 3, 40), (530, 16, 512)],
)
def test_attention_q8_0_variants_match_numpy(head_dim, group, pos0, n_q, window):
    """q8_0 KV (scalar reference, the AVX2 kernel and its query tiles, the AVX-512 VNNI tiles),
    scored in integers as llama.cpp scores a q8_0 K cache: against float64 attention of the
    quantized queries (kv_q8.h) over the dequantized keys and values, the f32 bound. The same
    outputs miss attention of the unquantized queries by more than that bound (where a row has two
    keys to weigh): the integer scores are what ran."""
    r = rng(pos0 * 10 + n_q + head_dim + group)
    n_keys = pos0 + n_q + 3
    n_q = min(n_q, 64 // group)
    q = r.standard_normal((n_q, group * head_dim)).astype(np.float32)
    k_raw, k = q8_0_rows(r.standard_normal((n_keys, head_dim)) * 0.7)
    v_raw, v = q8_0_rows(r.standard_normal((n_keys, head_dim)))
    scale = head_dim**-0.5
    want, mag = attention_numpy(q8_0_queries(q), k, v, pos0, group, head_dim, scale, window)
    plain, _ = attention_numpy(q, k, v, pos0, group, head_dim, scale, window)
    variants = ["scalar"] + (["avx2"] if _engine.avx2_supported() else [])
    variants += ["avx512vnni"] if _engine.avx512vnni_supported() else []
    outs = {}
    for name in variants:
        outs[name] = _engine.KernelTable(name).attention_q8(
            q, k_raw, v_raw, pos0, group, head_dim, scale, window
        )
        assert_close(outs[name], want, mag, 8 * SUM_RTOL, f"{name} q8_0 attention vs numpy")
        if pos0 + n_q > 1:  # (one key alone: its value whatever the score)
            assert np.any(np.abs(outs[name] - plain) > 8 * SUM_RTOL * mag), f"{name}: unquantized queries"
    for name in variants[1:]:
        assert_close(outs[name], outs["scalar"], mag, 8 * SUM_RTOL, f"{name} vs generic q8_0 attention")


@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("head_dim, group", [(16, 2), (64, 3), (20, 1), (32, 4), (16, 6)])
@pytest.mark.parametrize("pos0, n_q", [(0, 1), (0, 7), (5, 3), (31, 2), (40, 1), (70, 5), (600, 2)])
def test_attention_variants_match_numpy(kv_dtype, head_dim, group, pos0, n_q):
    r = rng(pos0 * 100 + n_q)
    n_keys = pos0 + n_q + 3  # rows past the causal end exist and must be ignored
    q = r.standard_normal((n_q, group * head_dim)).astype(np.float32)
    k = (r.standard_normal((n_keys, head_dim)) * 0.7).astype(kv_dtype)
    v = r.standard_normal((n_keys, head_dim)).astype(kv_dtype)
    k[pos0 + n_q :] = np.nan  # never read
    scale = head_dim**-0.5
    want, mag = attention_numpy(q, k, v, pos0, group, head_dim, scale)
    variants = ["scalar"] + (["avx2"] if _engine.avx2_supported() else [])
    outs = {}
    for name in variants:
        outs[name] = _engine.KernelTable(name).attention(q, k, v, pos0, group, head_dim, scale)
        assert_close(outs[name], want, mag, 8 * SUM_RTOL, f"{name} attention vs numpy")
    if len(outs) == 2:
        assert_close(outs["avx2"], outs["scalar"], mag, 8 * SUM_RTOL, "avx2 vs generic attention")


@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("window", [1, 5, 16, 33, 300])
@pytest.mark.parametrize("pos0, n_q", [(0, 7), (14, 3), (40, 9), (290, 4), (600, 2)])
def test_sliding_window_attention_matches_numpy(kv_dtype, window, pos0, n_q):
    """Keys outside each row's window (inside a key block, whole blocks, whole chunks before it)
    are left out; the keys there are NaN, so reading one into a result would show."""
    head_dim, group = 32, 2
    r = rng(pos0 * 7 + window)
    n_keys = pos0 + n_q
    q = r.standard_normal((n_q, group * head_dim)).astype(np.float32)
    k = (r.standard_normal((n_keys, head_dim)) * 0.7).astype(kv_dtype)
    v = r.standard_normal((n_keys, head_dim)).astype(kv_dtype)
    lo = max(0, pos0 - window + 1)
    k[:lo] = np.nan  # before every row's window: never read
    scale = head_dim**-0.5
    want, mag = attention_numpy(q, k, v, pos0, group, head_dim, scale, window)
    for name in ["scalar"] + (["avx2"] if _engine.avx2_supported() else []):
        got = _engine.KernelTable(name).attention(q, k, v, pos0, group, head_dim, scale, window=window)
        assert_close(got, want, mag, 8 * SUM_RTOL, f"{name} window {window}")


def _skip_unsupported(variant):
    if variant == "avx2" and not _engine.avx2_supported():
        pytest.skip("no AVX2")
    if variant == "avx512vnni" and not _engine.avx512vnni_supported():
        pytest.skip("no AVX512-VNNI")


@pytest.mark.parametrize("variant", ["scalar", "avx2", "avx512vnni"])
def test_windowed_rows_independent(variant):
    """With a window, a row's output still does not depend on its batch mates (which change
    the blocks and chunks the call skips, and on avx512vnni the query tiles)."""
    _skip_unsupported(variant)
    kt = _engine.KernelTable(variant)
    r = rng(10)
    q = r.standard_normal((9, 2 * 64)).astype(np.float32)
    k = r.standard_normal((600, 64)).astype(np.float16)
    v = r.standard_normal((600, 64)).astype(np.float16)
    together = kt.attention(q, k, v, 560, 2, 64, 0.125, window=40)
    for i in range(9):
        alone = kt.attention(q[i : i + 1].copy(), k, v, 560 + i, 2, 64, 0.125, window=40)
        assert np.array_equal(alone[0], together[i]), f"row {i}"


@pytest.mark.parametrize("variant", ["scalar", "avx2", "avx512vnni"])
def test_attention_query_rows_independent(variant):
    """A query row's output does not depend on which other query rows share the call."""
    _skip_unsupported(variant)
    kt = _engine.KernelTable(variant)
    r = rng(9)
    q = r.standard_normal((9, 2 * 64)).astype(np.float32)
    k = r.standard_normal((80, 64)).astype(np.float16)
    v = r.standard_normal((80, 64)).astype(np.float16)
    together = kt.attention(q, k, v, 60, 2, 64, 0.125)
    for i in range(9):
        alone = kt.attention(q[i : i + 1].copy(), k, v, 60 + i, 2, 64, 0.125)
        assert np.array_equal(alone[0], together[i]), f"row {i}"


@pytest.mark.parametrize("kv", ["f16", "f32", "q8_0"])
@pytest.mark.parametrize("head_dim, group", [(64, 7), (256, 4), (32, 2), (24, 3), (128, 5), (96, 1)])
@pytest.mark.parametrize(
    "pos0, n_q, window",
    [(0, 9, 0), (29, 5, 0), (70, 16, 0), (600, 64, 0), (300, 7, 40), (530, 9, 512), (1000, 3, 33)],
)
def test_attention_query_tiles_equal_the_row_kernel(kv, head_dim, group, pos0, n_q, window):
    """The query-tile kernels (arch/x86_attn_tiles.h: key and value blocks converted once per
    call, rows x heads in register tiles; AVX2 and AVX-512) give the row-at-a-time AVX2 kernel's
    results bit for bit: each row of a tiled call equals that row alone (a one-row call is the
    row kernel's), and avx512vnni equals avx2. f16, f32 and q8_0 KV, head sizes that are not a
    multiple of 16, both partial-sum classes of a group of 7 or 5, windows inside and across
    chunks, rows at the causal diagonal."""
    if not _engine.avx2_supported():
        pytest.skip("no AVX2")
    if kv == "q8_0" and head_dim % 32:
        pytest.skip("q8_0 needs head_dim % 32 == 0")
    n_q = max(2, min(n_q, 64 // group))
    r = rng(pos0 + 7 * n_q + head_dim + group)
    n_keys = pos0 + n_q + 3
    q = r.standard_normal((n_q, group * head_dim)).astype(np.float32)
    scale = head_dim**-0.5
    if kv == "q8_0":
        k_raw, _ = q8_0_rows(r.standard_normal((n_keys, head_dim)) * 0.7)
        v_raw, _ = q8_0_rows(r.standard_normal((n_keys, head_dim)))

        def attend(kt, qs, p0):
            return kt.attention_q8(qs, k_raw, v_raw, p0, group, head_dim, scale, window)
    else:
        t = np.float16 if kv == "f16" else np.float32
        k = (r.standard_normal((n_keys, head_dim)) * 0.7).astype(t)
        v = r.standard_normal((n_keys, head_dim)).astype(t)

        def attend(kt, qs, p0):
            return kt.attention(qs, k, v, p0, group, head_dim, scale, window=window)

    variants = ["avx2"] + (["avx512vnni"] if _engine.avx512vnni_supported() else [])
    together = {}
    for name in variants:
        kt = _engine.KernelTable(name)
        together[name] = attend(kt, q, pos0)
        for i in range(n_q):
            alone = attend(kt, q[i : i + 1].copy(), pos0 + i)
            assert np.array_equal(alone[0], together[name][i]), f"{name} row {i}"
    if len(variants) == 2:
        assert np.array_equal(together["avx512vnni"], together["avx2"])


# ---- norm, rope, element-wise ---------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 7, 64, 577])
def test_rmsnorm(generic, n):
    r = rng(n)
    x = (r.standard_normal(n) * 4).astype(np.float32)
    w = (1 + 0.1 * r.standard_normal(n)).astype(np.float32)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 * x64) + 1e-5) * w
    for kt in [generic] + ([_engine.KernelTable("avx2")] if _engine.avx2_supported() else []):
        assert_close(kt.rmsnorm(x, w, 1e-5), want, np.abs(want) + 1e-6, 8 * SUM_RTOL, f"{kt.name} n={n}")


@pytest.mark.parametrize("n_heads, head_dim", [(1, 2), (3, 6), (3, 16), (2, 64)])
def test_rope(generic, n_heads, head_dim):
    r = rng(head_dim)
    x = r.standard_normal(n_heads * head_dim).astype(np.float32)
    theta = 37 * 10000.0 ** (-np.arange(0, head_dim, 2) / head_dim)
    cs = np.stack([np.cos(theta), np.sin(theta)], axis=1).astype(np.float32).reshape(-1)
    xh = x.astype(np.float64).reshape(n_heads, head_dim)
    c, s = cs[0::2].astype(np.float64), cs[1::2].astype(np.float64)
    want = np.empty_like(xh)
    want[:, 0::2] = xh[:, 0::2] * c - xh[:, 1::2] * s
    want[:, 1::2] = xh[:, 0::2] * s + xh[:, 1::2] * c
    scale = np.repeat(np.abs(xh[:, 0::2]) + np.abs(xh[:, 1::2]), 2, axis=1).reshape(-1)
    for kt in [generic] + ([_engine.KernelTable("avx2")] if _engine.avx2_supported() else []):
        assert_close(kt.rope(x, n_heads, head_dim, cs), want.reshape(-1), scale, 4 * SUM_RTOL, kt.name)


@pytest.mark.parametrize("n_heads, head_dim", [(1, 2), (3, 6), (3, 16), (2, 64), (1, 256), (2, 40)])
def test_rope_neox(generic, n_heads, head_dim):
    """NEOX pairs (x[i], x[i + head_dim/2]); head_dim/2 = 20 and 3 hit the SIMD tail."""
    r = rng(head_dim + 1)
    x = r.standard_normal(n_heads * head_dim).astype(np.float32)
    theta = 37 * 10000.0 ** (-np.arange(0, head_dim, 2) / head_dim)
    cs = np.stack([np.cos(theta), np.sin(theta)], axis=1).astype(np.float32).reshape(-1)
    xh = x.astype(np.float64).reshape(n_heads, head_dim)
    c, s = cs[0::2].astype(np.float64), cs[1::2].astype(np.float64)
    a, b = xh[:, : head_dim // 2], xh[:, head_dim // 2 :]
    want = np.concatenate([a * c - b * s, a * s + b * c], axis=1)
    scale = np.tile(np.abs(a) + np.abs(b), 2).reshape(-1)
    for kt in [generic] + ([_engine.KernelTable("avx2")] if _engine.avx2_supported() else []):
        got = kt.rope(x, n_heads, head_dim, cs, neox=True)
        assert_close(got, want.reshape(-1), scale, 4 * SUM_RTOL, kt.name)
        if head_dim > 2:  # (with one pair the two layouts coincide)
            assert not np.allclose(got, kt.rope(x, n_heads, head_dim, cs)), (
                "neox must differ from adjacent pairs"
            )


GELU_ATOL = 2e-6  # near gelu's zero the tanh form and the exp form differ by float rounding


@pytest.mark.parametrize("n", [1, 13, 100])
def test_gelu_tanh_mul(generic, n):
    r = rng(n + 3)
    g = np.concatenate([(r.standard_normal(n) * 4), [-200.0, -10.0, -9.99, 9.99, 10.0, 30.0, 0.0]]).astype(
        np.float32
    )
    u = r.standard_normal(len(g)).astype(np.float32)
    g64 = g.astype(np.float64)
    gelu = 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64**3)))
    gelu = np.where(g64 <= -10, 0.0, np.where(g64 >= 10, g64, gelu))
    want = gelu * u
    for kt in [generic] + ([_engine.KernelTable("avx2")] if _engine.avx2_supported() else []):
        got = kt.gelu_tanh_mul(g, u)
        err = np.abs(got - want)
        assert (err <= 8 * SILU_RTOL * np.abs(want) + GELU_ATOL * np.abs(u)).all(), f"{kt.name}: {err.max()}"


@pytest.mark.parametrize("n", [1, 13, 100])
def test_silu_mul(generic, n):
    r = rng(n)
    g = np.concatenate([(r.standard_normal(n) * 6), [-200.0, -30.0, 30.0, 0.0]]).astype(np.float32)
    u = r.standard_normal(len(g)).astype(np.float32)
    g64 = g.astype(np.float64)
    want = g64 / (1 + np.exp(-g64)) * u
    for kt in [generic] + ([_engine.KernelTable("avx2")] if _engine.avx2_supported() else []):
        assert_close(kt.silu_mul(g, u), want, np.abs(want) + 1e-30, SILU_RTOL, f"{kt.name} n={n}")


@needs_vnni
@pytest.mark.parametrize("n", [1, 13, 16, 17, 100, 3584])
def test_avx512_silu_mul_identical_to_avx2(n):
    """The avx512vnni table's SiLU gate (arch/x86_avx512_act.c, 16 lanes) equals AVX2's bit for
    bit, over the clamps of its exp and past the last 16 (the rest runs the AVX2 kernel)."""
    r = rng(n + 7)
    g = np.concatenate([(r.standard_normal(n) * 6), [-200.0, -90.0, -30.0, 30.0, 90.0, 0.0, -0.0]])
    g = g.astype(np.float32)
    u = r.standard_normal(len(g)).astype(np.float32)
    got = _engine.KernelTable("avx512vnni").silu_mul(g, u)
    assert np.array_equal(got, _engine.KernelTable("avx2").silu_mul(g, u))


def test_exp(generic):
    x = np.concatenate([np.linspace(-87.0, 88.0, 2001), [-1e-7, 0.0, 1e-7, -0.5, 0.5]]).astype(np.float32)
    want = np.exp(x.astype(np.float64))
    for kt in [generic] + ([_engine.KernelTable("avx2")] if _engine.avx2_supported() else []):
        assert_close(kt.exp(x), want, want, EXP_RTOL, kt.name)


# ---- whole forward: scalar path -------------------------------------------------------------

# Logits of a whole forward, scalar vs AVX2 kernels: the same math in another summation order;
# on quantized activations a rounding flip can move a logit by a few hundredths.
FORWARD_VARIANT_ATOL = 0.05

_SCALAR_SCRIPT = """
import json, sys
import numpy as np
from slotserve.engine_ext import SlotPool, kernel_variant
pool = SlotPool(sys.argv[1], 1, 64)
tokens = np.array(json.loads(sys.argv[2]), np.int32)
logits = pool.forward([(0, tokens, 0, True)])[0]
print(json.dumps({"variant": pool.kernel_variant, "module": kernel_variant(), "logits": logits.tolist()}))
"""


@needs_avx2
def test_forward_scalar_env_matches_avx2(tiny_model_factory):
    """SLOTSERVE_KERNELS=scalar forces the portable kernels in a fresh process (the path a CPU
    without AVX2 takes); its logits agree with the AVX2 engine's."""
    path = tiny_model_factory("Q4_1")
    tokens = random_tokens(21, 299, seed=5)
    env = {**os.environ, "SLOTSERVE_KERNELS": "scalar"}
    out = subprocess.run(
        [sys.executable, "-c", _SCALAR_SCRIPT, str(path), json.dumps(tokens.tolist())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["variant"] == "scalar" and result["module"] == "scalar"
    fast = make_pool(path, 1, 64, kernels="avx2")
    assert fast.kernel_variant == "avx2"
    want = fast.forward([(0, tokens, 0, True)])[0]
    got = np.array(result["logits"], np.float32)
    diff = np.abs(got - want).max()
    assert diff <= FORWARD_VARIANT_ATOL, f"largest difference {diff}"
    assert np.argmax(got) == np.argmax(want)


@needs_vnni
@pytest.mark.parametrize("weight_type", ["Q4_1", "Q4_0", "Q8_0", "K_MIX", "Q4_K_M"])
def test_forward_vnni_identical_to_avx2(tiny_model_factory, weight_type):
    """A whole forward on avx512vnni equals avx2's bit for bit (prefill, then a decode step of 8
    slots), so the two share a fingerprint and a snapshot of one restores into the other. K_MIX
    holds every block type; Q4_K_M is llama-quantize's mix."""
    path = tiny_model_factory(weight_type, **(K_DIMS if weight_type in WEIGHT_MIXES else {}))
    pools = {v: make_pool(path, 8, 64, kernels=v) for v in ("avx2", "avx512vnni")}
    assert pools["avx512vnni"].kernel_variant == "avx512vnni"
    assert pools["avx2"].fingerprint == pools["avx512vnni"].fingerprint
    logits = {}
    for v, pool in pools.items():
        prefill = pool.forward([(s, random_tokens(5 + s, 299, seed=s), 0, True) for s in range(8)])
        step = pool.forward([(s, random_tokens(1, 299, seed=10 + s), 5 + s, True) for s in range(8)])
        logits[v] = (prefill, step)
    for got, want in zip(logits["avx512vnni"], logits["avx2"]):
        assert np.array_equal(got, want), f"largest difference {np.abs(got - want).max()}"
    snap = pools["avx2"].snapshot(3, 9)
    pools["avx512vnni"].restore(7, snap)
    nxt = random_tokens(1, 299, seed=99)
    assert np.array_equal(
        pools["avx512vnni"].forward([(7, nxt, 9, True)]), pools["avx2"].forward([(3, nxt, 9, True)])
    )


def test_kernel_env_rejects_unknown_value(tiny_model_path, monkeypatch):
    from slotserve.engine_ext import kernel_variant

    monkeypatch.setenv("SLOTSERVE_KERNELS", "sse9")
    with pytest.raises(ValueError, match="SLOTSERVE_KERNELS"):
        kernel_variant()
    with pytest.raises(ValueError, match="sse9"):
        make_pool(tiny_model_path, 1, 16)
    monkeypatch.setenv("SLOTSERVE_KERNELS", "scalar")
    assert make_pool(tiny_model_path, 1, 16).kernel_variant == "scalar"


def test_kernel_table_refuses_mismatched_operands(generic):
    # lengths that disagree would make the C kernels read or write past a buffer
    f = lambda n: np.ones(n, np.float32)  # noqa: E731
    x = rng(1).standard_normal((2, 64)).astype(np.float32)
    raw, _ = weight_bytes("Q8_0", 16, 64)
    q8 = int(GGMLQuantizationType.Q8_0)
    q = generic.quantize_q8a(x)
    calls = {
        "rmsnorm w short": lambda: generic.rmsnorm(f(64), f(32), 1e-5),
        "rmsnorm empty": lambda: generic.rmsnorm(f(0), f(0), 1e-5),
        "silu_mul u short": lambda: generic.silu_mul(f(64), f(8)),
        "rope x short": lambda: generic.rope(f(64), 2, 64, f(64)),
        "rope cos_sin short": lambda: generic.rope(f(128), 2, 64, f(32)),
        "gemm y shape": lambda: generic.gemm(q8, raw, 16, x, quantized=q, y=np.zeros((2, 8), np.float32)),
        "gemm quantized of other x": lambda: generic.gemm(
            q8, raw, 16, x, quantized=generic.quantize_q8a(x[:1].copy())
        ),
    }
    for what, call in calls.items():
        with pytest.raises(ValueError):
            call()
            pytest.fail(f"{what}: accepted")


@pytest.mark.parametrize("variant", ["scalar", "avx2"])
def test_kernel_table_refuses_rows_longer_than_the_limit(variant):
    """kernels.h MAX_ROW_LEN: the SIMD kernels keep per-row scratch of that size on the stack,
    so a longer row is refused before any C code runs."""
    if variant == "avx2" and not _engine.avx2_supported():
        pytest.skip("no AVX2")
    kt = _engine.KernelTable(variant)
    limit = _engine.max_row_len()
    assert limit == 32 * 1024
    long = np.ones(limit + 32, np.float32)
    q8 = int(GGMLQuantizationType.Q8_0)
    ok_x = np.ones((1, limit), np.float32)
    assert kt.quantize_q8a(ok_x)[0].shape == (1, limit)  # the limit itself is fine
    raw = np.zeros(_engine.row_bytes(q8, limit + 32) * 8, np.uint8)
    calls = {
        "rmsnorm": lambda: kt.rmsnorm(long, long, 1e-5),
        "silu_mul": lambda: kt.silu_mul(long, long),
        "gelu_tanh_mul": lambda: kt.gelu_tanh_mul(long, long),
        "quantize_q8a": lambda: kt.quantize_q8a(long[None, :]),
        "dequantize_row": lambda: kt.dequantize_row(q8, raw[: _engine.row_bytes(q8, limit + 32)], limit + 32),
        "gemm": lambda: kt.gemm(q8, raw, 8, long[None, :], quantized=None),
    }
    for what, call in calls.items():
        with pytest.raises(ValueError, match="limit"):
            call()
            pytest.fail(f"{what}: accepted")
