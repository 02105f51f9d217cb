"""The avx512vnni decode-size matmuls (arch/x86_vnni_rows.c) on a vocabulary-sized output: from 2
activation rows, an output of STREAM_MIN_OUT (65536) rows or more is written by non-temporal
stores (the logits of a decode step of several slots). The values must be the avx2 variant's bit
for bit whatever the store, at 1-8 rows (one row keeps ordinary stores), with three groups past
the size (the pairs' odd last group) and an accumulated output sub-range (ordinary loads and
stores)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from gguf_fixtures import random_blocks
from kernel_support import needs_vnni
from slotserve.engine_ext import _engine

STREAM_MIN_OUT = 65536  # x86_vnni_rows.c
N_OUT = STREAM_MIN_OUT + 24  # three row groups more: an odd number of groups
# (type, k): the row kernels' types, rows of a few (super-)blocks
CASES = [("Q8_0", 64), ("Q5_0", 64), ("Q5_1", 64), ("Q4_K", 256), ("Q5_K", 256), ("Q6_K", 256)]


@needs_vnni
@pytest.mark.parametrize(("type_name", "k"), CASES)
def test_streamed_output_identical_to_avx2(type_name, k):
    avx2, vnni = _engine.KernelTable("avx2"), _engine.KernelTable("avx512vnni")
    rng = np.random.default_rng(k)
    qtype = GGMLQuantizationType[type_name]
    if type_name == "Q8_0":  # (random_blocks: the quant_k.h types)
        blocks = quantize(rng.standard_normal((N_OUT, k)).astype(np.float32), qtype)
    else:
        blocks = random_blocks(type_name, N_OUT, k, rng)
    raw = np.ascontiguousarray(blocks).view(np.uint8).reshape(-1)
    t = int(qtype)
    for n_rows in range(1, 9):
        x = rng.standard_normal((n_rows, k)).astype(np.float32)
        x[0, :32] = 127.0  # a block at the activation range's end: the largest integer sums
        q = avx2.quantize_q8a(x)
        want, got = avx2.gemm(t, raw, N_OUT, x, quantized=q), vnni.gemm(t, raw, N_OUT, x, quantized=q)
        assert got.ctypes.data % 16 == 0  # the streamed path's alignment (NumPy's allocations)
        assert np.array_equal(got, want), (
            f"{type_name}, {n_rows} rows: largest difference {np.abs(got - want).max()}"
        )
        base = rng.standard_normal((n_rows, N_OUT)).astype(np.float32)
        want = avx2.gemm(t, raw, N_OUT, x, quantized=q, y=base.copy(), o0=8, o1=N_OUT)
        got = vnni.gemm(t, raw, N_OUT, x, quantized=q, y=base.copy(), o0=8, o1=N_OUT)
        assert np.array_equal(got, want), f"{type_name}, {n_rows} rows, o0=8, accumulate"
