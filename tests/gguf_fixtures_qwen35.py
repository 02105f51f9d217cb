"""The tiny `qwen35` fixture (Qwen3.5 dense: Gated DeltaNet layers and gated attention) written
with the `gguf` package, its tensors named and shaped as llama.cpp's loader wants them
(src/models/qwen35.cpp). gguf_fixtures_vocab.py and gguf_fixtures_weights.py hold the shared
tokenizer and weight writers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf_fixtures_vocab import CHATML_TEMPLATE, add_tiny_tokenizer, tiny_vocab
from gguf_fixtures_weights import RandomTensors

# qwen35's tiny fixture (write_tiny_qwen35): 5 layers, full_attention_interval 4 (layer 3 is
# gated attention, 0-2 and 4 Gated DeltaNet), 4 value heads on 2 key heads (llama.cpp's tiled
# head mapping matters), partial rotary (16 of 32 dims, sections 3+3+2 pairs).
QWEN35_DIMS: dict[str, int] = dict(
    n_layers=5, dim=64, n_heads=2, n_kv_heads=1, head_dim=32, rope_dim=16, ffn_dim=128,
    ssm_d_state=16, ssm_k_heads=2, ssm_v_heads=4, ssm_conv=4,
)  # fmt: skip


def write_tiny_qwen35(
    path: str | Path,
    *,
    weight_type: str = "F32",
    seed: int = 0,
    n_layers: int = 5,
    dim: int = 64,
    n_heads: int = 2,
    n_kv_heads: int = 1,
    head_dim: int = 32,
    rope_dim: int = 16,
    ffn_dim: int = 128,
    ssm_d_state: int = 16,
    ssm_k_heads: int = 2,
    ssm_v_heads: int = 4,
    ssm_conv: int = 4,
    interval: int = 4,
    rope_base: float = 1000000.0,
    tensor_types: Mapping[str, str] | None = None,
    tied: bool = True,
    rope_sections: list[int] | None = None,
) -> Path:
    """A random tiny `qwen35` model (Qwen3.5 dense) with the tiny tokenizer, its tensors named
    and shaped as llama.cpp's loader wants them (src/models/qwen35.cpp):

        recurrent layer (i + 1) % interval != 0: attn_qkv (dim -> 2 key_dim + value_dim),
            attn_gate (z, dim -> value_dim), ssm_conv1d [conv_dim][ssm_conv], ssm_dt.bias,
            ssm_a (-exp(A_log)), ssm_beta and ssm_alpha (dim -> v heads), ssm_norm [d_state],
            ssm_out (value_dim -> dim)
        attention layer: attn_q (dim -> 2 q_dim: per head its query then its gate), attn_k,
            attn_v, attn_q_norm, attn_k_norm, attn_output
        every layer: attn_norm, post_attention_norm (the FFN's norm), ffn_{gate,up,down}

    weight_type applies to every 2-D weight (a WEIGHT_TYPES / MORE_WEIGHT_TYPES / K_TYPES name);
    tensor_types overrides single tensors by name or kind; rope_sections replaces the written
    rope.dimension_sections (default: t, h, w covering rope_dim / 2 pairs, as Qwen3.5's). The A, dt and conv values keep the
    decay exp(g) in about 0.3..0.95 so the state remembers a few dozen tokens.
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, token_types, merges = tiny_vocab()
    n_vocab = len(tokens)
    overrides = dict(tensor_types or {})
    key_dim, value_dim = ssm_k_heads * ssm_d_state, ssm_v_heads * ssm_d_state
    conv_dim = 2 * key_dim + value_dim
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    arch = "qwen35"

    w = GGUFWriter(path, arch)
    w.add_name(f"tiny-qwen35-{weight_type}")
    w.add_block_count(n_layers)
    w.add_context_length(4096)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn_dim)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(rope_dim)
    sections = [(rope_dim // 2 + 2) // 3, (rope_dim // 2 + 2) // 3]
    sections = rope_sections or [*sections, rope_dim // 2 - sum(sections), 0]
    w.add_array(f"{arch}.rope.dimension_sections", sections)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_uint32(f"{arch}.ssm.conv_kernel", ssm_conv)
    w.add_uint32(f"{arch}.ssm.state_size", ssm_d_state)
    w.add_uint32(f"{arch}.ssm.group_count", ssm_k_heads)
    w.add_uint32(f"{arch}.ssm.time_step_rank", ssm_v_heads)
    w.add_uint32(f"{arch}.ssm.inner_size", value_dim)
    w.add_uint32(f"{arch}.full_attention_interval", interval)
    add_tiny_tokenizer(w, tokens, token_types, merges, CHATML_TEMPLATE)

    t = RandomTensors(w, rng, weight_type, overrides, dim)

    t.weight("token_embd.weight", n_vocab, dim, 0.25)
    for i in range(n_layers):
        p = f"blk.{i}."
        t.norm(p + "attn_norm.weight")
        if (i + 1) % interval != 0:
            t.weight(p + "attn_qkv.weight", conv_dim, dim, dim**-0.5)
            t.weight(p + "attn_gate.weight", value_dim, dim, dim**-0.5)
            t.vec(p + "ssm_conv1d.weight", 0.5 * rng.standard_normal((conv_dim, ssm_conv)))
            t.vec(p + "ssm_dt.bias", 0.5 * rng.standard_normal(ssm_v_heads))
            t.vec(p + "ssm_a", -np.exp(rng.uniform(-2.0, 0.0, ssm_v_heads)))
            t.weight(p + "ssm_beta.weight", ssm_v_heads, dim, dim**-0.5)
            t.weight(p + "ssm_alpha.weight", ssm_v_heads, dim, dim**-0.5)
            t.norm(p + "ssm_norm.weight", ssm_d_state)
            t.weight(p + "ssm_out.weight", dim, value_dim, 4.0 * value_dim**-0.5)
        else:
            t.weight(p + "attn_q.weight", 2 * q_dim, dim, dim**-0.5)
            t.weight(p + "attn_k.weight", kv_dim, dim, dim**-0.5)
            t.weight(p + "attn_v.weight", kv_dim, dim, dim**-0.5)
            t.norm(p + "attn_q_norm.weight", head_dim)
            t.norm(p + "attn_k_norm.weight", head_dim)
            t.weight(p + "attn_output.weight", dim, q_dim, 4.0 * q_dim**-0.5)
        t.norm(p + "post_attention_norm.weight")
        t.weight(p + "ffn_gate.weight", ffn_dim, dim, dim**-0.5)
        t.weight(p + "ffn_up.weight", ffn_dim, dim, dim**-0.5)
        t.weight(p + "ffn_down.weight", dim, ffn_dim, 4.0 * ffn_dim**-0.5)
    t.norm("output_norm.weight")
    if not tied:
        t.weight("output.weight", n_vocab, dim, 0.25)
    t.close()
    return path
