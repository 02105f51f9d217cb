"""Engine logits against the NumPy reference (tests/reference.py, float64 on dequantized
weights), for prefill and decode, every weight type and both KV dtypes."""

from __future__ import annotations

import numpy as np
import pytest
from engine_support import make_pool, prefill_then_decode, random_tokens
from gguf_fixtures import ARCH_MODELS, ARCHS, K_DIMS
from reference import ReferenceModel

WEIGHT_TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "BF16", "Q5_0", "Q5_1")
# Written as random valid blocks at dim 256 (gguf_fixtures.K_DIMS); K_MIX mixes block types.
K_WEIGHT_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "K_MIX", "Q4_K_M")

# Tolerances on the tiny models' logits (std ~2, |max| ~7), as (largest, mean) absolute error.
# Float weights with f32 KV: only float32 rounding against float64.
FLOAT_F32KV_ATOL = (1e-3, 1e-4)
# f16 KV rounds keys and values to 11 significant bits (measured <= 0.006).
FLOAT_F16KV_ATOL = (0.02, 0.003)
# Block weights: the engine also quantizes every matmul input to 8-bit blocks of 32, as
# llama.cpp does (measured <= 0.26 largest, <= 0.04 mean over 5 types x 3 seeds).
BLOCK_ATOL = (0.4, 0.06)
# The K-quant fixtures (dim 256, random valid blocks) have logits twice as large (std ~4,
# |max| ~20) and errors with them (measured <= 0.47 largest, <= 0.066 mean, both variants).
K_BLOCK_ATOL = (0.8, 0.12)

PREFILL_LEN, DECODE_LEN = 30, 10

_REFERENCES: dict[str, tuple[ReferenceModel, np.ndarray]] = {}


def reference_logits(path, tokens: np.ndarray) -> np.ndarray:
    key = str(path)
    if key not in _REFERENCES:
        _REFERENCES[key] = (ReferenceModel(path), tokens)
    ref, cached_tokens = _REFERENCES[key]
    assert np.array_equal(cached_tokens, tokens)
    return ref.logits(tokens)


def tolerance(weight_type: str, kv_dtype: str) -> tuple[float, float]:
    if weight_type in ("F32", "F16", "BF16"):
        return FLOAT_F32KV_ATOL if kv_dtype == "f32" else FLOAT_F16KV_ATOL
    return K_BLOCK_ATOL if weight_type in K_WEIGHT_TYPES else BLOCK_ATOL


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
@pytest.mark.parametrize("weight_type", WEIGHT_TYPES + K_WEIGHT_TYPES)
def test_prefill_and_decode_match_reference(tiny_model_factory, weight_type, kv_dtype):
    dims = K_DIMS if weight_type in K_WEIGHT_TYPES else {}
    path = tiny_model_factory(weight_type, **dims)
    tokens = random_tokens(PREFILL_LEN + DECODE_LEN, 299, seed=11)
    want = reference_logits(path, tokens)[PREFILL_LEN - 1 :]  # [1 + DECODE_LEN, n_vocab]
    pool = make_pool(path, 2, 64, kv_dtype=kv_dtype)
    got = prefill_then_decode(pool, 1, tokens, PREFILL_LEN)  # the prefill's last row, then each decode step

    max_atol, mean_atol = tolerance(weight_type, kv_dtype)
    diff = np.abs(got - want)
    assert diff[0].max() <= max_atol, f"prefill: largest difference {diff[0].max():.4g} > {max_atol}"
    assert diff[1:].max() <= max_atol, f"decode: largest difference {diff[1:].max():.4g} > {max_atol}"
    assert diff.mean() <= mean_atol, f"mean difference {diff.mean():.4g} > {mean_atol}"
    # where the reference's choice is clear of the tolerance, greedy picks the same token
    top2 = np.sort(want, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * max_atol
    assert clear.any()
    assert np.array_equal(got[clear].argmax(axis=1), want[clear].argmax(axis=1))


def test_untied_output_matrix(tiny_model_factory):
    """A model with its own output.weight (not tied to the embedding) reads that matrix."""
    path = tiny_model_factory("F32", tied=False)
    tokens = random_tokens(12, 299, seed=3)
    want = ReferenceModel(path).logits(tokens)[-1]
    got = make_pool(path, 1, 32, kv_dtype="f32").forward([(0, tokens, 0, True)])[0]
    assert np.abs(got - want).max() <= FLOAT_F32KV_ATOL[0]


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_long_context_matches_reference(tiny_model_factory, kv_dtype):
    """Past several attention chunks (256 keys each) and with decode steps split across
    threads, the engine still computes the reference's attention."""
    path = tiny_model_factory("F32")
    tokens = random_tokens(600, 299, seed=12)
    want = ReferenceModel(path).logits(tokens)[[579, 599]]
    pool = make_pool(path, 1, 640, kv_dtype=kv_dtype, threads=2)
    got = [pool.forward([(0, tokens[:580], 0, True)])[0]]
    for p in range(580, 600):
        last = pool.forward([(0, tokens[p : p + 1], p, True)])[0]
    got.append(last)
    max_atol, _ = FLOAT_F32KV_ATOL if kv_dtype == "f32" else FLOAT_F16KV_ATOL
    diff = np.abs(np.array(got) - want).max()
    assert diff <= max_atol, f"largest difference {diff:.4g} > {max_atol}"


def _prefill_then_decode(path, tokens, kv_dtype, threads=None, kernels="auto"):
    pool = make_pool(path, 2, 64, kv_dtype=kv_dtype, threads=threads, kernels=kernels)
    return prefill_then_decode(pool, 1, tokens, PREFILL_LEN)


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
@pytest.mark.parametrize("arch", ARCHS)
def test_architectures_match_reference(arch_model_factory, arch, kv_dtype):
    """Each architecture's additions (rope_freqs, biases, NEOX rope, q/k norms, post-norms,
    GELU, embedding scale, sliding window 16 crossed by 40 tokens) against the reference:
    all-F32 weights at float tolerance, and the quantized type mix at block tolerance."""
    tokens = random_tokens(PREFILL_LEN + DECODE_LEN, 299, seed=13)
    for weight_type, tensor_types in (("F32", {}), (None, None)):
        overrides = {} if weight_type is None else {"weight_type": weight_type, "tensor_types": tensor_types}
        path = arch_model_factory(arch, **overrides)
        want = ReferenceModel(path).logits(tokens)[PREFILL_LEN - 1 :]
        got = _prefill_then_decode(path, tokens, kv_dtype)
        # the mix's own main type decides: K-quant fixtures (dim 256) have the larger logits
        max_atol, mean_atol = tolerance(weight_type or str(ARCH_MODELS[arch]["weight_type"]), kv_dtype)
        diff = np.abs(got - want)
        label = f"{arch} {weight_type or 'mix'} kv {kv_dtype}"
        assert diff.max() <= max_atol, f"{label}: largest difference {diff.max():.4g} > {max_atol}"
        assert diff.mean() <= mean_atol, f"{label}: mean difference {diff.mean():.4g} > {mean_atol}"
        top2 = np.sort(want, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 2 * max_atol
        assert clear.any()
        assert np.array_equal(got[clear].argmax(axis=1), want[clear].argmax(axis=1))


@pytest.mark.parametrize("arch", ARCHS)
def test_architectures_on_portable_kernels_match_reference(arch_model_factory, arch):
    """The scalar kernel table (rope_neox, gelu_tanh_mul, windowed attention: the path a CPU
    without AVX2 takes) computes each architecture as the reference does."""
    tokens = random_tokens(PREFILL_LEN + DECODE_LEN, 299, seed=15)
    path = arch_model_factory(arch, weight_type="F32", tensor_types={})
    want = ReferenceModel(path).logits(tokens)[PREFILL_LEN - 1 :]
    got = _prefill_then_decode(path, tokens, "f32", kernels="scalar")
    diff = np.abs(got - want).max()
    assert diff <= FLOAT_F32KV_ATOL[0], f"{arch} scalar: largest difference {diff:.4g}"


@pytest.mark.parametrize("max_batch", [512, 32])
def test_sliding_window_long_context_matches_reference(arch_model_factory, max_batch):
    """gemma3 past several attention chunks with window 16 and then 300: whole chunks before
    the window are skipped, in prefill and in decode split across threads. max_batch 32 keeps
    the window layers in rings (256 and 512 rows: engine_kv.c "Rings"), wrapped several times."""
    tokens = random_tokens(600, 299, seed=14)
    for window, ring in ((16, 256), (300, 512)):
        path = arch_model_factory("gemma3", weight_type="F32", tensor_types={}, sliding_window=window)
        want = ReferenceModel(path).logits(tokens)[[579, 599]]
        pool = make_pool(path, 1, 640, kv_dtype="f32", threads=2, max_batch_tokens=max_batch)
        assert pool.ring_len == (ring if max_batch == 32 else 0)
        got = [pool.forward([(0, tokens[:580], 0, True)])[0]]
        for p in range(580, 600):
            last = pool.forward([(0, tokens[p : p + 1], p, True)])[0]
        got.append(last)
        diff = np.abs(np.array(got) - want).max()
        assert diff <= FLOAT_F32KV_ATOL[0], f"window {window}: largest difference {diff:.4g}"
