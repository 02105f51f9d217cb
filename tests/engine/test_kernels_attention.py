"""The attention kernels against a float64 NumPy attention: f16, f32 and q8_0 KV, sliding
windows, query rows independent of how they are grouped, and the query tiles equal to the row
kernel on every variant. Each comparison reports its largest difference and checks it against
a named tolerance."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_support import (
    ALL_VARIANTS,
    SUM_RTOL,
    VARIANTS,
    assert_close,
    rng,
)
from slotserve.engine_ext import _engine


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
    outs = {}
    for name in VARIANTS:
        outs[name] = _engine.KernelTable(name).attention_q8(
            q, k_raw, v_raw, pos0, group, head_dim, scale, window
        )
        assert_close(outs[name], want, mag, 8 * SUM_RTOL, f"{name} q8_0 attention vs numpy")
        if pos0 + n_q > 1:  # (one key alone: its value whatever the score)
            assert np.any(np.abs(outs[name] - plain) > 8 * SUM_RTOL * mag), f"{name}: unquantized queries"
    for name in VARIANTS[1:]:
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


def _assert_query_rows_independent(variant, seed, n_keys, pos0, **window):
    """9 query rows of 2 heads on one KV head of 64 (random, `seed`) over n_keys f16 keys from
    pos0: each row's output equals, bit for bit, that row computed alone."""
    kt = _engine.KernelTable(variant)
    r = rng(seed)
    q = r.standard_normal((9, 2 * 64)).astype(np.float32)
    k = r.standard_normal((n_keys, 64)).astype(np.float16)
    v = r.standard_normal((n_keys, 64)).astype(np.float16)
    together = kt.attention(q, k, v, pos0, 2, 64, 0.125, **window)
    for i in range(9):
        alone = kt.attention(q[i : i + 1].copy(), k, v, pos0 + i, 2, 64, 0.125, **window)
        assert np.array_equal(alone[0], together[i]), f"row {i}"


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_windowed_rows_independent(variant):
    """With a window, a row's output still does not depend on its batch mates (which change
    the blocks and chunks the call skips, and on avx512vnni the query tiles)."""
    _assert_query_rows_independent(variant, 10, 600, 560, window=40)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_attention_query_rows_independent(variant):
    """A query row's output does not depend on which other query rows share the call."""
    _assert_query_rows_independent(variant, 9, 80, 60)


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
