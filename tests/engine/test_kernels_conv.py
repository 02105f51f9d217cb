"""LFM2's short convolution kernel (kernels.h shortconv): the portable reference against NumPy
and the AVX2 and AVX-512 variants against the reference, bit for bit, at channel counts that
hit the 16- and 8-lane tails, with f32 and f16 stored rows and taps before position 0."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_support import VARIANTS, needs_avx2, needs_vnni
from slotserve.engine_ext import _engine


def numpy_shortconv(gate: np.ndarray, rows: list, w: np.ndarray) -> np.ndarray:
    """The contract in float32, in its order: acc = 0, then acc + w[i] * row[i] tap by tap
    (a product, then an add: NumPy's float32 ops round like the C ones)."""
    acc = np.zeros_like(gate)
    for i, row in enumerate(rows):
        if row is not None:
            acc = acc + w[i] * row.astype(np.float32)
    return gate * acc


def case(n: int, taps: int, dtype: type, missing: int, seed: int):
    rng = np.random.default_rng(seed)
    gate = rng.standard_normal(n).astype(np.float32)
    w = rng.standard_normal((taps, n)).astype(np.float32)
    rows: list = [rng.standard_normal(n).astype(dtype) for _ in range(taps)]
    for i in range(missing):  # the oldest taps: positions before 0
        rows[i] = None
    return gate, rows, w


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 37, 1029])
@pytest.mark.parametrize("taps,missing", [(3, 0), (3, 1), (3, 2), (2, 0), (4, 3), (16, 5)])
def test_shortconv_matches_numpy_exactly(variant, dtype, n, taps, missing):
    gate, rows, w = case(n, taps, dtype, missing, seed=n * 31 + taps)
    got = _engine.KernelTable(variant).shortconv(gate, rows, w)
    want = numpy_shortconv(gate, rows, w)
    assert np.array_equal(got, want), f"largest difference {np.abs(got - want).max()}"


@needs_avx2
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_shortconv_avx2_identical_to_generic_at_random_sizes(dtype):
    generic, avx2 = _engine.KernelTable("scalar"), _engine.KernelTable("avx2")
    rng = np.random.default_rng(5)
    for _ in range(40):
        n, taps = int(rng.integers(1, 300)), int(rng.integers(2, 8))
        gate, rows, w = case(n, taps, dtype, int(rng.integers(0, taps)), seed=int(rng.integers(1 << 30)))
        a, b = generic.shortconv(gate, rows, w), avx2.shortconv(gate, rows, w)
        assert np.array_equal(a, b), f"n={n} taps={taps}: largest difference {np.abs(a - b).max()}"


@needs_vnni
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_shortconv_avx512_identical_to_generic_at_random_sizes(dtype):
    generic, wide = _engine.KernelTable("scalar"), _engine.KernelTable("avx512vnni")
    rng = np.random.default_rng(6)
    for _ in range(40):
        n, taps = int(rng.integers(1, 300)), int(rng.integers(2, 8))
        gate, rows, w = case(n, taps, dtype, int(rng.integers(0, taps)), seed=int(rng.integers(1 << 30)))
        a, b = generic.shortconv(gate, rows, w), wide.shortconv(gate, rows, w)
        assert np.array_equal(a, b), f"n={n} taps={taps}: largest difference {np.abs(a - b).max()}"


def test_shortconv_refuses_mismatched_operands():
    kt = _engine.KernelTable("scalar")
    gate = np.ones(8, np.float32)
    w = np.ones((3, 8), np.float32)
    with pytest.raises(ValueError):
        kt.shortconv(gate, [None, None], w)  # one row per tap
    with pytest.raises(ValueError):
        kt.shortconv(gate, [np.ones(8, np.float32), np.ones(8, np.float16), None], w)  # mixed dtypes
    with pytest.raises(ValueError):
        kt.shortconv(gate, [np.ones(7, np.float32), None, None], w)  # wrong length
