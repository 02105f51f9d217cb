"""The tiny `granitehybrid` fixture (IBM Granite 4.0 H's architecture: Mamba2 layers and llama
attention) written with the `gguf` package, its tensors named and shaped as llama.cpp's loader
wants them (src/models/granite-hybrid.cpp). gguf_fixtures_vocab.py and gguf_fixtures_weights.py
hold the shared tokenizer and weight writers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf_fixtures_vocab import CHATML_TEMPLATE, add_tiny_tokenizer, tiny_vocab
from gguf_fixtures_weights import RandomTensors, _add

# 5 layers, attention on 1 and 3 (head_count_kv 0 on the Mamba2 ones); 8 Mamba2 heads of 16
# channels in 2 groups (heads 0-3 read group 0, 4-7 group 1); a state of 24 per channel (one
# 16-wide block of the scan's vectors and a tail of 8); the granite scales all away from 1.
GRANITE_DIMS: dict[str, object] = dict(
    n_layers=5, dim=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=128, attention_layers=(1, 3),
    inner=128, n_heads_ssm=8, d_state=24, n_group=2, conv=4,
)  # fmt: skip


def write_tiny_granite(
    path: str | Path,
    *,
    weight_type: str = "F32",
    seed: int = 0,
    n_layers: int = 5,
    dim: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    head_dim: int = 16,
    ffn_dim: int = 128,
    attention_layers: Sequence[int] = (1, 3),
    inner: int = 128,
    n_heads_ssm: int = 8,
    d_state: int = 24,
    n_group: int = 2,
    conv: int = 4,
    rope: bool = False,
    scales: Mapping[str, float] | None = None,
    tensor_types: Mapping[str, str] | None = None,
    tied: bool = True,
    extra_tensors: Sequence[str] = (),
    n_expert: int = 0,
    n_expert_used: int = 2,
    shared_ffn: int = 0,
) -> Path:
    """A random tiny `granitehybrid` model with the tiny tokenizer:

        Mamba2 layer (head_count_kv 0): ssm_in (dim -> z inner | x inner, B, C 2 n_group d_state |
            dt n_heads_ssm), ssm_conv1d [conv_dim][conv] and its bias, ssm_dt.bias, ssm_a
            (-exp(A_log)) and ssm_d [1][heads], ssm_norm [n_group][inner / n_group], ssm_out
        attention layer: attn_q, attn_k, attn_v, attn_output (no biases, no q/k norms)
        every layer: attn_norm, ffn_norm, ffn_{gate,up,down}

    rope: rope.scaling.finetuned (False, as Granite 4.0 H files: no positions in attention);
    scales overrides embedding_scale, residual_scale, attention.scale, logit_scale (0: the key
    is not written); weight_type applies to every 2-D weight, tensor_types overrides single
    tensors by name or kind; extra_tensors adds F32 tensors of those names (shape [dim]).
    n_expert > 0 (Granite 4.0 H Tiny's FFN): every layer's FFN is n_expert experts of ffn_dim
    (ffn_gate_inp F32, ffn_{gate,up,down}_exps; the router's last row repeats the one before it,
    so those two experts tie on every token), n_expert_used per token, plus with shared_ffn a
    shared expert (ffn_{gate,up,down}_shexp, no gate).
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, token_types, merges = tiny_vocab()
    n_vocab = len(tokens)
    overrides = dict(tensor_types or {})
    conv_dim = inner + 2 * n_group * d_state
    in_proj = inner + conv_dim + n_heads_ssm
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim
    arch = "granitehybrid"
    all_scales = {"embedding_scale": 2.0, "residual_scale": 0.5, "attention.scale": 0.2, "logit_scale": 1.5}
    all_scales.update(scales or {})

    w = GGUFWriter(path, arch)
    w.add_name(f"tiny-granitehybrid-{weight_type}")
    w.add_block_count(n_layers)
    w.add_context_length(4096)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn_dim)
    w.add_head_count(n_heads)
    w.add_array(
        f"{arch}.attention.head_count_kv",
        [n_kv_heads if i in attention_layers else 0 for i in range(n_layers)],
    )
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_bool(f"{arch}.rope.scaling.finetuned", rope)
    w.add_layer_norm_rms_eps(1e-5)
    for name, value in all_scales.items():
        if value:
            w.add_float32(f"{arch}.{name}", value)
    w.add_uint32(f"{arch}.expert_count", n_expert)
    w.add_uint32(f"{arch}.expert_used_count", n_expert_used if n_expert else 0)
    if shared_ffn:
        w.add_uint32(f"{arch}.expert_shared_feed_forward_length", shared_ffn)
    w.add_uint32(f"{arch}.ssm.conv_kernel", conv)
    w.add_uint32(f"{arch}.ssm.state_size", d_state)
    w.add_uint32(f"{arch}.ssm.group_count", n_group)
    w.add_uint32(f"{arch}.ssm.time_step_rank", n_heads_ssm)
    w.add_uint32(f"{arch}.ssm.inner_size", inner)
    add_tiny_tokenizer(w, tokens, token_types, merges, CHATML_TEMPLATE)

    t = RandomTensors(w, rng, weight_type, overrides, dim)

    def add_experts(p: str, n: int, shared: int) -> None:
        router = (rng.standard_normal((n, dim)) * dim**-0.5).astype(np.float32)
        router[-1] = router[-2]  # a tie on every token
        _add(w, p + "ffn_gate_inp.weight", router, "F32")
        for name, rows, cols, scale in (
            ("ffn_gate_exps", ffn_dim, dim, dim**-0.5),
            ("ffn_up_exps", ffn_dim, dim, dim**-0.5),
            ("ffn_down_exps", dim, ffn_dim, 4.0 * ffn_dim**-0.5),
        ):
            values = (rng.standard_normal((n, rows, cols)) * scale).astype(np.float32)
            _add(w, p + name + ".weight", values, t.type_of(name))
        if shared:
            t.weight(p + "ffn_gate_shexp.weight", shared, dim, dim**-0.5)
            t.weight(p + "ffn_up_shexp.weight", shared, dim, dim**-0.5)
            t.weight(p + "ffn_down_shexp.weight", dim, shared, 4.0 * shared**-0.5)

    t.weight("token_embd.weight", n_vocab, dim, 0.25)
    for i in range(n_layers):
        p = f"blk.{i}."
        t.norm(p + "attn_norm.weight")
        if i not in attention_layers:
            t.weight(p + "ssm_in.weight", in_proj, dim, dim**-0.5)
            t.vec(p + "ssm_conv1d.weight", 0.5 * rng.standard_normal((conv_dim, conv)))
            t.vec(p + "ssm_conv1d.bias", 0.1 * rng.standard_normal(conv_dim))
            t.vec(p + "ssm_dt.bias", 0.5 * rng.standard_normal(n_heads_ssm))
            t.vec(p + "ssm_a", -np.exp(rng.uniform(-1.5, 0.5, (n_heads_ssm, 1))))
            t.vec(p + "ssm_d", rng.uniform(0.5, 1.5, (n_heads_ssm, 1)))
            t.vec(p + "ssm_norm.weight", 1.0 + 0.1 * rng.standard_normal((n_group, inner // n_group)))
            t.weight(p + "ssm_out.weight", dim, inner, 4.0 * inner**-0.5)
        else:
            t.weight(p + "attn_q.weight", q_dim, dim, dim**-0.5)
            t.weight(p + "attn_k.weight", kv_dim, dim, dim**-0.5)
            t.weight(p + "attn_v.weight", kv_dim, dim, dim**-0.5)
            t.weight(p + "attn_output.weight", dim, q_dim, 4.0 * q_dim**-0.5)
        t.norm(p + "ffn_norm.weight")
        if n_expert:
            add_experts(p, n_expert, shared_ffn)
            continue
        t.weight(p + "ffn_gate.weight", ffn_dim, dim, dim**-0.5)
        t.weight(p + "ffn_up.weight", ffn_dim, dim, dim**-0.5)
        t.weight(p + "ffn_down.weight", dim, ffn_dim, 4.0 * ffn_dim**-0.5)
    for name in extra_tensors:
        t.vec(name, np.zeros(dim))
    t.norm("output_norm.weight")
    if not tied:
        t.weight("output.weight", n_vocab, dim, 0.25)
    t.close()
    return path
