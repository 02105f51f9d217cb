"""The activation quantizer (quantize_q8a), row dequantization and the f16 conversions: each
SIMD variant against the portable `_generic` reference and that reference against gguf.quants /
NumPy, at sizes that hit the SIMD tails (the kernel tests' shared helpers: kernel_support.py,
the `generic` and `avx2` kernel tables: conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from kernel_support import (
    BLOCK_TYPES,
    FLOAT_TYPES,
    assert_close,
    dequantized_activations,
    needs_avx2,
    rng,
    weight_bytes,
)
from slotserve.engine_ext import _engine


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
