"""The tensors of a synthetic model (`tensor_plan`): every tensor of a preset's architecture in file
order, with the type llama-quantize's Q4_K_M gives it and the spread of its values (std
1/sqrt(n_in) for projections into a block, 4/sqrt(n_in) for the two back into the residual
stream, 0.25 for the embeddings, so each matmul's output stays O(1)). synthetic.py writes them.

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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from .synthetic_presets import Preset

QK_K = 256  # K-quant super-block: a K-quant row is a multiple of this


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
    type_name: str  # a key of synthetic._F16_FIELDS, or F32
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
