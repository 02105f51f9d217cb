"""qwen35 (Qwen3.5 dense) as llama.cpp reads its Gated DeltaNet keys (src/models/qwen35.cpp): the
layers' dimensions (`SsmConfig`) and which layers are DeltaNet (model_config.py's module NOTE on
qwen35). model_config.read_config calls `read_deltanet`; granite_config.py is granitehybrid's
counterpart."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import UnsupportedModelError
from .model_config import _meta_int


@dataclass(frozen=True)
class SsmConfig:
    """A Gated DeltaNet layer's dimensions (qwen35's ssm.* keys)."""

    conv: int  # taps of the causal conv over q, k, v (ssm.conv_kernel)
    d_state: int  # width of a key head and of a value head (ssm.state_size)
    k_heads: int  # key (and query) heads (ssm.group_count)
    v_heads: int  # value heads (ssm.time_step_rank); v head h reads k head h % k_heads

    @property
    def key_dim(self) -> int:
        return self.k_heads * self.d_state

    @property
    def value_dim(self) -> int:
        return self.v_heads * self.d_state

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def state_floats(self) -> int:
        """f32 values one layer keeps per slot: the conv tail and the per-head matrices."""
        return (self.conv - 1) * self.conv_dim + self.v_heads * self.d_state * self.d_state


MAX_SSM_CONV = 16  # engine_internal.h MAX_SSM_TAPS: longest DeltaNet conv


def read_deltanet(
    path: Path, metadata: dict[str, object], arch: str, n_layers: int, rope_dim: int, head_dim: int
) -> tuple[SsmConfig, tuple[bool, ...]]:
    """qwen35's DeltaNet dimensions and which layers are DeltaNet (module NOTE)."""

    def key(name: str) -> str:
        return f"{arch}.{name}"

    if rope_dim % 2 or rope_dim > head_dim:
        raise ValueError(f"{path}: rope.dimension_count {rope_dim} must be even and <= head_dim {head_dim}")
    sections = metadata.get(key("rope.dimension_sections"))
    if sections is not None:
        if (
            not isinstance(sections, list)
            or len(sections) < 3
            or not all(isinstance(v, int) for v in sections)
        ):
            raise ValueError(f"{path}: {key('rope.dimension_sections')} must be a list of integers")
        # llama.cpp's interleaved M-RoPE: pair i takes section i % 3 of sections t, h, w while
        # i < 3 * that section; text positions are (p, p, p, 0), so any other pair turns by 0
        total, limits = sum(sections[:4]), sections[:3]
        sectors = [i % total if total > 0 else 0 for i in range(rope_dim // 2)]
        if total <= 0 or not all(sec < 3 * limits[sec % 3] for sec in sectors):
            raise UnsupportedModelError(
                f"{path}: rope.dimension_sections {sections} leave rotary pairs at position 0; not supported"
            )
    ssm = SsmConfig(
        conv=_meta_int(path, metadata, key("ssm.conv_kernel")),
        d_state=_meta_int(path, metadata, key("ssm.state_size")),
        k_heads=_meta_int(path, metadata, key("ssm.group_count")),
        v_heads=_meta_int(path, metadata, key("ssm.time_step_rank")),
    )
    inner = _meta_int(path, metadata, key("ssm.inner_size"))
    if inner != ssm.value_dim:
        raise ValueError(
            f"{path}: ssm.inner_size {inner} != time_step_rank {ssm.v_heads} x state_size {ssm.d_state}"
        )
    if ssm.v_heads % ssm.k_heads:
        raise ValueError(
            f"{path}: ssm.time_step_rank {ssm.v_heads} is not a multiple of group_count {ssm.k_heads}"
        )
    if not 2 <= ssm.conv <= MAX_SSM_CONV:
        raise UnsupportedModelError(f"{path}: ssm.conv_kernel {ssm.conv} is not in 2..{MAX_SSM_CONV}")
    if key("attention.recurrent_layers") in metadata:
        raise UnsupportedModelError(f"{path}: {key('attention.recurrent_layers')} is not supported")
    if metadata.get(key("nextn_predict_layers"), 0):
        raise UnsupportedModelError(f"{path}: multi-token-prediction layers are not supported")
    interval = _meta_int(path, metadata, key("full_attention_interval"), 4)
    recurrent = tuple((i + 1) % interval != 0 for i in range(n_layers))
    if not any(recurrent):
        raise UnsupportedModelError(f"{path}: {arch} without a DeltaNet layer is not supported")
    return ssm, recurrent
