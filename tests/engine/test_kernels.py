"""A whole forward under each kernel variant (SLOTSERVE_KERNELS=scalar in a fresh process
against AVX2, avx512vnni bit-identical to avx2), the variant selection's errors, and the
KernelTable's operand checks (lengths that disagree, rows past MAX_ROW_LEN). Each kernel
family against its portable `_generic` reference and NumPy: test_kernels_quant.py, _gemm,
_attention, _elementwise, _kquants, _avx2_tiles, _conv, _recurrent, _mamba2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from engine_support import make_pool, random_tokens
from gguf import GGMLQuantizationType
from gguf_fixtures import K_DIMS, WEIGHT_MIXES
from kernel_support import (
    needs_avx2,
    needs_vnni,
    rng,
    weight_bytes,
)
from slotserve.engine_ext import _engine

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
