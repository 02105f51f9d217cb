"""granitehybrid (IBM Granite 4.0 H, Bamba) as llama.cpp reads its keys (src/models/granite-hybrid.cpp,
mamba-base.cpp): which layers are Mamba2, their dimensions, and the granite scales.

A layer is Mamba2 where `attention.head_count_kv[i]` is 0 (an array, one entry per layer) and
attention otherwise (every attention layer with one count). The Mamba2 keys: ssm.conv_kernel
taps over the conv's inner + 2 * group_count * state_size channels (x, B, C), ssm.inner_size
channels in ssm.time_step_rank heads, ssm.state_size state per channel, ssm.group_count groups
of B and C (head h reads group h / (heads / groups)). The scales: embedding_scale multiplies the
embeddings, residual_scale every block's output before its residual add, attention.scale is the
attention score scale, logits are divided by logit_scale (0 or absent: none). The attention
layers rotate by RoPE (adjacent pairs) only when rope.scaling.finetuned is true (its default):
Granite 4.0 H files say false (no positions in attention), Bamba true.

Mixture of experts (Granite 4.0 H Tiny, Small: expert_count > 0): every layer's FFN is
expert_count experts of feed_forward_length (llama.cpp's n_ff), expert_used_count chosen per
token by a softmax over the router (ffn_gate_inp), the chosen weights renormalised to sum 1, plus
a shared expert of expert_shared_feed_forward_length (ffn_*_shexp) added without a gate; the
whole FFN output scaled by residual_scale like a dense one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import UnsupportedModelError

if TYPE_CHECKING:
    from .gguf_file import TensorRef
    from .model_config import MoeConfig

MAX_MAMBA_CONV = 16  # engine_internal.h MAX_SSM_TAPS


@dataclass(frozen=True)
class Mamba2Config:
    """A Mamba2 layer's dimensions (granitehybrid's ssm.* keys)."""

    conv: int  # taps of the causal conv over x, B, C (ssm.conv_kernel)
    d_state: int  # state per channel (ssm.state_size)
    n_group: int  # groups of B and C (ssm.group_count)
    n_heads: int  # heads (ssm.time_step_rank)
    inner: int  # channels (ssm.inner_size), n_heads heads of inner / n_heads

    @property
    def head_dim(self) -> int:
        return self.inner // self.n_heads

    @property
    def conv_dim(self) -> int:
        """Channels of the conv: x, then B and C of every group."""
        return self.inner + 2 * self.n_group * self.d_state

    @property
    def in_proj(self) -> int:
        """Rows of ssm_in: z [inner], x B C [conv_dim], dt [n_heads]."""
        return self.inner + self.conv_dim + self.n_heads

    @property
    def state_floats(self) -> int:
        """f32 values one layer keeps per slot: the conv tail and the heads' states."""
        return (self.conv - 1) * self.conv_dim + self.inner * self.d_state


@dataclass(frozen=True)
class GraniteParts:
    """What read_granite gives read_config."""

    n_kv_heads: int
    mamba: Mamba2Config
    recurrent_layers: tuple[bool, ...]
    embed_scale: float
    residual_scale: float
    attn_scale: float  # 0: 1/sqrt(head_dim)
    logit_scale: float  # 1: none
    rope: bool
    moe: MoeConfig | None


def _positive(path: Path, metadata: Mapping[str, object], key: str, default: float) -> float:
    value = metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{path}: metadata field {key!r} must be a non-negative number, got {value!r}")
    return float(value) if value else default


def _count(path: Path, metadata: Mapping[str, object], key: str) -> int:
    value = metadata.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{path}: metadata field {key!r} must be a positive integer, got {value!r}")
    return value


def read_granite(
    path: Path,
    metadata: Mapping[str, object],
    arch: str,
    n_layers: int,
    n_heads: int,
    tensors: Mapping[str, TensorRef],
) -> GraniteParts:
    """The module docstring's reading of one file; ValueError for a malformed one,
    UnsupportedModelError for what the engine does not run (MoE, biases, fused qkv)."""

    def key(name: str) -> str:
        return f"{arch}.{name}"

    raw = metadata.get(key("attention.head_count_kv"), n_heads)
    counts = raw if isinstance(raw, list) else [raw] * n_layers
    if len(counts) != n_layers or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
        raise ValueError(f"{path}: {key('attention.head_count_kv')} must be {n_layers} non-negative integers")
    attention = {int(c) for c in counts if isinstance(c, int) and c}
    if len(attention) > 1:
        raise UnsupportedModelError(
            f"{path}: attention layers with different head_count_kv {sorted(attention)}"
        )
    if not attention:
        raise UnsupportedModelError(f"{path}: {arch} without any attention layer is not supported")
    recurrent = tuple(c == 0 for c in counts)
    mamba = Mamba2Config(
        conv=_count(path, metadata, key("ssm.conv_kernel")),
        d_state=_count(path, metadata, key("ssm.state_size")),
        n_group=_count(path, metadata, key("ssm.group_count")),
        n_heads=_count(path, metadata, key("ssm.time_step_rank")),
        inner=_count(path, metadata, key("ssm.inner_size")),
    )
    if mamba.inner % mamba.n_heads or mamba.n_heads % mamba.n_group:
        raise ValueError(
            f"{path}: ssm.inner_size {mamba.inner}, time_step_rank {mamba.n_heads} and group_count "
            f"{mamba.n_group} must divide each other"
        )
    if not 2 <= mamba.conv <= MAX_MAMBA_CONV:
        raise UnsupportedModelError(f"{path}: ssm.conv_kernel {mamba.conv} is not in 2..{MAX_MAMBA_CONV}")
    extra = sorted(
        n
        for n in tensors
        if n.startswith("blk.")
        and (n.endswith(".bias") and ".ssm_" not in n or n.endswith("attn_qkv.weight"))
    )
    if extra:
        raise UnsupportedModelError(
            f"{path}: {arch} with {extra[0]} (biases or a fused qkv) is not supported"
        )
    finetuned = metadata.get(key("rope.scaling.finetuned"), True)
    moe = _read_experts(path, metadata, arch)
    return GraniteParts(
        n_kv_heads=attention.pop(),
        mamba=mamba,
        recurrent_layers=recurrent,
        embed_scale=_positive(path, metadata, key("embedding_scale"), 1.0),
        residual_scale=_positive(path, metadata, key("residual_scale"), 1.0),
        attn_scale=_positive(path, metadata, key("attention.scale"), 0.0),
        logit_scale=_positive(path, metadata, key("logit_scale"), 1.0),
        rope=bool(finetuned),
        moe=moe,
    )


def _read_experts(path: Path, metadata: Mapping[str, object], arch: str) -> MoeConfig | None:
    """The module docstring's mixture of experts, None for a dense file (expert_count 0 or absent)."""
    from .model_config import MoeConfig

    n_expert = metadata.get(f"{arch}.expert_count", 0)
    if not n_expert:
        return None
    n_expert = _count(path, metadata, f"{arch}.expert_count")
    n_used = _count(path, metadata, f"{arch}.expert_used_count")
    if n_used > n_expert:
        raise ValueError(f"{path}: {arch}.expert_used_count {n_used} > expert_count {n_expert}")
    scale = metadata.get(f"{arch}.expert_weights_scale", 0.0)
    if scale not in (0, 0.0, 1, 1.0):
        raise UnsupportedModelError(f"{path}: {arch} with expert_weights_scale {scale} is not supported")
    shared = metadata.get(f"{arch}.expert_shared_feed_forward_length", 0)
    return MoeConfig(
        n_expert=n_expert,
        n_expert_used=n_used,
        expert_ffn=_count(path, metadata, f"{arch}.feed_forward_length"),
        norm_weights=True,
        shared_ffn=_count(path, metadata, f"{arch}.expert_shared_feed_forward_length") if shared else 0,
        shared_gate=False,
    )
