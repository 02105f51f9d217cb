"""The Gated DeltaNet kernels (kernels.h ssm_conv, l2norm, gdn_step, gdn_gates; recurrent.c and
arch/x86_avx2_recurrent.c, arch/x86_avx512_recurrent.c): the portable reference against NumPy in
float64, AVX2 against the reference, and AVX-512 against AVX2 bit for bit, at sizes with SIMD tails
(odd, below and above 8 and 16 lanes)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_support import VARIANTS, needs_avx2, needs_vnni
from slotserve.engine_ext import _engine

SIZES = (1, 7, 8, 13, 33, 128)


@pytest.fixture(params=VARIANTS)
def kt(request) -> _engine.KernelTable:
    return _engine.KernelTable(request.param)


def rng_for(n: int) -> np.random.Generator:
    return np.random.default_rng(1000 + n)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("taps", [2, 4])
def test_ssm_conv(kt, n, taps):
    rng = rng_for(n)
    x = rng.standard_normal(n).astype(np.float32)
    tail = rng.standard_normal((taps - 1, n)).astype(np.float32)
    w = rng.standard_normal((taps, n)).astype(np.float32)
    out, new_tail = kt.ssm_conv(x, tail, w)
    inputs = np.concatenate([tail, x[None]]).astype(np.float64)
    want = (w.astype(np.float64) * inputs).sum(axis=0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert np.array_equal(new_tail, inputs[1:].astype(np.float32))  # moved up one, x last


@pytest.mark.parametrize("n", SIZES)
def test_l2norm(kt, n):
    x = rng_for(n).standard_normal(n).astype(np.float32)
    want = x / np.sqrt((x.astype(np.float64) ** 2).sum() + 1e-6)
    np.testing.assert_allclose(kt.l2norm(x, 1e-6), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("d", SIZES)
def test_gdn_step(kt, d):
    rng = rng_for(d)
    S = rng.standard_normal((d, d)).astype(np.float32) * 0.3
    q, k, v = (rng.standard_normal(d).astype(np.float32) for _ in range(3))
    decay, beta, scale = 0.9, 0.7, d**-0.5
    new_s, o = kt.gdn_step(S, q, k, v, decay, beta, scale)
    s = S.astype(np.float64) * decay
    delta = (v - s @ k) * beta
    s = s + np.outer(delta, k)
    np.testing.assert_allclose(new_s, s, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(o, (s @ q) * scale, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("d", SIZES + (16, 17))
def test_gdn_step_out_of_place_equals_in_place(kt, d):
    """The engine's rotating states (engine.h) read one entry and write another: the state and
    output written into another array equal the in-place ones bit for bit (the kernel fills
    every element: the wrapper pre-fills the target with NaN), token after token."""
    rng = rng_for(d)
    s_in = s_out = (rng.standard_normal((d, d)) * 0.3).astype(np.float32)
    for _ in range(6):
        q, k, v = (rng.standard_normal(d).astype(np.float32) for _ in range(3))
        q, k = kt.l2norm(q, 1e-6), kt.l2norm(k, 1e-6)
        decay, beta = float(rng.uniform(0.3, 1.0)), float(rng.uniform(0.0, 1.0))
        s_in, o_in = kt.gdn_step(s_in, q, k, v, decay, beta, d**-0.5)
        s_out, o_out = kt.gdn_step(s_out, q, k, v, decay, beta, d**-0.5, in_place=False)
        assert np.array_equal(o_out, o_in) and np.array_equal(s_out, s_in)


@pytest.mark.parametrize("n", SIZES + (16, 17, 40))
@pytest.mark.parametrize("taps", [2, 4])
def test_ssm_conv_out_of_place_equals_in_place(kt, n, taps):
    rng = rng_for(n)
    x = rng.standard_normal(n).astype(np.float32)
    tail = rng.standard_normal((taps - 1, n)).astype(np.float32)
    w = rng.standard_normal((taps, n)).astype(np.float32)
    out_i, tail_i = kt.ssm_conv(x, tail, w)
    out_o, tail_o = kt.ssm_conv(x, tail, w, in_place=False)
    assert np.array_equal(out_o, out_i) and np.array_equal(tail_o, tail_i)


@needs_avx2
@pytest.mark.parametrize("d", SIZES)
def test_avx2_matches_reference_over_many_tokens(d):
    """Forty tokens of the delta rule on one state: AVX2 stays within float rounding of the
    portable reference (the two sum in other orders)."""
    rng = rng_for(d)
    generic, avx2 = _engine.KernelTable("scalar"), _engine.KernelTable("avx2")
    s_g = s_a = np.zeros((d, d), np.float32)
    for _ in range(40):
        q, k, v = (rng.standard_normal(d).astype(np.float32) for _ in range(3))
        q, k = generic.l2norm(q, 1e-6), generic.l2norm(k, 1e-6)
        decay, beta = float(rng.uniform(0.3, 1.0)), float(rng.uniform(0.0, 1.0))
        s_g, o_g = generic.gdn_step(s_g, q, k, v, decay, beta, d**-0.5)
        s_a, o_a = avx2.gdn_step(s_a, q, k, v, decay, beta, d**-0.5)
        np.testing.assert_allclose(o_a, o_g, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s_a, s_g, rtol=1e-4, atol=1e-5)


@needs_vnni
@pytest.mark.parametrize("d", SIZES + (2, 9, 16, 17, 24, 100))
def test_avx512_gdn_step_identical_to_avx2_over_many_tokens(d):
    """The avx512vnni table's delta rule (two state rows a vector, 8 rows in flight) equals
    AVX2's bit for bit, state and outputs, token after token; sizes cover rows left over after
    blocks of 8 and columns past the last 8."""
    rng = rng_for(d)
    avx2, wide = _engine.KernelTable("avx2"), _engine.KernelTable("avx512vnni")
    s_a = s_w = (rng.standard_normal((d, d)) * 0.3).astype(np.float32)
    for _ in range(20):
        q, k, v = (rng.standard_normal(d).astype(np.float32) for _ in range(3))
        q, k = avx2.l2norm(q, 1e-6), avx2.l2norm(k, 1e-6)
        decay, beta = float(rng.uniform(0.3, 1.0)), float(rng.uniform(0.0, 1.0))
        s_a, o_a = avx2.gdn_step(s_a, q, k, v, decay, beta, d**-0.5)
        s_w, o_w = wide.gdn_step(s_w, q, k, v, decay, beta, d**-0.5)
        assert np.array_equal(o_w, o_a)
        assert np.array_equal(s_w, s_a)


@needs_vnni
@pytest.mark.parametrize("n", SIZES + (16, 17, 40))
@pytest.mark.parametrize("taps", [2, 4])
def test_avx512_ssm_conv_identical_to_avx2(n, taps):
    rng = rng_for(n)
    x = rng.standard_normal(n).astype(np.float32)
    tail = rng.standard_normal((taps - 1, n)).astype(np.float32)
    w = rng.standard_normal((taps, n)).astype(np.float32)
    out_a, tail_a = _engine.KernelTable("avx2").ssm_conv(x, tail, w)
    out_w, tail_w = _engine.KernelTable("avx512vnni").ssm_conv(x, tail, w)
    assert np.array_equal(out_w, out_a) and np.array_equal(tail_w, tail_a)


@pytest.mark.parametrize("n", SIZES)
def test_gdn_gates(kt, n):
    """decay = exp(softplus(alpha + dt) * a), beta = sigmoid(beta), softplus linear above 20;
    inputs over the range real files produce and past the softplus switch."""
    rng = rng_for(n)
    alpha = rng.uniform(-30.0, 30.0, n).astype(np.float32)
    beta = rng.uniform(-20.0, 20.0, n).astype(np.float32)
    dt = rng.uniform(-2.0, 2.0, n).astype(np.float32)
    a = -np.exp(rng.uniform(-3.0, 1.0, n)).astype(np.float32)
    decay, out_beta = kt.gdn_gates(alpha, beta, dt, a)
    x = alpha.astype(np.float64) + dt
    softplus = np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))
    np.testing.assert_allclose(decay, np.exp(softplus * a), rtol=2e-5, atol=1e-30)
    np.testing.assert_allclose(
        out_beta, 1.0 / (1.0 + np.exp(-beta.astype(np.float64))), rtol=2e-6, atol=1e-12
    )


@pytest.mark.parametrize("d", SIZES + (2, 16, 17, 24, 100))
@pytest.mark.parametrize("n", [2, 5, 40])
def test_gdn_steps_identical_to_gdn_step_token_by_token(kt, d, n):
    """gdn_steps (a run of tokens, rows blocked over them in the SIMD variants) gives the numbers
    of gdn_step called token after token, bit for bit: what keeps a prefill's state equal to a
    decode's; sizes cover row blocks of 16, single pairs and a last odd row, and column tails."""
    rng = rng_for(100 * d + n)
    S = (rng.standard_normal((d, d)) * 0.3).astype(np.float32)
    q, k, v = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(3))
    q = np.stack([kt.l2norm(row, 1e-6) for row in q])
    k = np.stack([kt.l2norm(row, 1e-6) for row in k])
    decay = rng.uniform(0.3, 1.0, n).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, n).astype(np.float32)
    s_run, o_run = kt.gdn_steps(S, q, k, v, decay, beta, d**-0.5)
    s_one = S
    for t in range(n):
        s_one, o_one = kt.gdn_step(s_one, q[t], k[t], v[t], float(decay[t]), float(beta[t]), d**-0.5)
        assert np.array_equal(o_run[t], o_one), t
    assert np.array_equal(s_run, s_one)
