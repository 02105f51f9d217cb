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

Modules: gguf_fixtures_vocab.py the tiny tokenizer, gguf_fixtures_weights.py the tensor types
and weight writers, gguf_fixtures_llama.py write_tiny_llama, gguf_fixtures_qwen35.py
write_tiny_qwen35, gguf_fixtures_granite.py write_tiny_granite; this module the architectures'
fixtures (ARCH_MODELS, write_tiny_model), the load-error variants, and the one import surface
the tests use (the names in __all__, re-exported).
"""

from __future__ import annotations

from pathlib import Path

from gguf_fixtures_llama import write_tiny_llama
from gguf_fixtures_qwen35 import QWEN35_DIMS, write_tiny_qwen35
from gguf_fixtures_vocab import (
    BOS_ID,
    BYTE_TOKEN_OFFSET,
    CHATML_TEMPLATE,
    EOS_ID,
    SPECIAL_TOKENS,
    TINY_MERGES,
    add_tiny_tokenizer,
    byte_to_unicode,
    tiny_vocab,
)
from gguf_fixtures_weights import (
    K_DIMS,
    K_TYPES,
    MORE_WEIGHT_TYPES,
    WEIGHT_MIXES,
    WEIGHT_TYPES,
    random_blocks,
)

__all__ = [
    "ARCHS",
    "ARCH_MODELS",
    "BOS_ID",
    "BYTE_TOKEN_OFFSET",
    "CHATML_TEMPLATE",
    "EOS_ID",
    "K_DIMS",
    "K_TYPES",
    "MORE_WEIGHT_TYPES",
    "QWEN35_DIMS",
    "SPECIAL_TOKENS",
    "TINY_MERGES",
    "WEIGHT_MIXES",
    "WEIGHT_TYPES",
    "add_tiny_tokenizer",
    "byte_to_unicode",
    "random_blocks",
    "tiny_vocab",
    "write_tiny_llama",
    "write_tiny_model",
    "write_tiny_qwen35",
    "write_unsupported_type",
    "write_wrong_arch",
]


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
