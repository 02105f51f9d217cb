"""Tiny GGUF models written by the tests themselves (gguf.GGUFWriter + gguf.quants).

Design: `write_tiny_llama` builds a complete, servable model: random weights scaled so that the
residual stream and logits stay O(1) (greedy tokens vary), every 2-D weight in one tensor type,
F32 norms, and a real gpt2-style byte-level BPE tokenizer with a ChatML chat template:

    id 0..2      <|endoftext|> <|im_start|> <|im_end|>   (CONTROL; bos = 1, eos = 2)
    id 3..258    the 256 byte tokens, byte b -> id 3 + b  (GPT-2 bytes_to_unicode alphabet)
    id 259..     one token per merge in TINY_MERGES, in order

n_vocab = 259 + len(TINY_MERGES) = 299: not a multiple of 8, so vocab loops hit SIMD tails.
Variants for load errors: `write_wrong_arch` and `write_unsupported_type`.

gguf.quants cannot quantize the K-quants (Q2_K .. Q6_K), so weights of those types are
random valid blocks (`random_blocks`: random quant and scale bytes, f16 super-block scales set
so the dequantized values have the wanted spread); the reference dequantizes them with
gguf.quants like any other type. A mix (`WEIGHT_MIXES`) gives each kind of tensor its own type,
as llama-quantize's Q4_K_M files do; K-quant models need dim and ffn_dim multiples of 256.

`write_tiny_model(path, arch)` writes the other architectures with the same tokenizer and the
tensors their blocks add (`ARCH_MODELS` names each fixture's shape and type mix):

    llama3  llama with rope_freqs.weight (Llama 3.1 frequency factors)
    qwen2   attn_{q,k,v}.bias
    qwen3   attn_{q,k}_norm, key_length 128 != dim / n_heads
    gemma3  attn_{q,k}_norm, post_attention_norm, post_ffw_norm, key_length 64 != dim / n_heads,
            one kv head, 6 layers (layer 5 global), sliding window 16 on the others
    lfm2    3 layers: 0 and 2 short convolutions (shortconv.{in_proj,conv,out_proj}, 3 taps,
            head_count_kv 0 there), 1 attention with attn_{q,k}_norm; token_embd_norm

Each one's weights are the type mix llama-quantize's Q4_K_M gives the real model of that family
(with its fallbacks where a row is not a multiple of 256); an all-F32 variant
(weight_type="F32", tensor_types={}) checks the architecture itself at float tolerance.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import dequantize, quantize

WEIGHT_TYPES = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1")
# Types gguf.quants quantizes from the float weights (beside WEIGHT_TYPES).
MORE_WEIGHT_TYPES = ("BF16", "Q5_0", "Q5_1")
# Types written as random valid blocks (row length a multiple of 256).
K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

# Per tensor (its name without ".weight") or kind of tensor (the name's last part); "*" covers
# the rest.
WEIGHT_MIXES: dict[str, dict[str, str]] = {
    # llama-quantize Q4_K_M's mix (Q4_K; Q6_K for ffn_down and the embeddings), with every other
    # block type somewhere so one model exercises them all.
    "K_MIX": {
        "token_embd": "Q6_K",
        "attn_q": "Q4_K",
        "attn_k": "Q5_K",
        "attn_v": "Q3_K",
        "attn_output": "Q5_0",
        "ffn_gate": "Q2_K",
        "ffn_up": "Q5_1",
        "ffn_down": "Q6_K",
        "blk.1.ffn_down": "Q8_0",
        "output": "Q4_K",
    },
    # the bulk of llama-quantize's Q4_K_M: Q4_K, with Q6_K for attn_v, ffn_down and embeddings
    "Q4_K_M": {"*": "Q4_K", "attn_v": "Q6_K", "ffn_down": "Q6_K", "token_embd": "Q6_K"},
}

# Shape arguments of write_tiny_llama for models with K-quant weights (rows of 256 and 512).
K_DIMS: dict[str, int] = {"dim": 256, "ffn_dim": 512}

# Byte offsets of the f16 scales in one block, and the f16 dmin/min as a multiple of d that
# centres the values near 0 (Q4_K: q mean 7.5, sc ~ m; Q5_K: q mean 15.5; Q2_K: q mean 1.5; Q5_1: d*q + m).
_F16_FIELDS = {
    "Q5_0": (0, None, 0.0),
    "Q5_1": (0, 2, -15.5),
    "Q4_K": (0, 2, 7.5),
    "Q5_K": (0, 2, 15.5),
    "Q6_K": (208, None, 0.0),
    "Q2_K": (80, 82, 1.5),
    "Q3_K": (108, None, 0.0),
}

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BOS_ID, EOS_ID = 1, 2
BYTE_TOKEN_OFFSET = len(SPECIAL_TOKENS)

# Merges of common English pairs, each "left right" over tokens that exist before it.
TINY_MERGES = (
    "Ġ t",
    "h e",
    "Ġt he",
    "i n",
    "e r",
    "a n",
    "o n",
    "r e",
    "Ġ a",
    "e n",
    "a t",
    "o u",
    "e d",
    "i s",
    "Ġ s",
    "Ġ w",
    "Ġ o",
    "o r",
    "e s",
    "i t",
    "Ġ b",
    "Ġ c",
    "in g",
    "Ġ f",
    "Ġ m",
    "Ġ p",
    "a r",
    "Ġt o",
    "l l",
    "Ġa n",
    "Ġan d",
    "Ġ i",
    "Ġi n",
    "Ġo f",
    "h a",
    "Ġ h",
    "Ġh e",
    "Ġ d",
    "l e",
    "Ġ is",
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (printable Latin-1 bytes map to
    themselves, the rest to code points from 256 upwards, in byte order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token_types, merges) of the tiny tokenizer."""
    tokens = list(SPECIAL_TOKENS) + [byte_to_unicode()[b] for b in range(256)]
    types = [int(TokenType.CONTROL)] * len(SPECIAL_TOKENS) + [int(TokenType.NORMAL)] * 256
    known = set(tokens)
    for merge in TINY_MERGES:
        left, right = merge.split(" ")
        assert left in known and right in known and left + right not in known, merge
        tokens.append(left + right)
        types.append(int(TokenType.NORMAL))
        known.add(left + right)
    return tokens, types, list(TINY_MERGES)


def add_tiny_tokenizer(
    w: GGUFWriter, tokens: list[str], token_types: list[int], merges: list[str], chat_template: str | None
) -> None:
    """The tiny tokenizer's keys (tiny_vocab, or it with extra tokens), in the order every writer
    here writes them, which the recorded fixtures' sha256 depend on."""
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    w.add_add_space_prefix(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)


def add_random_weight(
    w: GGUFWriter, rng: np.random.Generator, name: str, type_name: str, rows: int, cols: int, scale: float
) -> None:
    """A [rows, cols] weight of std `scale` in `type_name`: random blocks for the K-quants, else
    normal floats converted (the draws the qwen35 and granitehybrid fixtures' records were
    written with)."""
    if type_name in K_TYPES:
        qtype = GGMLQuantizationType[type_name]
        w.add_tensor(name, random_blocks(type_name, rows, cols, rng, std=scale), raw_dtype=qtype)
    else:
        _add(w, name, (rng.standard_normal((rows, cols)) * scale).astype(np.float32), type_name)


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


# Each architecture's tiny fixture: write_tiny_llama arguments. Type mixes in the spirit of
# llama-quantize's (attn_v and ffn_down one step finer than the rest, token_embd Q8_0).
ARCH_MODELS: dict[str, dict[str, object]] = {
    # Llama 3.2 1B's Q4_K_M: Q4_K layers, Q6_K attn_v, ffn_down and (tied) embeddings; K-quants
    # need rows of 256
    "llama3": dict(
        architecture="llama",
        rope_freqs=True,
        rope_base=500000.0,
        **K_DIMS,
        weight_type="Q4_K",
        tensor_types={"token_embd.weight": "Q6_K", "attn_v": "Q6_K", "ffn_down": "Q6_K"},
    ),
    # Qwen2.5 0.5B's Q4_K_M: its rows of 896 cannot be K-quants, so Q4_K falls back to Q5_0 and
    # Q6_K to Q8_0 (here rows of 64 and 128 do the same)
    "qwen2": dict(
        architecture="qwen2",
        rope_base=1000000.0,
        weight_type="Q5_0",
        tensor_types={"token_embd.weight": "Q8_0", "attn_v": "Q8_0", "ffn_down": "Q8_0"},
    ),
    # Qwen3 0.6B's Q4_K_M (rows of 1024, q 2048 wide: q_dim != dim as here)
    "qwen3": dict(
        architecture="qwen3",
        head_dim=128,
        **K_DIMS,
        rope_base=1000000.0,
        weight_type="Q4_K",
        tensor_types={"token_embd.weight": "Q6_K", "attn_v": "Q6_K", "ffn_down": "Q6_K"},
    ),
    # gemma3 as llama-quantize's Q4_K_M writes Gemma 3 270M: rows of dim (64 here, 640 there)
    # cannot be K-quants and fall back to Q5_0 / Q8_0; attn_output (n_in 256) and ffn_down
    # (n_in 256) are K-quants
    "gemma3": dict(
        architecture="gemma3",
        n_layers=6,
        n_heads=4,
        n_kv_heads=1,
        head_dim=64,
        ffn_dim=256,
        sliding_window=16,
        rope_base=1000000.0,
        weight_type="Q5_0",
        tensor_types={
            "token_embd.weight": "Q8_0",
            "attn_v": "Q8_0",
            "attn_output": "Q4_K",
            "ffn_down": "Q6_K",
        },
    ),
    # LFM2-350M's layer pattern in miniature (convolutions before and after an attention layer;
    # 3 layers keep the block types' error within the others' tolerance); llama-quantize's
    # Q4_K_M of it is Q4_K with Q6_K attn_v / ffn_down / embeddings, which rows of 64 and 128
    # turn into Q5_0 and Q8_0 (the conv kernels stay F32)
    "lfm2": dict(
        architecture="lfm2",
        n_layers=3,
        conv_layers=(0, 2),
        rope_base=1000000.0,
        weight_type="Q5_0",
        tensor_types={"token_embd.weight": "Q8_0", "attn_v": "Q8_0", "ffn_down": "Q8_0"},
    ),
    # Qwen3-30B-A3B's shape in miniature (4 experts, 2 per token, q_dim != dim) with its Q4_K_M
    # mix: Q4_K, Q6_K attn_v, ffn_down_exps and embeddings, the router F32 (llama-quantize leaves
    # ffn_gate_inp unquantized)
    "qwen3moe": dict(
        architecture="qwen3moe",
        head_dim=128,
        **K_DIMS,
        expert_ffn=256,
        rope_base=1000000.0,
        weight_type="Q4_K",
        tensor_types={"token_embd.weight": "Q6_K", "attn_v": "Q6_K", "ffn_down_exps": "Q6_K"},
    ),
    # Qwen1.5-MoE's shape in miniature: qwen2's biases, 4 experts (2 per token) of 128 and a
    # shared expert of 256 behind its sigmoid gate; rows of 64 and 128 give Q5_0 / Q8_0
    "qwen2moe": dict(
        architecture="qwen2moe",
        ffn_dim=256,
        expert_ffn=128,
        rope_base=1000000.0,
        weight_type="Q5_0",
        tensor_types={
            "token_embd.weight": "Q8_0",
            "attn_v": "Q8_0",
            "ffn_down_exps": "Q8_0",
            "ffn_down_shexp": "Q8_0",
        },
    ),
    # OLMoE-1B-7B's shape in miniature: full multi-head attention, its q/k norms over the whole
    # projection, 4 experts (2 per token) of feed_forward_length, an untied output (llama.cpp
    # requires output.weight), Q4_K_M's mix as for qwen3moe. Seed 2: seeds 0 and 1 put a router
    # near-tie (0.018, 0.028 between the 2nd and 3rd expert) on a row of the reference test,
    # which the mix's 8-bit activations flip (its all-F32 variant routes every row as the reference)
    "olmoe": dict(
        architecture="olmoe",
        seed=2,
        dim=256,
        n_heads=4,
        n_kv_heads=4,
        ffn_dim=256,
        expert_ffn=256,
        tied=False,
        weight_type="Q4_K",
        tensor_types={"token_embd.weight": "Q6_K", "attn_v": "Q6_K", "ffn_down_exps": "Q6_K"},
    ),
}
ARCHS = tuple(ARCH_MODELS)


def write_tiny_model(path: str | Path, arch: str, **kwargs: object) -> Path:
    """The tiny fixture of `arch` (a key of ARCH_MODELS); kwargs override its arguments."""
    return write_tiny_llama(path, **{**ARCH_MODELS[arch], **kwargs})  # type: ignore[arg-type]


def write_wrong_arch(path: str | Path) -> Path:
    """A tiny model whose general.architecture is "gpt2" (unsupported)."""
    return write_tiny_llama(path, architecture="gpt2")


def write_unsupported_type(
    path: str | Path, tensor: str = "blk.1.ffn_down.weight", type_name: str = "MXFP4"
) -> Path:
    """A tiny Q8_0 model with one weight stored as `type_name` (not implemented by the engine)."""
    return write_tiny_llama(path, tensor_types={tensor: type_name})


def _add(w: GGUFWriter, name: str, values: np.ndarray, type_name: str) -> None:
    qtype = GGMLQuantizationType[type_name]
    if qtype == GGMLQuantizationType.F32:
        w.add_tensor(name, values.astype(np.float32))
    elif qtype == GGMLQuantizationType.F16:
        w.add_tensor(name, values.astype(np.float16))
    elif qtype == GGMLQuantizationType.BF16:
        w.add_tensor(name, quantize(values, qtype).view(np.uint8), raw_dtype=qtype)
    else:
        w.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)


def random_blocks(
    type_name: str, rows: int, cols: int, rng: np.random.Generator, std: float = 1.0
) -> np.ndarray:
    """uint8 [rows, row bytes]: random valid blocks of a block type (any quant and scale bytes,
    finite f16 scales) whose dequantized values have about the given standard deviation."""
    qtype = GGMLQuantizationType[type_name]
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    if cols % block:
        raise ValueError(f"{type_name} rows need a multiple of {block} elements, got {cols}")
    n_blocks = rows * cols // block
    raw = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    d_at, m_at, m_ratio = _F16_FIELDS[type_name]

    def set_scales(d: np.ndarray) -> None:
        raw[:, d_at : d_at + 2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        if m_at is not None:
            m = (d * m_ratio).astype(np.float16)
            raw[:, m_at : m_at + 2] = m.view(np.uint8).reshape(n_blocks, 2)

    d = rng.uniform(0.5, 1.5, n_blocks).astype(np.float32)
    set_scales(d)
    spread = float(dequantize(raw, qtype).std())
    set_scales(d * np.float32(std / spread))
    return raw.reshape(rows, -1)


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

    def type_of(name: str) -> str:
        kind = name.removesuffix(".weight").split(".")[-1]
        return overrides.get(name, overrides.get(kind, weight_type))

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

    def add_weight(name: str, rows: int, cols: int, scale: float) -> None:
        add_random_weight(w, rng, name, type_of(name), rows, cols, scale)

    def add_vec(name: str, values: np.ndarray) -> None:
        w.add_tensor(name, values.astype(np.float32))

    def add_norm(name: str, n: int = dim) -> None:
        add_vec(name, 1.0 + 0.1 * rng.standard_normal(n))

    add_weight("token_embd.weight", n_vocab, dim, 0.25)
    for i in range(n_layers):
        p = f"blk.{i}."
        add_norm(p + "attn_norm.weight")
        if (i + 1) % interval != 0:
            add_weight(p + "attn_qkv.weight", conv_dim, dim, dim**-0.5)
            add_weight(p + "attn_gate.weight", value_dim, dim, dim**-0.5)
            add_vec(p + "ssm_conv1d.weight", 0.5 * rng.standard_normal((conv_dim, ssm_conv)))
            add_vec(p + "ssm_dt.bias", 0.5 * rng.standard_normal(ssm_v_heads))
            add_vec(p + "ssm_a", -np.exp(rng.uniform(-2.0, 0.0, ssm_v_heads)))
            add_weight(p + "ssm_beta.weight", ssm_v_heads, dim, dim**-0.5)
            add_weight(p + "ssm_alpha.weight", ssm_v_heads, dim, dim**-0.5)
            add_norm(p + "ssm_norm.weight", ssm_d_state)
            add_weight(p + "ssm_out.weight", dim, value_dim, 4.0 * value_dim**-0.5)
        else:
            add_weight(p + "attn_q.weight", 2 * q_dim, dim, dim**-0.5)
            add_weight(p + "attn_k.weight", kv_dim, dim, dim**-0.5)
            add_weight(p + "attn_v.weight", kv_dim, dim, dim**-0.5)
            add_norm(p + "attn_q_norm.weight", head_dim)
            add_norm(p + "attn_k_norm.weight", head_dim)
            add_weight(p + "attn_output.weight", dim, q_dim, 4.0 * q_dim**-0.5)
        add_norm(p + "post_attention_norm.weight")
        add_weight(p + "ffn_gate.weight", ffn_dim, dim, dim**-0.5)
        add_weight(p + "ffn_up.weight", ffn_dim, dim, dim**-0.5)
        add_weight(p + "ffn_down.weight", dim, ffn_dim, 4.0 * ffn_dim**-0.5)
    add_norm("output_norm.weight")
    if not tied:
        add_weight("output.weight", n_vocab, dim, 0.25)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
