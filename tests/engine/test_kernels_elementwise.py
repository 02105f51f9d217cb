"""rmsnorm, rope (adjacent pairs and neox), gelu_tanh_mul, silu_mul and exp: each variant
against NumPy at sizes that hit the SIMD tails, and avx512vnni's silu_mul bit-identical to
avx2's. Each comparison reports its largest difference and checks it against a named
tolerance."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_support import (
    SUM_RTOL,
    assert_close,
    needs_vnni,
    rng,
)
from slotserve.engine_ext import _engine

# Tolerances beside kernel_support.SUM_RTOL (variants differ in exp's polynomial).
EXP_RTOL = 4e-7  # vector exp against expf: ~2 ulp
SILU_RTOL = 1e-6


@pytest.mark.parametrize("n", [1, 7, 64, 577])
def test_rmsnorm(generic_and_avx2, n):
    r = rng(n)
    x = (r.standard_normal(n) * 4).astype(np.float32)
    w = (1 + 0.1 * r.standard_normal(n)).astype(np.float32)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt(np.mean(x64 * x64) + 1e-5) * w
    for kt in generic_and_avx2:
        assert_close(kt.rmsnorm(x, w, 1e-5), want, np.abs(want) + 1e-6, 8 * SUM_RTOL, f"{kt.name} n={n}")


@pytest.mark.parametrize("n_heads, head_dim", [(1, 2), (3, 6), (3, 16), (2, 64)])
def test_rope(generic_and_avx2, n_heads, head_dim):
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
    for kt in generic_and_avx2:
        assert_close(kt.rope(x, n_heads, head_dim, cs), want.reshape(-1), scale, 4 * SUM_RTOL, kt.name)


@pytest.mark.parametrize("n_heads, head_dim", [(1, 2), (3, 6), (3, 16), (2, 64), (1, 256), (2, 40)])
def test_rope_neox(generic_and_avx2, n_heads, head_dim):
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
    for kt in generic_and_avx2:
        got = kt.rope(x, n_heads, head_dim, cs, neox=True)
        assert_close(got, want.reshape(-1), scale, 4 * SUM_RTOL, kt.name)
        if head_dim > 2:  # (with one pair the two layouts coincide)
            assert not np.allclose(got, kt.rope(x, n_heads, head_dim, cs)), (
                "neox must differ from adjacent pairs"
            )


GELU_ATOL = 2e-6  # near gelu's zero the tanh form and the exp form differ by float rounding


@pytest.mark.parametrize("n", [1, 13, 100])
def test_gelu_tanh_mul(generic_and_avx2, n):
    r = rng(n + 3)
    g = np.concatenate([(r.standard_normal(n) * 4), [-200.0, -10.0, -9.99, 9.99, 10.0, 30.0, 0.0]]).astype(
        np.float32
    )
    u = r.standard_normal(len(g)).astype(np.float32)
    g64 = g.astype(np.float64)
    gelu = 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64**3)))
    gelu = np.where(g64 <= -10, 0.0, np.where(g64 >= 10, g64, gelu))
    want = gelu * u
    for kt in generic_and_avx2:
        got = kt.gelu_tanh_mul(g, u)
        err = np.abs(got - want)
        assert (err <= 8 * SILU_RTOL * np.abs(want) + GELU_ATOL * np.abs(u)).all(), f"{kt.name}: {err.max()}"


@pytest.mark.parametrize("n", [1, 13, 100])
def test_silu_mul(generic_and_avx2, n):
    r = rng(n)
    g = np.concatenate([(r.standard_normal(n) * 6), [-200.0, -30.0, 30.0, 0.0]]).astype(np.float32)
    u = r.standard_normal(len(g)).astype(np.float32)
    g64 = g.astype(np.float64)
    want = g64 / (1 + np.exp(-g64)) * u
    for kt in generic_and_avx2:
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


def test_exp(generic_and_avx2):
    x = np.concatenate([np.linspace(-87.0, 88.0, 2001), [-1e-7, 0.0, 1e-7, -0.5, 0.5]]).astype(np.float32)
    want = np.exp(x.astype(np.float64))
    for kt in generic_and_avx2:
        assert_close(kt.exp(x), want, want, EXP_RTOL, kt.name)
