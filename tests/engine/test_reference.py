"""The NumPy reference forward pass checks itself: causality, an independent per-token
recomputation, quantization agreement, and greedy variety on the tiny fixtures."""

from __future__ import annotations

import numpy as np
import pytest
from gguf_fixtures import WEIGHT_TYPES
from reference import ReferenceModel

PROMPT = [1, 100, 200, 50, 7, 299 - 1, 3]


@pytest.fixture(scope="module")
def ref(tiny_model_path) -> ReferenceModel:
    return ReferenceModel(tiny_model_path)


def test_logits_shape_and_finite(ref):
    lg = ref.logits(PROMPT)
    assert lg.shape == (len(PROMPT), 299) and np.isfinite(lg).all()


def test_causal_prefix_logits_unchanged_by_appended_tokens(ref):
    full = ref.logits(PROMPT + [5, 6, 7])
    np.testing.assert_allclose(full[: len(PROMPT)], ref.logits(PROMPT), rtol=0, atol=1e-10)


def _incremental_logits(ref: ReferenceModel, tokens: list[int]) -> np.ndarray:
    """Independent formulation: one token at a time with an explicit KV cache, scalar loops
    for RoPE (rotating each pair by its own angle) and per-head attention."""
    hd, group = ref.head_dim, ref.n_heads // ref.n_kv_heads
    cache_k = [[] for _ in range(ref.n_layers)]  # per layer: list of [n_kv_heads, hd]
    cache_v = [[] for _ in range(ref.n_layers)]
    rows = []

    def rope(vec: np.ndarray, pos: int) -> np.ndarray:
        out = vec.copy()
        for h in range(vec.shape[0]):
            for j in range(hd // 2):
                theta = pos / ref.rope_base ** (2 * j / hd)
                a, b = vec[h, 2 * j], vec[h, 2 * j + 1]
                out[h, 2 * j] = a * np.cos(theta) - b * np.sin(theta)
                out[h, 2 * j + 1] = a * np.sin(theta) + b * np.cos(theta)
        return out

    def norm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x * w / np.sqrt((x**2).sum() / x.size + ref.eps)

    for pos, tok in enumerate(tokens):
        x = ref.embd[tok].astype(np.float64)
        for i in range(ref.n_layers):
            W = {
                s: ref.w[f"blk.{i}.{s}.weight"].astype(np.float64)
                for s in (
                    "attn_norm",
                    "attn_q",
                    "attn_k",
                    "attn_v",
                    "attn_output",
                    "ffn_norm",
                    "ffn_gate",
                    "ffn_up",
                    "ffn_down",
                )
            }
            h = norm(x, W["attn_norm"])
            q = rope((W["attn_q"] @ h).reshape(ref.n_heads, hd), pos)
            cache_k[i].append(rope((W["attn_k"] @ h).reshape(ref.n_kv_heads, hd), pos))
            cache_v[i].append((W["attn_v"] @ h).reshape(ref.n_kv_heads, hd))
            heads = []
            for head in range(ref.n_heads):
                ks = np.array([k[head // group] for k in cache_k[i]])  # [pos+1, hd]
                vs = np.array([v[head // group] for v in cache_v[i]])
                s = ks @ q[head] / np.sqrt(hd)
                p = np.exp(s - s.max())
                heads.append((p / p.sum()) @ vs)
            x = x + W["attn_output"] @ np.concatenate(heads)
            h = norm(x, W["ffn_norm"])
            g = W["ffn_gate"] @ h
            x = x + W["ffn_down"] @ (g * (1 / (1 + np.exp(-g))) * (W["ffn_up"] @ h))
        rows.append(ref.out.astype(np.float64) @ norm(x, ref.w["output_norm.weight"]))
    return np.array(rows)


def test_matches_independent_incremental_formulation(ref):
    tokens = PROMPT[:5]
    np.testing.assert_allclose(ref.logits(tokens), _incremental_logits(ref, tokens), rtol=0, atol=1e-8)


def test_untied_output_uses_output_weight(tiny_model_factory):
    ref = ReferenceModel(tiny_model_factory("F32", tied=False))
    assert ref.out is not ref.embd
    np.testing.assert_allclose(ref.logits(PROMPT[:4]), _incremental_logits(ref, PROMPT[:4]), atol=1e-8)


def test_quantized_fixtures_track_the_f32_model(tiny_model_factory):
    """Same seed -> same float weights, so each quantized model's logits must correlate with the
    F32 model's; the floor drops with the format's precision (measured: F16 0.9999996,
    Q8_0 0.9997, Q4_x 0.92-0.96 over seeds 0-2)."""
    base = ReferenceModel(tiny_model_factory("F32")).logits(PROMPT).ravel()
    min_corr = {"F16": 0.99999, "Q8_0": 0.999, "Q4_1": 0.9, "Q4_0": 0.9}
    for wt in WEIGHT_TYPES[1:]:
        lg = ReferenceModel(tiny_model_factory(wt)).logits(PROMPT).ravel()
        corr = np.corrcoef(lg, base)[0, 1]
        assert corr > min_corr[wt], f"{wt}: correlation with F32 logits {corr:.6f}"
    assert not np.allclose(ReferenceModel(tiny_model_factory("Q4_0")).logits(PROMPT).ravel(), base)


@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
def test_greedy_tokens_vary(tiny_model_factory, weight_type):
    ref = ReferenceModel(tiny_model_factory(weight_type))
    out = ref.greedy([1, 100, 200, 50], 16)
    assert len(out) == 16 and all(0 <= t < 299 for t in out)
    assert len(set(out)) >= 4, out
    assert out == [int(np.argmax(r)) for r in ref.logits([1, 100, 200, 50] + out)[3:-1]]


@pytest.mark.real_model
def test_real_model_reference_agrees_with_llamacpp(real_model_path, real_model_file, shared_fixtures_dir):
    """The reference's conventions (adjacent-pair RoPE, GQA, tied Q8_0 output, Q4_1 dequant)
    reproduce llama.cpp's greedy continuation of the real model (first 6 tokens)."""
    import json

    from gguf_fixtures import byte_to_unicode

    case = json.loads((shared_fixtures_dir / "smollm2_greedy_llamacpp.json").read_text())[0]
    vocab = real_model_file.metadata["tokenizer.ggml.tokens"]
    char_to_byte = {c: b for b, c in byte_to_unicode().items()}
    out = ReferenceModel(real_model_path, dtype=np.float32).greedy(case["prompt_ids"], 6)
    text = b"".join(bytes(char_to_byte[c] for c in vocab[t]) for t in out).decode("utf-8")
    assert len(text) > 10 and case["continuation"].startswith(text), (text, case["continuation"])
