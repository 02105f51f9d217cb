"""The Mamba2 scan (kernels.h mamba2_scan; mamba2.c, arch/x86_avx2_mamba2.c,
arch/x86_avx512_mamba2.c): the portable reference against NumPy in float64, and every variant
against the reference bit for bit (they run its operations in its order), at state widths with
and without the vectors' 16-wide blocks and tails, in place and from another buffer."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_support import VARIANTS
from slotserve.engine_ext import _engine

WIDTHS = (1, 7, 16, 24, 33, 128)  # d_state: tail only, one block, block + tail, Granite 4.0 H's 128


def inputs(p: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    S = rng.standard_normal((p, n)).astype(np.float32)
    x = rng.standard_normal(p).astype(np.float32)
    B = rng.standard_normal(n).astype(np.float32)
    C = rng.standard_normal(n).astype(np.float32)
    return S, x, B, C


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("p", [1, 5, 32])
def test_scan_matches_numpy(n, p):
    S, x, B, C = inputs(p, n, seed=n * 100 + p)
    dA, dt = np.float32(0.8), np.float32(0.3)
    new_s, y = _engine.KernelTable("scalar").mamba2_scan(S, x, B, C, dA, dt)
    want_s = S.astype(np.float64) * float(dA) + np.outer(x.astype(np.float64) * float(dt), B)
    np.testing.assert_allclose(new_s, want_s, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(y, want_s @ C.astype(np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("table", VARIANTS[1:])
@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("in_place", [True, False])
def test_every_variant_equals_the_reference_bit_for_bit(table, n, in_place):
    ref, kt = _engine.KernelTable("scalar"), _engine.KernelTable(table)
    S, x, B, C = inputs(32, n, seed=n)
    for dA, dt in ((0.97, 0.05), (0.2, 3.0)):
        want = ref.mamba2_scan(S, x, B, C, dA, dt, in_place=in_place)
        got = kt.mamba2_scan(S, x, B, C, dA, dt, in_place=in_place)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


@pytest.mark.parametrize("table", VARIANTS)
def test_out_of_place_writes_every_element_and_reads_only_src(table):
    kt = _engine.KernelTable(table)
    S, x, B, C = inputs(3, 40, seed=5)
    in_place = kt.mamba2_scan(S, x, B, C, 0.5, 0.7, in_place=True)
    other = kt.mamba2_scan(S, x, B, C, 0.5, 0.7, in_place=False)  # the target starts as NaN
    assert np.array_equal(in_place[0], other[0]) and np.array_equal(in_place[1], other[1])


def test_bad_shapes_are_refused():
    kt = _engine.KernelTable("scalar")
    S, x, B, C = inputs(4, 8, seed=1)
    with pytest.raises(ValueError, match="need S"):
        kt.mamba2_scan(S, x[:3], B, C, 0.5, 0.5)
    with pytest.raises(ValueError, match="need S"):
        kt.mamba2_scan(S, x, B, C[:7], 0.5, 0.5)
