"""Synthetic GGUF models at real sizes: a real architecture's dimensions, random weights, and the
tensor type mix llama-quantize gives it at Q4_K_M (`slotserve bench engine --synthetic NAME`).

Speed at 0.5B-8B parameters is set by memory bandwidth and by the K-quant kernels, which the tiny
test fixtures never stress; real files of those sizes are not on every machine. The weights are
random valid blocks (random quant and scale bytes; f16 super-block scales chosen so each matmul's
output stays O(1): std 1/sqrt(n_in) for projections into a block, 4/sqrt(n_in) for the two back
into the residual stream, 0.25 for the embeddings), so logits are finite but the text is noise.
The file is a regular GGUF that llama.cpp reads too (`llama_bench_command`).

Q4_K_M rule (llama.cpp's llama_tensor_get_type for LLAMA_FTYPE_MOSTLY_Q4_K_M), `q4_k_m_type`:

    output.weight (or token_embd.weight when the output is tied)   Q6_K
    blk.i.attn_v, blk.i.ffn_down where use_more_bits(i, n_layers)  Q6_K
    every other 2-D weight (token_embd when untied included)      Q4_K
    norms, biases, rope_freqs                                      F32
    use_more_bits(i, n) = i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2   (integer n/8, 7n/8)

then the fallback where a row (n_in) is not a multiple of 256: Q4_K -> Q5_0, Q6_K -> Q8_0 (all of
qwen2-0.5b's rows of 896; its ffn_down rows of 4864 stay K-quants).

lfm2 (LFM2-350M's shape): the layers in `conv_layers` are short convolutions (shortconv.in_proj
dim -> 3 dim and out_proj Q4_K like any 2-D weight, the [dim][conv_len] kernel F32, as
llama-quantize leaves it), head_count_kv is written per layer (0 there), the attention layers
add F32 q/k norms and the final norm is token_embd_norm; attn_v's extra bit counts attention
layers only (llama.cpp counts attn_v tensors).

qwen35 (Qwen3.5-0.8B's shape): layer i is Gated DeltaNet unless (i + 1) % attn_interval == 0.
Its attn_qkv is Q5_K (llama-quantize's Q4_K_M rule for attn_qkv), attn_gate, ssm_alpha,
ssm_beta and ssm_out Q4_K, ssm_conv1d F32 (never quantized), ssm_a (-exp(A_log): -0.5 +- 0.1),
ssm_dt.bias and ssm_norm F32; the attention layers' attn_q is twice q_dim (queries and gates),
with F32 q/k norms; the FFN's norm is post_attention_norm. attn_v's extra bit counts the
attention layers only, as for lfm2.

granitehybrid (granite-4.0-h-350m's shape): every layer not in attn_layers is Mamba2
(head_count_kv written per layer, 0 there): ssm_in and ssm_out Q4_K like any 2-D weight,
ssm_conv1d and its bias F32, ssm_dt.bias, ssm_a (-exp(A_log): -1 +- 0.2), ssm_d and ssm_norm F32
(ssm_norm [groups][inner / groups], kept 2-D as the converter writes it); the attention layers are
llama's (no norms, no biases); the granite scales (embedding_scale, residual_scale,
attention.scale, logit_scale) as the real file's, rope.scaling.finetuned false (no RoPE).
attn_v's extra bit counts the attention layers only, as for lfm2.

qwen3moe (Qwen3-30B-A3B's shape, and a tiny one for CI-sized runs): every layer's FFN is
n_expert experts of expert_ffn, stored as 3-D ffn_{gate,up,down}_exps (one slice per expert),
the router ffn_gate_inp F32 (llama-quantize never quantizes it); ffn_down_exps takes
ffn_down's rule (Q6_K where use_more_bits), gate and up Q4_K; q/k norms F32.

Tokenizer: gpt2 byte-level BPE with the 256 byte tokens, three ChatML control tokens and a few
merges, padded to the preset's n_vocab with UNUSED tokens (the loader needs one token per
token_embd row).
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import dequantize

QK_K = 256  # K-quant super-block: a K-quant row is a multiple of this
FILE_TYPE_Q4_K_M = 15  # general.file_type (llama_ftype LLAMA_FTYPE_MOSTLY_Q4_K_M)
CHUNK_BYTES = 32 << 20  # random block bytes generated and written at a time


@dataclass(frozen=True)
class Preset:
    """A real model's shape (its GGUF metadata), without its weights."""

    arch: str  # general.architecture: llama or qwen2
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    n_vocab: int
    rope_base: float
    tied: bool  # no output.weight: logits use token_embd
    rope_freqs: bool = False  # llama 3.1's rope_freqs.weight [head_dim/2]
    ctx_train: int = 32768
    rms_eps: float = 1e-6
    pre: str = "qwen2"  # tokenizer.ggml.pre
    conv_layers: tuple[int, ...] = ()  # lfm2: the short-convolution layers
    conv_len: int = 0  # lfm2: shortconv.l_cache
    deltanet: tuple[int, ...] = ()  # qwen35: (conv taps, head width, key heads, value heads)
    attn_interval: int = 0  # qwen35: full_attention_interval
    rope_dim: int = 0  # qwen35: rope.dimension_count (0: head_dim)
    moe: tuple[int, ...] = ()  # qwen3moe: (experts, used per token, expert ffn)
    mamba: tuple[int, ...] = ()  # granitehybrid: (conv taps, state, groups, heads, inner)
    attn_layers: tuple[int, ...] = ()  # granitehybrid: the attention layers (the rest Mamba2)
    scales: tuple[float, ...] = ()  # granitehybrid: embedding, residual, attention, logit scale

    def is_deltanet(self, i: int) -> bool:
        return bool(self.deltanet) and (i + 1) % self.attn_interval != 0

    def is_mamba(self, i: int) -> bool:
        return bool(self.mamba) and i not in self.attn_layers

    def attention_layers(self) -> list[int]:
        return [
            i
            for i in range(self.n_layers)
            if i not in self.conv_layers and not self.is_deltanet(i) and not self.is_mamba(i)
        ]


PRESETS: dict[str, Preset] = {
    # Qwen2.5 0.5B: rows of 896 are not K-quants (Q5_0/Q8_0 fallbacks); the fast one for tests
    "qwen2-0.5b": Preset("qwen2", 24, 896, 14, 2, 64, 4864, 151936, 1e6, tied=True),
    # Qwen2.5 1.5B
    "qwen2-1.5b": Preset("qwen2", 28, 1536, 12, 2, 128, 8960, 151936, 1e6, tied=True),
    # Llama 3.1 8B: untied output, llama3 RoPE frequency factors
    "llama3-8b": Preset(
        "llama",
        32,
        4096,
        32,
        8,
        128,
        14336,
        128256,
        500000.0,
        tied=False,
        rope_freqs=True,
        ctx_train=131072,
        rms_eps=1e-5,
        pre="llama-bpe",
    ),
    # LFM2-350M (LiquidAI): 16 layers, 10 short convolutions of 3 taps and 6 GQA layers
    # (2, 5, 8, 10, 12, 14), ffn 4608 (block_ff_dim 6656 auto-adjusted), tied embeddings
    "lfm2-350m": Preset(
        "lfm2",
        16,
        1024,
        16,
        8,
        64,
        4608,
        65536,
        1e6,
        tied=True,
        ctx_train=128000,
        rms_eps=1e-5,
        conv_layers=(0, 1, 3, 4, 6, 7, 9, 11, 13, 15),
        conv_len=3,
    ),
    # Qwen3.5-0.8B: 24 layers, 18 Gated DeltaNet (16 heads of 128, conv 4) and 6 gated attention
    # (8 heads, 2 kv heads of 256, rope on 64 dims), ffn 3584, tied embeddings of 248,320 tokens
    "qwen3.5-0.8b": Preset(
        "qwen35",
        24,
        1024,
        8,
        2,
        256,
        3584,
        248320,
        1e7,
        tied=True,
        ctx_train=262144,
        deltanet=(4, 128, 16, 16),
        attn_interval=4,
        rope_dim=64,
    ),
    # Qwen3-30B-A3B: 48 layers, 32 heads / 4 kv heads of 128, 128 experts of 768 (8 per token),
    # untied output of 151,936 tokens: about 30.5B parameters, 3.3B of them read per token
    "qwen3-30b-a3b": Preset(
        "qwen3moe",
        48,
        2048,
        32,
        4,
        128,
        6144,
        151936,
        1e6,
        tied=False,
        ctx_train=40960,
        moe=(128, 8, 768),
    ),
    # IBM granite-4.0-h-350m: 32 layers, 28 Mamba2 (48 heads of 32 channels, a state of 128, one
    # group, conv 4) and 4 attention (10, 13, 17, 27: 12 heads, 4 kv heads of 64, no RoPE), ffn
    # 2048, tied embeddings of 100,352 tokens, the granite scales of its file
    "granite-4.0-h-350m": Preset(
        "granitehybrid",
        32,
        768,
        12,
        4,
        64,
        2048,
        100352,
        10000.0,
        tied=True,
        rms_eps=1e-5,
        mamba=(4, 128, 1, 48, 1536),
        attn_layers=(10, 13, 17, 27),
        scales=(12.0, 0.246, 0.015625, 3.0),
    ),
    # the same architecture at CI size: 4 layers, 8 experts of 256 (2 per token)
    "qwen3-moe-tiny": Preset("qwen3moe", 4, 256, 4, 2, 128, 512, 1024, 1e6, tied=False, moe=(8, 2, 256)),
}

# Byte offset of the f16 scale d in a block, of the f16 min (None: the type has none), and the
# min as a multiple of d that centres the values on 0 (q means: Q4_K 7.5 x sub-scale).
_F16_FIELDS: dict[str, tuple[int, int | None, float]] = {
    "Q4_K": (0, 2, 7.5),
    "Q5_K": (0, 2, 15.5),
    "Q6_K": (208, None, 0.0),
    "Q5_0": (0, None, 0.0),
    "Q8_0": (0, None, 0.0),
}

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("Ġ t", "h e", "i n", "e r", "a n", "Ġ a", "o n", "r e")


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers that get one more bit (first and last eighth, every third between)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(
    name: str, n_in: int, n_layers: int, tied: bool, layer_index: tuple[int, int] | None = None
) -> str:
    """The type llama-quantize's Q4_K_M gives 2-D weight `name` with rows of n_in (module doc).
    layer_index: (index, count) of the tensor among its kind's tensors when that is not the layer
    (lfm2's attn_v: only the attention layers have one)."""
    kind = name.removesuffix(".weight").split(".")[-1]
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        wanted = "Q6_K"
    elif kind == "attn_qkv":
        wanted = "Q5_K"
    elif kind in ("attn_v", "ffn_down", "ffn_down_exps") and use_more_bits(
        *(layer_index if layer_index is not None else (int(name.split(".")[1]), n_layers))
    ):
        wanted = "Q6_K"
    else:
        wanted = "Q4_K"
    if n_in % QK_K:
        return {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[wanted]
    return wanted


@dataclass(frozen=True)
class TensorPlan:
    name: str
    type_name: str  # a key of _F16_FIELDS, or F32
    rows: int  # n_out (1 for vectors)
    cols: int  # n_in: the row length
    std: float  # dequantized values' standard deviation (F32: the value spread around `mean`)
    mean: float = 0.0
    experts: int = 0  # a 3-D expert tensor: rows is experts x the rows of one expert
    two_d: bool = False  # an F32 tensor written [rows][cols] even when rows is 1

    @property
    def nbytes(self) -> int:
        if self.type_name == "F32":
            return 4 * self.rows * self.cols
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[self.type_name]]
        return self.rows * self.cols // block * block_bytes


def tensor_plan(p: Preset) -> list[TensorPlan]:
    """Every tensor of the model, in file order, with its type and value spread."""
    q_dim, kv_dim = p.n_heads * p.head_dim, p.n_kv_heads * p.head_dim

    attention = p.attention_layers()

    def weight(name: str, rows: int, cols: int, std: float) -> TensorPlan:
        index = None
        if name.endswith("attn_v.weight") and len(attention) < p.n_layers:
            index = (attention.index(int(name.split(".")[1])), len(attention))
        return TensorPlan(name, q4_k_m_type(name, cols, p.n_layers, p.tied, index), rows, cols, std)

    def vector(name: str, n: int, mean: float, std: float) -> TensorPlan:
        return TensorPlan(name, "F32", 1, n, std, mean)

    plan = [weight("token_embd.weight", p.n_vocab, p.dim, 0.25)]
    if p.rope_freqs:
        plan.append(vector("rope_freqs.weight", p.head_dim // 2, 0.0, 0.0))  # values: _f32_values
    for i in range(p.n_layers):
        b = f"blk.{i}."
        plan.append(vector(b + "attn_norm.weight", p.dim, 1.0, 0.1))
        if i in p.conv_layers:
            plan.append(weight(b + "shortconv.in_proj.weight", 3 * p.dim, p.dim, p.dim**-0.5))
            plan.append(TensorPlan(b + "shortconv.conv.weight", "F32", p.dim, p.conv_len, 0.5))
            plan.append(weight(b + "shortconv.out_proj.weight", p.dim, p.dim, 4.0 * p.dim**-0.5))
            plan.extend(_ffn_plan(p, b, weight, vector))
            continue
        if p.is_deltanet(i):
            plan.extend(_deltanet_plan(p, b, weight, vector))
            plan.extend(_ffn_plan(p, b, weight, vector))
            continue
        if p.is_mamba(i):
            plan.extend(_mamba_plan(p, b, weight, vector))
            plan.extend(_ffn_plan(p, b, weight, vector))
            continue
        plan.append(weight(b + "attn_q.weight", 2 * q_dim if p.deltanet else q_dim, p.dim, p.dim**-0.5))
        plan.append(weight(b + "attn_k.weight", kv_dim, p.dim, p.dim**-0.5))
        plan.append(weight(b + "attn_v.weight", kv_dim, p.dim, p.dim**-0.5))
        if p.arch == "qwen2":
            plan.append(vector(b + "attn_q.bias", q_dim, 0.0, 0.5))
            plan.append(vector(b + "attn_k.bias", kv_dim, 0.0, 0.5))
            plan.append(vector(b + "attn_v.bias", kv_dim, 0.0, 0.5))
        if p.arch in ("lfm2", "qwen35", "qwen3moe"):
            plan.append(vector(b + "attn_q_norm.weight", p.head_dim, 1.0, 0.1))
            plan.append(vector(b + "attn_k_norm.weight", p.head_dim, 1.0, 0.1))
        plan.append(weight(b + "attn_output.weight", p.dim, q_dim, 4.0 * q_dim**-0.5))
        plan.extend(_ffn_plan(p, b, weight, vector))
    plan.append(
        vector("token_embd_norm.weight" if p.arch == "lfm2" else "output_norm.weight", p.dim, 1.0, 0.1)
    )
    if not p.tied:
        plan.append(weight("output.weight", p.n_vocab, p.dim, 0.25))
    return plan


def _deltanet_plan(
    p: Preset,
    b: str,
    weight: Callable[[str, int, int, float], TensorPlan],
    vector: Callable[[str, int, float, float], TensorPlan],
) -> list[TensorPlan]:
    taps, d, k_heads, v_heads = p.deltanet
    conv_dim, value_dim = 2 * k_heads * d + v_heads * d, v_heads * d
    return [
        weight(b + "attn_qkv.weight", conv_dim, p.dim, p.dim**-0.5),
        weight(b + "attn_gate.weight", value_dim, p.dim, p.dim**-0.5),
        TensorPlan(b + "ssm_conv1d.weight", "F32", conv_dim, taps, 0.5),
        vector(b + "ssm_dt.bias", v_heads, 0.0, 0.5),
        vector(b + "ssm_a", v_heads, -0.5, 0.1),
        weight(b + "ssm_beta.weight", v_heads, p.dim, p.dim**-0.5),
        weight(b + "ssm_alpha.weight", v_heads, p.dim, p.dim**-0.5),
        vector(b + "ssm_norm.weight", d, 1.0, 0.1),
        weight(b + "ssm_out.weight", p.dim, value_dim, 4.0 * value_dim**-0.5),
    ]


def _mamba_plan(
    p: Preset,
    b: str,
    weight: Callable[[str, int, int, float], TensorPlan],
    vector: Callable[[str, int, float, float], TensorPlan],
) -> list[TensorPlan]:
    taps, state, groups, heads, inner = p.mamba
    conv_dim = inner + 2 * groups * state
    return [
        weight(b + "ssm_in.weight", inner + conv_dim + heads, p.dim, p.dim**-0.5),
        TensorPlan(b + "ssm_conv1d.weight", "F32", conv_dim, taps, 0.5),
        vector(b + "ssm_conv1d.bias", conv_dim, 0.0, 0.1),
        vector(b + "ssm_dt.bias", heads, 0.0, 0.5),
        TensorPlan(b + "ssm_a", "F32", heads, 1, 0.2, -1.0),
        TensorPlan(b + "ssm_d", "F32", heads, 1, 0.1, 1.0),
        TensorPlan(b + "ssm_norm.weight", "F32", groups, inner // groups, 0.1, 1.0, two_d=True),
        weight(b + "ssm_out.weight", p.dim, inner, 4.0 * inner**-0.5),
    ]


def _ffn_plan(
    p: Preset,
    b: str,
    weight: Callable[[str, int, int, float], TensorPlan],
    vector: Callable[[str, int, float, float], TensorPlan],
) -> list[TensorPlan]:
    norm = vector(b + ("post_attention_norm" if p.deltanet else "ffn_norm") + ".weight", p.dim, 1.0, 0.1)
    if p.moe:
        n, _, f = p.moe

        def experts(name: str, rows: int, cols: int, std: float) -> TensorPlan:
            return replace(weight(b + name, n * rows, cols, std), experts=n)

        return [
            norm,
            TensorPlan(b + "ffn_gate_inp.weight", "F32", n, p.dim, p.dim**-0.5),
            experts("ffn_gate_exps.weight", f, p.dim, p.dim**-0.5),
            experts("ffn_up_exps.weight", f, p.dim, p.dim**-0.5),
            experts("ffn_down_exps.weight", p.dim, f, 4.0 * f**-0.5),
        ]
    return [
        norm,
        weight(b + "ffn_gate.weight", p.ffn_dim, p.dim, p.dim**-0.5),
        weight(b + "ffn_up.weight", p.ffn_dim, p.dim, p.dim**-0.5),
        weight(b + "ffn_down.weight", p.dim, p.ffn_dim, 4.0 * p.ffn_dim**-0.5),
    ]


@functools.cache
def _spread(type_name: str) -> float:
    """Standard deviation of the dequantized values of random blocks with d ~ U(0.5, 1.5)."""
    rng = np.random.default_rng(12345)
    return float(dequantize(_raw_blocks(type_name, 2048, rng, 1.0), GGMLQuantizationType[type_name]).std())


def _raw_blocks(type_name: str, n_blocks: int, rng: np.random.Generator, d_scale: float) -> np.ndarray:
    """uint8 [n_blocks, block bytes]: random quant/scale bytes, f16 d = U(0.5, 1.5) * d_scale."""
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][1]
    raw = np.frombuffer(rng.bytes(n_blocks * block_bytes), np.uint8).reshape(n_blocks, block_bytes).copy()
    d_at, m_at, m_ratio = _F16_FIELDS[type_name]
    d = rng.uniform(0.5, 1.5, n_blocks).astype(np.float32) * np.float32(d_scale)
    raw[:, d_at : d_at + 2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    if m_at is not None:
        raw[:, m_at : m_at + 2] = (d * m_ratio).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw


def _chunks(t: TensorPlan, rng: np.random.Generator, head_dim: int) -> Iterator[np.ndarray]:
    """The tensor's bytes, CHUNK_BYTES or so at a time."""
    if t.type_name == "F32":
        if t.name == "rope_freqs.weight":  # llama 3.1's factors: 1 for high frequencies up to 8
            yield np.geomspace(1.0, 8.0, head_dim // 2).astype(np.float32)
        else:
            yield (t.mean + t.std * rng.standard_normal(t.rows * t.cols)).astype(np.float32)
        return
    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[t.type_name]]
    d_scale = t.std / _spread(t.type_name)
    n_blocks = t.rows * t.cols // block
    per_chunk = max(1, CHUNK_BYTES // block_bytes)
    for start in range(0, n_blocks, per_chunk):
        yield _raw_blocks(t.type_name, min(per_chunk, n_blocks - start), rng, d_scale)


def vocab(n_vocab: int) -> tuple[list[str], list[int]]:
    """(tokens, token types): controls, the 256 byte tokens, one token per merge, UNUSED padding."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    byte_chars = {b: chr(b) for b in keep}
    for extra, b in enumerate(b for b in range(256) if b not in byte_chars):
        byte_chars[b] = chr(256 + extra)
    tokens = [*SPECIAL_TOKENS, *(byte_chars[b] for b in range(256)), *(m.replace(" ", "") for m in MERGES)]
    types = [int(TokenType.CONTROL)] * len(SPECIAL_TOKENS) + [int(TokenType.NORMAL)] * (len(tokens) - 3)
    if n_vocab < len(tokens):
        raise ValueError(f"n_vocab {n_vocab} < {len(tokens)} tokens")
    tokens += [f"[UNUSED_{i}]" for i in range(len(tokens), n_vocab)]
    types += [int(TokenType.UNUSED)] * (n_vocab - len(types))
    return tokens, types


def write_synthetic(path: str | Path, preset: Preset, *, seed: int = 0) -> Path:
    """Write `preset` with random Q4_K_M weights to `path` (via a .partial file renamed at the
    end, so an interrupted write never leaves a truncated model under the final name)."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    plan = tensor_plan(preset)
    tokens, types = vocab(preset.n_vocab)
    w = GGUFWriter(None, preset.arch)
    w.add_name(f"synthetic {preset.arch} {preset.n_layers}x{preset.dim}")
    w.add_file_type(FILE_TYPE_Q4_K_M)
    w.add_quantization_version(2)
    w.add_block_count(preset.n_layers)
    w.add_context_length(preset.ctx_train)
    w.add_embedding_length(preset.dim)
    w.add_feed_forward_length(preset.ffn_dim)
    w.add_head_count(preset.n_heads)
    if preset.conv_layers:  # lfm2: per layer, 0 on the short convolutions
        counts = [0 if i in preset.conv_layers else preset.n_kv_heads for i in range(preset.n_layers)]
        w.add_array(f"{preset.arch}.attention.head_count_kv", counts)
        w.add_uint32(f"{preset.arch}.shortconv.l_cache", preset.conv_len)
    elif preset.mamba:  # granitehybrid: per layer, 0 on the Mamba2 ones
        counts = [0 if preset.is_mamba(i) else preset.n_kv_heads for i in range(preset.n_layers)]
        w.add_array(f"{preset.arch}.attention.head_count_kv", counts)
        _add_mamba_keys(w, preset)
    else:
        w.add_head_count_kv(preset.n_kv_heads)
    w.add_rope_dimension_count(preset.rope_dim or preset.head_dim)
    if preset.deltanet:
        taps, d, k_heads, v_heads = preset.deltanet
        arch = preset.arch
        pairs = (preset.rope_dim or preset.head_dim) // 2
        third = (pairs + 2) // 3
        w.add_array(f"{arch}.rope.dimension_sections", [third, third, pairs - 2 * third, 0])
        w.add_uint32(f"{arch}.ssm.conv_kernel", taps)
        w.add_uint32(f"{arch}.ssm.state_size", d)
        w.add_uint32(f"{arch}.ssm.group_count", k_heads)
        w.add_uint32(f"{arch}.ssm.time_step_rank", v_heads)
        w.add_uint32(f"{arch}.ssm.inner_size", v_heads * d)
        w.add_uint32(f"{arch}.full_attention_interval", preset.attn_interval)
    if preset.moe:
        w.add_expert_count(preset.moe[0])
        w.add_expert_used_count(preset.moe[1])
        w.add_expert_feed_forward_length(preset.moe[2])
    w.add_rope_freq_base(preset.rope_base)
    w.add_layer_norm_rms_eps(preset.rms_eps)
    if preset.head_dim != preset.dim // preset.n_heads:
        w.add_key_length(preset.head_dim)
        w.add_value_length(preset.head_dim)
    w.add_vocab_size(preset.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(preset.pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(MERGES))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(preset.pre == "llama-bpe")
    for t in plan:
        if t.type_name == "F32":
            shape = (t.rows, t.cols) if t.rows > 1 or t.two_d else (t.cols,)  # numpy order: ggml (cols, rows)
            w.add_tensor_info(t.name, shape, np.dtype(np.float32), t.nbytes)
        elif t.experts:
            qtype, per = GGMLQuantizationType[t.type_name], t.rows // t.experts
            experts = (t.experts, per, t.nbytes // t.rows)
            w.add_tensor_info(t.name, experts, np.dtype(np.uint8), t.nbytes, qtype)
        else:
            qtype = GGMLQuantizationType[t.type_name]
            w.add_tensor_info(t.name, (t.rows, t.nbytes // t.rows), np.dtype(np.uint8), t.nbytes, qtype)
    partial = path.with_name(path.name + ".partial")
    try:
        w.write_header_to_file(partial)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None and len(w.fout) == 1
        out = w.fout[0]
        for t in plan:  # the writer's own layout: each tensor aligned, then padded
            w.write_padding(out, out.tell())
            for chunk in _chunks(t, rng, preset.head_dim):
                chunk.tofile(out)
            w.write_padding(out, t.nbytes)
        w.close()
        os.replace(partial, path)
    except BaseException:
        w.close()
        partial.unlink(missing_ok=True)
        raise
    return path


def _add_mamba_keys(w: GGUFWriter, preset: Preset) -> None:
    """granitehybrid's ssm.* keys, its scales, and no RoPE (module doc)."""
    arch = preset.arch
    taps, state, groups, heads, inner = preset.mamba
    w.add_uint32(f"{arch}.ssm.conv_kernel", taps)
    w.add_uint32(f"{arch}.ssm.state_size", state)
    w.add_uint32(f"{arch}.ssm.group_count", groups)
    w.add_uint32(f"{arch}.ssm.time_step_rank", heads)
    w.add_uint32(f"{arch}.ssm.inner_size", inner)
    for key, value in zip(
        ("embedding_scale", "residual_scale", "attention.scale", "logit_scale"), preset.scales
    ):
        w.add_float32(f"{arch}.{key}", value)
    w.add_bool(f"{arch}.rope.scaling.finetuned", False)


def default_dir() -> Path:
    return Path(tempfile.gettempdir()) / "slotserve-synthetic"


def ensure_synthetic(name: str, directory: str | Path | None = None) -> tuple[Path, bool]:
    """(path of preset `name`'s file in `directory`, True if written now); an existing file is
    reused (same preset and seed: the same bytes)."""
    if name not in PRESETS:
        raise SystemExit(f"--synthetic {name!r}: unknown preset; known: {', '.join(PRESETS)}")
    directory = Path(directory) if directory is not None else default_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"synthetic-{name}-Q4_K_M.gguf"
    if path.is_file():
        return path, False
    return write_synthetic(path, PRESETS[name]), True


@dataclass(frozen=True)
class BenchSizes:
    """What `bench engine --synthetic` times: shorter than the default model's at 8B, where one
    decode token streams ~4.9 GB (a few tokens/s at ~20 GB/s)."""

    prefill: tuple[int, ...]  # ppN sizes
    decode_steps: int  # tgN
    depth: int  # tgN_dDEPTH: decode after a prompt this long


BENCH_SIZES: dict[str, BenchSizes] = {
    "qwen2-0.5b": BenchSizes((128, 512), 64, 512),
    "qwen2-1.5b": BenchSizes((64, 256), 32, 256),
    "llama3-8b": BenchSizes((64,), 16, 64),
    "lfm2-350m": BenchSizes((128, 512), 64, 512),
    "qwen3.5-0.8b": BenchSizes((128, 512), 64, 512),
    "granite-4.0-h-350m": BenchSizes((128, 512), 64, 512),
    "qwen3-30b-a3b": BenchSizes((512,), 128, 2048),  # issue 24's pp512, tg128, tg128 at depth 2048
    "qwen3-moe-tiny": BenchSizes((64, 256), 32, 256),
}


def llama_bench_command(path: Path, threads: int, sizes: BenchSizes) -> str:
    """llama.cpp's benchmark of the same file at the same sizes (pp, tg, and tg at depth)."""
    pp = ",".join(str(n) for n in sizes.prefill)
    return f"llama-bench -m {path} -t {threads} -p {pp} -n {sizes.decode_steps} -d 0,{sizes.depth}"


def shrunk(preset: Preset, **changes: object) -> Preset:
    """The preset with some fields changed (tests: fewer layers, a smaller vocabulary)."""
    return replace(preset, **changes)  # type: ignore[arg-type]
