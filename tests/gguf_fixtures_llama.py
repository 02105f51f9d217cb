"""`write_tiny_llama`: the tiny model of llama's block and the architectures that add tensors
to it (qwen2, qwen3, gemma3, lfm2, qwen3moe, qwen2moe, olmoe); gguf_fixtures.py's doc describes
the design and ARCH_MODELS each architecture's arguments."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf_fixtures_vocab import CHATML_TEMPLATE, add_tiny_tokenizer, tiny_vocab
from gguf_fixtures_weights import K_TYPES, MORE_WEIGHT_TYPES, WEIGHT_MIXES, WEIGHT_TYPES, _add, random_blocks


def write_tiny_llama(
    path: str | Path,
    *,
    weight_type: str = "Q8_0",
    seed: int = 0,
    n_layers: int = 2,
    dim: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    ffn_dim: int = 128,
    rope_base: float = 10000.0,
    tied: bool = True,
    ctx_train: int = 2048,
    architecture: str = "llama",
    tensor_types: Mapping[str, str] | None = None,
    head_dim: int | None = None,
    sliding_window: int = 0,
    rope_freqs: bool = False,
    chat_template: str | None = CHATML_TEMPLATE,
    extra_tokens: tuple[str, ...] = (),
    conv_layers: tuple[int, ...] = (),
    conv_len: int = 3,
    split_max_tensors: int = 0,
    n_expert: int = 4,
    n_expert_used: int = 2,
    expert_ffn: int = 0,
) -> Path:
    """Write a random tiny model to `path` and return the path (with split_max_tensors > 0: a
    split GGUF of that many tensors per part, `STEM-0000i-of-0000N.gguf` beside `path`, and the
    path of its first part).

    weight_type applies to every 2-D weight (token_embd and output included), or names a mix
    in WEIGHT_MIXES (a type per kind of tensor); norms stay F32. K-quant types need dim and
    ffn_dim multiples of 256 (e.g. dim=256, n_heads=4, ffn_dim=512) or, per tensor, a row
    length (n_in) that is one. tensor_types overrides the type of single tensors by name, or
    of one tensor in every layer by its kind (e.g. "ffn_down"), any gguf.quants type.
    architecture qwen2, qwen3 and gemma3 add their tensors (module doc); another name writes
    llama's tensors under that architecture's metadata prefix (for the wrong-architecture
    fixture). head_dim: written as attention.key_length/value_length when given (default
    dim / n_heads). sliding_window: gemma3's attention.sliding_window. rope_freqs: add llama
    3.1's rope_freqs.weight. chat_template: written as tokenizer.chat_template (None: no key).
    extra_tokens: CONTROL tokens appended after the merges (e.g. Gemma's turn tokens).
    conv_layers: (lfm2) the layers that are short convolutions of conv_len taps instead of
    attention (head_count_kv 0 there).
    qwen3moe / qwen2moe: n_expert experts of expert_ffn (default ffn_dim), n_expert_used per
    token, an F32 router whose last row repeats the one before it (those two experts tie on
    every token: the routing tie case) and, qwen2moe, a shared expert of ffn_dim.
    """
    if weight_type not in WEIGHT_TYPES + MORE_WEIGHT_TYPES + K_TYPES and weight_type not in WEIGHT_MIXES:
        raise ValueError(
            f"weight_type must be one of {WEIGHT_TYPES + MORE_WEIGHT_TYPES + K_TYPES} or a mix "
            f"{tuple(WEIGHT_MIXES)}, got {weight_type!r}"
        )
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, token_types, merges = tiny_vocab()
    tokens += extra_tokens
    token_types += [int(TokenType.CONTROL)] * len(extra_tokens)
    n_vocab = len(tokens)
    if head_dim is None:
        head_dim = dim // n_heads
    else:
        assert head_dim != dim // n_heads or architecture != "llama", "key_length only where it differs"
    overrides = dict(tensor_types or {})
    mix = WEIGHT_MIXES.get(weight_type)
    q_dim, kv_dim = n_heads * head_dim, n_kv_heads * head_dim

    def type_of(name: str, default: str | None = None) -> str:
        """By name, by kind (in every layer), then the default (norms: F32), then the mix."""
        kind = name.removesuffix(".weight").split(".")[-1]
        if name in overrides or kind in overrides:
            return overrides.get(name, overrides.get(kind, ""))
        if default is not None:
            return default
        if mix is None:
            return weight_type
        return mix.get(name.removesuffix(".weight"), mix.get(kind, mix.get("*", "Q8_0")))

    w = GGUFWriter(path, architecture, split_max_tensors=split_max_tensors)
    w.add_name(f"tiny-llama-{weight_type}")
    w.add_block_count(n_layers)
    w.add_context_length(ctx_train)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn_dim)
    moe = architecture in ("qwen3moe", "qwen2moe", "olmoe")
    expert_ffn = expert_ffn or ffn_dim
    if moe:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_expert_used)
        if architecture == "olmoe":  # its experts are feed_forward_length wide (no expert key)
            assert expert_ffn == ffn_dim
        else:
            w.add_expert_feed_forward_length(expert_ffn)
        if architecture == "qwen2moe":
            w.add_expert_shared_feed_forward_length(ffn_dim)
    w.add_head_count(n_heads)
    if architecture == "lfm2":  # per layer: 0 on the short convolutions
        w.add_array(
            f"{architecture}.attention.head_count_kv",
            [0 if i in conv_layers else n_kv_heads for i in range(n_layers)],
        )
        w.add_uint32(f"{architecture}.shortconv.l_cache", conv_len)
    else:
        w.add_head_count_kv(n_kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-5 if architecture == "llama" else 1e-6)
    if head_dim != dim // n_heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if sliding_window:
        w.add_sliding_window(sliding_window)
    add_tiny_tokenizer(w, tokens, token_types, merges, chat_template)

    def add_weight(name: str, rows: int, cols: int, scale: float) -> None:
        # numpy [rows=n_out, cols=n_in] -> GGUF shape (n_in, n_out)
        values = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        type_name = type_of(name)
        if type_name in K_TYPES:
            qtype = GGMLQuantizationType[type_name]
            w.add_tensor(name, random_blocks(type_name, rows, cols, rng, std=scale), raw_dtype=qtype)
        else:
            _add(w, name, values, type_name)

    def add_norm(name: str, n: int = dim) -> None:
        values = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        _add(w, name, values, type_of(name, "F32"))

    def add_bias(name: str, n: int) -> None:
        _add(w, name, (0.5 * rng.standard_normal(n)).astype(np.float32), "F32")

    # Weights ~N(0, 1/n_in) keep each matmul's output O(1). The two projections back into the
    # residual stream are 4x larger and the embedding small (std 0.25): otherwise, with tied
    # output, the input token's own embedding dominates the logits and greedy decoding repeats
    # one token forever. With these scales logits stay within about +-10 and greedy varies.
    # (gemma3 multiplies the embeddings by sqrt(dim) = 8: its residual stream starts at std 2,
    # which its pre- and post-norms absorb; the tied logits keep the scale above)
    def add_experts(name: str, rows: int, cols: int, scale: float) -> None:
        """A 3-D [n_expert][rows][cols] expert tensor (GGUF shape (cols, rows, n_expert))."""
        type_name = type_of(name)
        if type_name in K_TYPES:
            blocks = random_blocks(type_name, n_expert * rows, cols, rng, std=scale)
            qtype = GGMLQuantizationType[type_name]
            w.add_tensor(name, blocks.reshape(n_expert, rows, -1), raw_dtype=qtype)
        else:
            values = (rng.standard_normal((n_expert, rows, cols)) * scale).astype(np.float32)
            _add(w, name, values, type_name)

    def add_moe(i: int) -> None:
        router = (rng.standard_normal((n_expert, dim)) * dim**-0.5).astype(np.float32)
        router[-1] = router[-2]  # a tie on every token
        _add(w, f"blk.{i}.ffn_gate_inp.weight", router, "F32")
        add_experts(f"blk.{i}.ffn_gate_exps.weight", expert_ffn, dim, dim**-0.5)
        add_experts(f"blk.{i}.ffn_up_exps.weight", expert_ffn, dim, dim**-0.5)
        add_experts(f"blk.{i}.ffn_down_exps.weight", dim, expert_ffn, 4.0 * expert_ffn**-0.5)
        if architecture == "qwen2moe":
            shexp_gate = (rng.standard_normal(dim) * dim**-0.5).astype(np.float32)
            _add(w, f"blk.{i}.ffn_gate_inp_shexp.weight", shexp_gate, "F32")
            add_weight(f"blk.{i}.ffn_gate_shexp.weight", ffn_dim, dim, dim**-0.5)
            add_weight(f"blk.{i}.ffn_up_shexp.weight", ffn_dim, dim, dim**-0.5)
            add_weight(f"blk.{i}.ffn_down_shexp.weight", dim, ffn_dim, 4.0 * ffn_dim**-0.5)

    def add_ffn(i: int) -> None:
        add_norm(f"blk.{i}.ffn_norm.weight")
        if moe:
            add_moe(i)
            return
        add_weight(f"blk.{i}.ffn_gate.weight", ffn_dim, dim, dim**-0.5)
        add_weight(f"blk.{i}.ffn_up.weight", ffn_dim, dim, dim**-0.5)
        add_weight(f"blk.{i}.ffn_down.weight", dim, ffn_dim, 4.0 * ffn_dim**-0.5)
        if architecture == "gemma3":
            add_norm(f"blk.{i}.post_ffw_norm.weight")

    add_weight("token_embd.weight", n_vocab, dim, 0.25)
    if rope_freqs:  # llama 3.1's factors: 1 for high frequencies up to 8 for the lowest
        _add(w, "rope_freqs.weight", np.geomspace(1.0, 8.0, head_dim // 2).astype(np.float32), "F32")
    for i in range(n_layers):
        add_norm(f"blk.{i}.attn_norm.weight")
        if i in conv_layers:  # lfm2: b, c, x = in_proj h; out_proj (c * conv(b * x))
            add_weight(f"blk.{i}.shortconv.in_proj.weight", 3 * dim, dim, dim**-0.5)
            conv = (0.5 * rng.standard_normal((dim, conv_len))).astype(np.float32)  # ggml (conv_len, dim)
            _add(w, f"blk.{i}.shortconv.conv.weight", conv, "F32")
            add_weight(f"blk.{i}.shortconv.out_proj.weight", dim, dim, 4.0 * dim**-0.5)
            add_ffn(i)
            continue
        add_weight(f"blk.{i}.attn_q.weight", q_dim, dim, dim**-0.5)
        add_weight(f"blk.{i}.attn_k.weight", kv_dim, dim, dim**-0.5)
        add_weight(f"blk.{i}.attn_v.weight", kv_dim, dim, dim**-0.5)
        if architecture in ("qwen2", "qwen2moe"):
            add_bias(f"blk.{i}.attn_q.bias", q_dim)
            add_bias(f"blk.{i}.attn_k.bias", kv_dim)
            add_bias(f"blk.{i}.attn_v.bias", kv_dim)
        if architecture in ("qwen3", "gemma3", "lfm2", "qwen3moe"):
            add_norm(f"blk.{i}.attn_q_norm.weight", head_dim)
            add_norm(f"blk.{i}.attn_k_norm.weight", head_dim)
        if architecture == "olmoe":  # over the whole projection
            add_norm(f"blk.{i}.attn_q_norm.weight", q_dim)
            add_norm(f"blk.{i}.attn_k_norm.weight", kv_dim)
        add_weight(f"blk.{i}.attn_output.weight", dim, q_dim, 4.0 * q_dim**-0.5)
        if architecture == "gemma3":
            add_norm(f"blk.{i}.post_attention_norm.weight")
        add_ffn(i)
    add_norm("token_embd_norm.weight" if architecture == "lfm2" else "output_norm.weight")
    if not tied:
        add_weight("output.weight", n_vocab, dim, 0.25)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if split_max_tensors:
        return w.format_shard_names(path)[0]
    return path
