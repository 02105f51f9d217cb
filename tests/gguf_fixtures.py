"""Tiny llama GGUF models written by the tests themselves (gguf.GGUFWriter + gguf.quants).

Design: `write_tiny_llama` builds a complete, servable model: random weights scaled so that the
residual stream and logits stay O(1) (greedy tokens vary), every 2-D weight in one tensor type,
F32 norms, and a real gpt2-style byte-level BPE tokenizer with a ChatML chat template:

    id 0..2      <|endoftext|> <|im_start|> <|im_end|>   (CONTROL; bos = 1, eos = 2)
    id 3..258    the 256 byte tokens, byte b -> id 3 + b  (GPT-2 bytes_to_unicode alphabet)
    id 259..     one token per merge in TINY_MERGES, in order

n_vocab = 259 + len(TINY_MERGES) = 299: not a multiple of 8, so vocab loops hit SIMD tails.
Variants for load errors: `write_wrong_arch` and `write_unsupported_type`.

gguf.quants cannot quantize the K-quants (Q4_K, Q5_K, Q6_K), so weights of those types are
random valid blocks (`random_blocks`: random quant and scale bytes, f16 super-block scales set
so the dequantized values have the wanted spread); the reference dequantizes them with
gguf.quants like any other type. A mix (`WEIGHT_MIXES`) gives each kind of tensor its own type,
as llama-quantize's Q4_K_M files do; K-quant models need dim and ffn_dim multiples of 256.
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
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")

# Per kind of tensor (the name's suffix before ".weight"); "*" covers the rest.
WEIGHT_MIXES: dict[str, dict[str, str]] = {
    # llama-quantize Q4_K_M's mix (Q4_K, Q6_K for attn_v / ffn_down / embeddings), plus every
    # other block type once so one model exercises them all.
    "K_MIX": {
        "token_embd": "Q6_K",
        "attn_q": "Q4_K",
        "attn_k": "Q5_K",
        "attn_v": "Q6_K",
        "attn_output": "Q5_0",
        "ffn_gate": "Q4_K",
        "ffn_up": "Q5_1",
        "ffn_down": "Q6_K",
        "output": "Q8_0",
    },
}

# Shape arguments of write_tiny_llama for models with K-quant weights (rows of 256 and 512).
K_DIMS: dict[str, int] = {"dim": 256, "ffn_dim": 512}

# Byte offsets of the f16 scales in one block, and the f16 dmin/min as a multiple of d that
# centres the values near 0 (Q4_K: q mean 7.5, sc ~ m; Q5_K: q mean 15.5; Q5_1: d*q + m).
_F16_FIELDS = {
    "Q5_0": (0, None, 0.0),
    "Q5_1": (0, 2, -15.5),
    "Q4_K": (0, 2, 7.5),
    "Q5_K": (0, 2, 15.5),
    "Q6_K": (208, None, 0.0),
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
) -> Path:
    """Write a random tiny llama model to `path` and return the path.

    weight_type applies to every 2-D weight (token_embd and output included), or names a mix
    in WEIGHT_MIXES (a type per kind of tensor); norms stay F32. K-quant types need dim and
    ffn_dim multiples of 256 (e.g. dim=256, n_heads=4, ffn_dim=512).
    tensor_types overrides the type of single tensors by name (any gguf.quants type, for the
    unsupported-type fixture). architecture other than "llama" writes the same tensors under
    that architecture's metadata prefix (for the wrong-architecture fixture).
    """
    if weight_type not in WEIGHT_TYPES + MORE_WEIGHT_TYPES + K_TYPES and weight_type not in WEIGHT_MIXES:
        raise ValueError(
            f"weight_type must be one of {WEIGHT_TYPES + MORE_WEIGHT_TYPES + K_TYPES} or a mix "
            f"{tuple(WEIGHT_MIXES)}, got {weight_type!r}"
        )
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, token_types, merges = tiny_vocab()
    n_vocab = len(tokens)
    head_dim = dim // n_heads
    overrides = dict(tensor_types or {})
    mix = WEIGHT_MIXES.get(weight_type)

    def type_of(name: str) -> str:
        if name in overrides:
            return overrides[name]
        if mix is None:
            return weight_type
        kind = name.removesuffix(".weight").split(".")[-1]
        return mix.get(kind, mix.get("*", "Q8_0"))

    w = GGUFWriter(path, architecture)
    w.add_name(f"tiny-llama-{weight_type}")
    w.add_block_count(n_layers)
    w.add_context_length(ctx_train)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn_dim)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
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
    w.add_chat_template(CHATML_TEMPLATE)

    def add_weight(name: str, rows: int, cols: int, scale: float) -> None:
        # numpy [rows=n_out, cols=n_in] -> GGUF shape (n_in, n_out)
        values = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        type_name = type_of(name)
        if type_name in K_TYPES:
            qtype = GGMLQuantizationType[type_name]
            w.add_tensor(name, random_blocks(type_name, rows, cols, rng, std=scale), raw_dtype=qtype)
        else:
            _add(w, name, values, type_name)

    def add_norm(name: str) -> None:
        values = (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32)
        _add(w, name, values, overrides.get(name, "F32"))

    # Weights ~N(0, 1/n_in) keep each matmul's output O(1). The two projections back into the
    # residual stream are 4x larger and the embedding small (std 0.25): otherwise, with tied
    # output, the input token's own embedding dominates the logits and greedy decoding repeats
    # one token forever. With these scales logits stay within about +-10 and greedy varies.
    add_weight("token_embd.weight", n_vocab, dim, 0.25)
    for i in range(n_layers):
        add_norm(f"blk.{i}.attn_norm.weight")
        add_weight(f"blk.{i}.attn_q.weight", n_heads * head_dim, dim, dim**-0.5)
        add_weight(f"blk.{i}.attn_k.weight", n_kv_heads * head_dim, dim, dim**-0.5)
        add_weight(f"blk.{i}.attn_v.weight", n_kv_heads * head_dim, dim, dim**-0.5)
        add_weight(f"blk.{i}.attn_output.weight", dim, n_heads * head_dim, 4.0 * (n_heads * head_dim) ** -0.5)
        add_norm(f"blk.{i}.ffn_norm.weight")
        add_weight(f"blk.{i}.ffn_gate.weight", ffn_dim, dim, dim**-0.5)
        add_weight(f"blk.{i}.ffn_up.weight", ffn_dim, dim, dim**-0.5)
        add_weight(f"blk.{i}.ffn_down.weight", dim, ffn_dim, 4.0 * ffn_dim**-0.5)
    add_norm("output_norm.weight")
    if not tied:
        add_weight("output.weight", n_vocab, dim, 0.25)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_wrong_arch(path: str | Path) -> Path:
    """A tiny model whose general.architecture is "qwen2" (unsupported)."""
    return write_tiny_llama(path, architecture="qwen2")


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
