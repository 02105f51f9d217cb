"""What a GGUF file's metadata says about its model: one `ModelConfig` for every architecture.

`ARCHITECTURES` maps each supported `general.architecture` to its `ArchSpec` (what the
architecture adds to the llama block, fixed per architecture); `read_config` reads the
`{arch}.*` hyper-parameters of one file into a validated, frozen `ModelConfig` (raising
ValueError for a malformed file and UnsupportedModelError for a valid one the engine cannot run).
gguf_file.py opens the file and checks its tensors against the config.

NOTE: RoPE layout. For arch llama the usual HF -> GGUF converter permutes the rows of `attn_q`
and `attn_k` so that rotary embedding rotates *adjacent* pairs: (x[2i], x[2i+1]) of each head by
the angle pos * rope_base ** (-2i / head_dim) (llama.cpp's rope mode NORMAL). qwen2, qwen3 and
gemma3 keep HF's row order and rotate the halves (x[i], x[i + head_dim/2]) (mode NEOX). The
mode is a property of the architecture (`ArchSpec.rope_mode`), never of the file.

NOTE: lfm2 (LFM2, LFM2.5) as llama.cpp reads it: `attention.head_count_kv` is an array with one
entry per layer, 0 on the short-convolution layers (blk.{i}.shortconv.{in_proj,conv,out_proj};
conv kernel `shortconv.l_cache` taps, stored [dim][l_cache] in F32) and the attention count on
the others (which add attn_{q,k}_norm); its final norm is called token_embd_norm.weight.
NOTE: qwen35 (Qwen3.5 dense) as llama.cpp reads it (src/models/qwen35.cpp): layer i is a Gated
DeltaNet layer unless (i + 1) % full_attention_interval == 0 (default 4), and those others are
gated attention (attn_q yields, per head, head_dim query values then head_dim gate values; NEOX
rope on the first rope.dimension_count dims). The DeltaNet dimensions: ssm.state_size d (head
width of keys and values), ssm.group_count key heads, ssm.time_step_rank value heads,
ssm.inner_size = value heads * d, ssm.conv_kernel taps; the FFN norm is post_attention_norm.
rope.dimension_sections is honoured only where it rotates every pair by the token position
(text: sections t, h, w cover rope.dimension_count / 2 pairs), as for every Qwen3.5 file.

NOTE: granitehybrid (IBM Granite 4.0 H): Mamba2 layers where head_count_kv[i] is 0, llama
attention elsewhere, and the granite scales; granite_config.py reads its keys.

NOTE: gemma's norms. HF Gemma computes rmsnorm(x) * (1 + w); llama.cpp's converter stores
w + 1 in the GGUF, so every norm here, gemma3's included, is plain rmsnorm(x) * w.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .errors import UnsupportedModelError

if TYPE_CHECKING:
    from .deltanet_config import SsmConfig
    from .gguf_file import TensorRef
    from .granite_config import Mamba2Config


class RopeMode(enum.IntEnum):
    """How RoPE pairs a head's dimensions (values: engine.h ROPE_*)."""

    NORMAL = 0  # adjacent pairs (x[2i], x[2i+1])
    NEOX = 1  # halves (x[i], x[i + head_dim/2])


class Activation(enum.IntEnum):
    """The feed-forward gate: act(gate) * up (values: engine.h ACT_*)."""

    SILU = 0  # SwiGLU
    GELU_TANH = 1  # GeGLU with GELU's tanh approximation


@dataclass(frozen=True)
class ArchSpec:
    """What an architecture adds to the llama block (fixed per architecture, not per file)."""

    rope_mode: RopeMode
    activation: Activation
    qkv_bias: bool = False  # attn_{q,k,v}.bias added after the matmuls
    qk_norm: bool = False  # attn_{q,k}_norm: rmsnorm per head before RoPE
    qk_norm_full: bool = False  # olmoe: the q, k norms over the whole projection, not per head
    post_norms: bool = False  # post_attention_norm, post_ffw_norm before each residual add
    embed_scaled: bool = False  # embeddings multiplied by sqrt(dim)
    sliding_window: bool = False  # {arch}.attention.sliding_window on SWA_PATTERN - 1 of SWA_PATTERN layers
    rope_freqs: bool = False  # may carry rope_freqs.weight (llama 3.1 frequency factors)
    shortconv: bool = False  # lfm2: short-convolution layers where head_count_kv[i] == 0
    deltanet: bool = False  # qwen35: Gated DeltaNet layers, gated attention, partial rotary
    moe: bool = False  # mixture-of-experts FFN on every layer (ffn_gate_inp, ffn_*_exps)
    shared_expert: bool = False  # qwen2moe: ffn_*_shexp scaled by sigmoid(ffn_gate_inp_shexp . h)
    expert_norm: bool = False  # qwen3moe: the chosen experts' weights renormalised to sum 1
    experts_ffn_wide: bool = False  # olmoe: experts of feed_forward_length (llama.cpp's n_ff)
    mamba2: bool = False  # granitehybrid: Mamba2 layers where head_count_kv[i] == 0 (granite_config.py)


ARCHITECTURES: dict[str, ArchSpec] = {
    "llama": ArchSpec(RopeMode.NORMAL, Activation.SILU, rope_freqs=True),
    "qwen2": ArchSpec(RopeMode.NEOX, Activation.SILU, qkv_bias=True),
    "qwen3": ArchSpec(RopeMode.NEOX, Activation.SILU, qk_norm=True),
    "gemma3": ArchSpec(
        RopeMode.NEOX,
        Activation.GELU_TANH,
        qk_norm=True,
        post_norms=True,
        embed_scaled=True,
        sliding_window=True,
    ),
    "lfm2": ArchSpec(RopeMode.NEOX, Activation.SILU, qk_norm=True, shortconv=True),
    "qwen35": ArchSpec(RopeMode.NEOX, Activation.SILU, qk_norm=True, deltanet=True),
    "qwen3moe": ArchSpec(RopeMode.NEOX, Activation.SILU, qk_norm=True, moe=True, expert_norm=True),
    "qwen2moe": ArchSpec(RopeMode.NEOX, Activation.SILU, qkv_bias=True, moe=True, shared_expert=True),
    "olmoe": ArchSpec(
        RopeMode.NEOX, Activation.SILU, qk_norm=True, qk_norm_full=True, moe=True, experts_ffn_wide=True
    ),
    "granitehybrid": ArchSpec(RopeMode.NORMAL, Activation.SILU, mamba2=True),
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)

# gemma3 (as llama.cpp reads it): layer i uses the sliding window unless (i + 1) % 6 == 0, and
# its sliding-window layers use RoPE base 10000 whatever rope.freq_base says (that one is the
# global layers').
SWA_PATTERN = 6
SWA_ROPE_BASE = 10000.0


@dataclass(frozen=True)
class MoeConfig:
    """A mixture-of-experts FFN as llama.cpp reads its keys: {arch}.expert_count experts of
    {arch}.expert_feed_forward_length, {arch}.expert_used_count chosen per token (softmax over
    the router's logits, top-k); qwen3moe renormalises the chosen weights (llama.cpp hard-codes
    it per architecture: no key); olmoe's experts are feed_forward_length wide (llama.cpp reads
    n_ff for its expert tensors); qwen2moe adds a shared expert of
    {arch}.expert_shared_feed_forward_length (default feed_forward_length)."""

    n_expert: int
    n_expert_used: int
    expert_ffn: int
    norm_weights: bool
    shared_ffn: int  # 0: no shared expert
    shared_gate: bool = (
        True  # the shared expert scaled by sigmoid(ffn_gate_inp_shexp . h); granitehybrid: no gate
    )


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a model, read from its `{arch}.*` metadata, and the architecture's
    switches the engine reads (one description for every supported architecture)."""

    arch: str  # general.architecture, a key of ARCHITECTURES
    n_layers: int
    dim: int  # embedding width
    n_heads: int  # query heads
    n_kv_heads: int  # key/value heads (grouped-query attention: n_heads % n_kv_heads == 0)
    head_dim: int  # per-head width: attention.key_length (not always dim / n_heads); even
    ffn_dim: int  # gated feed-forward hidden width
    n_vocab: int  # rows of token_embd (and of the output matrix)
    rope_base: float  # {arch}.rope.freq_base (gemma3: of the global layers)
    rms_eps: float  # {arch}.attention.layer_norm_rms_epsilon
    ctx_train: int  # {arch}.context_length (trained context; informational)
    tied_output: bool  # True: no output.weight, logits use token_embd.weight
    rope_mode: RopeMode = RopeMode.NORMAL
    activation: Activation = Activation.SILU
    qkv_bias: bool = False
    qk_norm: bool = False
    qk_norm_full: bool = False  # the q, k norms span the whole projection (olmoe), not one head
    post_norms: bool = False
    embed_scale: float = 1.0  # multiplies the embeddings (gemma3: sqrt(dim))
    attn_scale: float = 0.0  # attention score scale; 0 -> 1/sqrt(head_dim)
    rope_freqs: bool = False  # rope_freqs.weight [head_dim/2] divides the RoPE frequencies
    layer_windows: tuple[int, ...] = ()  # per layer: sliding window (0 = whole context); () = all 0
    layer_rope_bases: tuple[float, ...] = ()  # per layer RoPE base; () = rope_base everywhere
    conv_layers: tuple[bool, ...] = ()  # per layer: a short-convolution block (lfm2); () = none
    conv_len: int = 0  # taps of the short convolutions ({arch}.shortconv.l_cache); 0 = none
    output_norm_name: str = "output_norm.weight"  # lfm2: token_embd_norm.weight
    rope_dim: int = 0  # dims of a head RoPE rotates (the first ones); 0 = head_dim
    q_gate: bool = False  # qwen35: attn_q also yields a sigmoid gate per head on the attention output
    ssm: SsmConfig | None = None  # qwen35: the Gated DeltaNet layers' dimensions
    recurrent_layers: tuple[bool, ...] = ()  # per layer: Gated DeltaNet or Mamba2 (no KV); () = none
    ffn_norm_name: str = "ffn_norm"  # the FFN's norm tensor (qwen35: post_attention_norm)
    moe: MoeConfig | None = (
        None  # mixture-of-experts FFN (ffn_dim is then the shared expert's, or the experts')
    )
    mamba: Mamba2Config | None = None  # granitehybrid: the Mamba2 layers' dimensions
    residual_scale: float = 1.0  # granite: a block's output * this before the residual add
    logit_scale: float = 1.0  # granite: logits / this
    rope: bool = True  # False: attention layers rotate nothing (granite 4.0 H)

    def __post_init__(self) -> None:
        if not self.attn_scale:
            object.__setattr__(self, "attn_scale", 1.0 / math.sqrt(self.head_dim))
        if not self.layer_windows:
            object.__setattr__(self, "layer_windows", (0,) * self.n_layers)
        if not self.layer_rope_bases:
            object.__setattr__(self, "layer_rope_bases", (self.rope_base,) * self.n_layers)
        if not self.conv_layers:
            object.__setattr__(self, "conv_layers", (False,) * self.n_layers)
        if (
            len(self.layer_windows) != self.n_layers
            or len(self.layer_rope_bases) != self.n_layers
            or len(self.conv_layers) != self.n_layers
        ):
            raise ValueError("layer_windows, layer_rope_bases and conv_layers need one entry per layer")
        if any(self.conv_layers) != (self.conv_len > 0):
            raise ValueError("conv_len is set exactly when some layer is a short convolution")
        if not self.rope_dim:
            object.__setattr__(self, "rope_dim", self.head_dim)
        if not self.recurrent_layers:
            object.__setattr__(self, "recurrent_layers", (False,) * self.n_layers)
        if (
            len(self.recurrent_layers) != self.n_layers
            or any(self.recurrent_layers) != (self.ssm is not None or self.mamba is not None)
            or (self.ssm is not None and self.mamba is not None)
        ):
            raise ValueError(
                "recurrent_layers needs one entry per layer, and ssm or mamba exactly when one is set"
            )

    @property
    def has_recurrent_state(self) -> bool:
        """Some layer keeps a recurrent state per slot (DeltaNet, Mamba2): slots extend only."""
        return self.ssm is not None or self.mamba is not None

    @property
    def recurrent_state_floats(self) -> int:
        """f32 values one recurrent layer keeps per slot (0 without such layers)."""
        if self.ssm is not None:
            return self.ssm.state_floats
        return self.mamba.state_floats if self.mamba is not None else 0

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


def _meta_int(path: Path, metadata: dict[str, object], key: str, default: int | None = None) -> int:
    value = metadata.get(key, default)
    if value is None:
        raise ValueError(f"{path}: required metadata field {key!r} is missing")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{path}: metadata field {key!r} must be a positive integer, got {value!r}")
    return value


def _meta_float(path: Path, metadata: dict[str, object], key: str, default: float) -> float:
    value = metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{path}: metadata field {key!r} must be a positive number, got {value!r}")
    return float(value)


def read_config(path: Path, metadata: dict[str, object], tensors: Mapping[str, TensorRef]) -> ModelConfig:
    """The validated config of the file at `path` from its decoded metadata and tensor table."""
    arch = str(metadata["general.architecture"])
    spec = ARCHITECTURES[arch]

    def key(name: str) -> str:
        return f"{arch}.{name}"

    n_layers = _meta_int(path, metadata, key("block_count"))
    dim = _meta_int(path, metadata, key("embedding_length"))
    n_heads = _meta_int(path, metadata, key("attention.head_count"))
    granite = None
    if spec.mamba2:
        from .granite_config import read_granite

        granite = read_granite(path, metadata, arch, n_layers, n_heads, tensors)
        n_kv_heads, conv_layers, conv_len = granite.n_kv_heads, (False,) * n_layers, 0
    else:
        n_kv_heads, conv_layers, conv_len = _read_layer_kinds(path, metadata, arch, n_layers, n_heads)
    if dim % n_heads != 0 and key("attention.key_length") not in metadata:
        raise ValueError(f"{path}: embedding_length {dim} is not a multiple of head_count {n_heads}")
    head_dim = _meta_int(path, metadata, key("attention.key_length"), dim // n_heads)
    value_dim = _meta_int(path, metadata, key("attention.value_length"), head_dim)
    rope_dim = _meta_int(path, metadata, key("rope.dimension_count"), head_dim)
    if value_dim != head_dim:
        raise UnsupportedModelError(
            f"{path}: key_length {head_dim} != value_length {value_dim} is not supported"
        )
    if rope_dim != head_dim and not spec.deltanet:
        raise UnsupportedModelError(
            f"{path}: partial rotary embedding (rope.dimension_count {rope_dim} "
            f"< head_dim {head_dim}) is not supported"
        )
    if head_dim % 2 != 0:
        raise ValueError(f"{path}: head_dim {head_dim} must be even for RoPE")
    if n_heads % n_kv_heads != 0:
        raise ValueError(f"{path}: head_count {n_heads} is not a multiple of head_count_kv {n_kv_heads}")
    ffn_dim = (
        _meta_int(path, metadata, key("feed_forward_length"))
        if key("feed_forward_length") in metadata or not spec.moe
        else 0
    )
    moe = _read_moe(path, metadata, arch, ffn_dim) if spec.moe else None
    if granite is not None:
        moe = granite.moe
    if metadata.get(key("expert_count"), 0) and moe is None:
        raise UnsupportedModelError(f"{path}: mixture-of-experts {arch} models are not supported")
    if moe is not None:
        ffn_dim = moe.shared_ffn or moe.expert_ffn
    scaling = metadata.get(key("rope.scaling.type"), "none")
    if scaling not in ("none", None):
        raise UnsupportedModelError(
            f"{path}: RoPE scaling {scaling!r} is not supported (supported: none, llama 3.1 rope_freqs)"
        )
    if metadata.get(key("final_logit_softcapping"), 0) or metadata.get(key("attn_logit_softcapping"), 0):
        raise UnsupportedModelError(f"{path}: logit soft-capping is not supported")
    has_rope_freqs = "rope_freqs.weight" in tensors
    if has_rope_freqs and not spec.rope_freqs:
        raise UnsupportedModelError(
            f"{path}: RoPE frequency factors (rope_freqs.weight) on {arch} are not supported"
        )
    embd = tensors.get("token_embd.weight")
    if embd is None:
        raise ValueError(f"{path}: required tensor 'token_embd.weight' is missing")
    if len(embd.shape) != 2:
        raise ValueError(f"{path}: tensor 'token_embd.weight' has shape {embd.shape}, expected 2-D")
    n_vocab = embd.shape[1]
    tokens = metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and len(tokens) != n_vocab:
        raise ValueError(
            f"{path}: the tokenizer has {len(tokens)} tokens but token_embd.weight has {n_vocab} rows"
        )
    rope_base = _meta_float(path, metadata, key("rope.freq_base"), 10000.0)
    windows, bases = (0,) * n_layers, (rope_base,) * n_layers
    ssm: SsmConfig | None = None
    recurrent: tuple[bool, ...] = ()
    if spec.deltanet:
        from .deltanet_config import read_deltanet

        ssm, recurrent = read_deltanet(path, metadata, arch, n_layers, rope_dim, head_dim)
    if granite is not None:
        recurrent = granite.recurrent_layers
    embed_scale = float(np.float32(math.sqrt(dim))) if spec.embed_scaled else 1.0
    if spec.sliding_window and metadata.get(key("attention.sliding_window")):
        window = _meta_int(path, metadata, key("attention.sliding_window"))
        local = [(i + 1) % SWA_PATTERN != 0 for i in range(n_layers)]
        windows = tuple(window if is_local else 0 for is_local in local)
        bases = tuple(SWA_ROPE_BASE if is_local else rope_base for is_local in local)
    return ModelConfig(
        arch=arch,
        n_layers=n_layers,
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        ffn_dim=ffn_dim,
        n_vocab=n_vocab,
        rope_base=rope_base,
        rms_eps=_meta_float(path, metadata, key("attention.layer_norm_rms_epsilon"), 1e-5),
        ctx_train=_meta_int(path, metadata, key("context_length"), 2048),
        tied_output="output.weight" not in tensors,
        rope_mode=spec.rope_mode,
        activation=spec.activation,
        qkv_bias=spec.qkv_bias,
        qk_norm=spec.qk_norm,
        qk_norm_full=spec.qk_norm_full,
        post_norms=spec.post_norms,
        # NOTE: llama.cpp scales by sqrtf(n_embd) in float32 (HF rounds it to the weights' dtype)
        embed_scale=granite.embed_scale if granite is not None else embed_scale,
        attn_scale=granite.attn_scale if granite is not None else 0.0,
        rope_freqs=has_rope_freqs,
        layer_windows=windows,
        layer_rope_bases=bases,
        rope_dim=rope_dim,
        q_gate=spec.deltanet,
        ssm=ssm,
        recurrent_layers=recurrent,
        ffn_norm_name="post_attention_norm" if spec.deltanet else "ffn_norm",
        conv_layers=conv_layers,
        conv_len=conv_len,
        output_norm_name="token_embd_norm.weight" if spec.shortconv else "output_norm.weight",
        moe=moe,
        mamba=granite.mamba if granite is not None else None,
        residual_scale=granite.residual_scale if granite is not None else 1.0,
        logit_scale=granite.logit_scale if granite is not None else 1.0,
        rope=granite.rope if granite is not None else True,
    )


def _read_moe(path: Path, metadata: dict[str, object], arch: str, ffn_dim: int) -> MoeConfig:
    """The expert keys as llama.cpp reads them (llama-model.cpp, src/models/{arch}.cpp)."""
    spec = ARCHITECTURES[arch]
    n_expert = _meta_int(path, metadata, f"{arch}.expert_count")
    n_used = _meta_int(path, metadata, f"{arch}.expert_used_count")
    if not 1 <= n_used <= n_expert:
        raise ValueError(f"{path}: {arch} needs expert_count >= 1 and expert_used_count in 1..expert_count")
    for unsupported in ("expert_group_count", "expert_weights_scale"):
        value = metadata.get(f"{arch}.{unsupported}", 0)
        if value and not (unsupported == "expert_weights_scale" and value == 1.0):
            raise UnsupportedModelError(f"{path}: {arch} with {arch}.{unsupported} is not supported")
    if spec.experts_ffn_wide:  # olmoe.cpp: the expert tensors are n_ff wide
        expert_ffn = _meta_int(path, metadata, f"{arch}.feed_forward_length")
    else:  # llama.cpp: n_ff_exp = expert_feed_forward_length, else feed_forward_length / expert_used_count
        expert_ffn = _meta_int(
            path, metadata, f"{arch}.expert_feed_forward_length", ffn_dim // n_used or None
        )
    shared = 0
    if spec.shared_expert:
        shared = _meta_int(path, metadata, f"{arch}.expert_shared_feed_forward_length", ffn_dim or None)
    return MoeConfig(n_expert, n_used, expert_ffn, spec.expert_norm, shared)


MAX_CONV_LEN = 16  # engine_internal.h MAX_CONV_LEN


def _read_layer_kinds(
    path: Path, metadata: dict[str, object], arch: str, n_layers: int, n_heads: int
) -> tuple[int, tuple[bool, ...], int]:
    """(n_kv_heads of the attention layers, which layers are short convolutions, conv taps).

    head_count_kv is one number, or (lfm2) one per layer: 0 marks a short-convolution layer,
    every attention layer must then have the same count."""
    key = f"{arch}.attention.head_count_kv"
    value = metadata.get(key, n_heads)
    if not ARCHITECTURES[arch].shortconv:
        if isinstance(value, list):
            raise UnsupportedModelError(f"{path}: per-layer {key} on {arch} is not supported")
        return _meta_int(path, metadata, key, n_heads), (False,) * n_layers, 0
    for unsupported in (
        ("attention.sliding_window",)
        if ARCHITECTURES[arch].moe
        else (
            "attention.sliding_window",
            "expert_count",
        )
    ):
        if metadata.get(f"{arch}.{unsupported}", 0):
            raise UnsupportedModelError(f"{path}: {arch} with {arch}.{unsupported} is not supported")
    if metadata.get(f"{arch}.attention.causal", True) is False:
        raise UnsupportedModelError(f"{path}: a bidirectional (non-causal) {arch} model is not supported")
    raw = value if isinstance(value, list) else [value] * n_layers
    if len(raw) != n_layers or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in raw):
        raise ValueError(f"{path}: {key} must be {n_layers} non-negative integers, got {value!r}")
    counts = [c for c in raw if isinstance(c, int)]
    conv_layers = tuple(c == 0 for c in counts)
    attention = {c for c in counts if c}
    if len(attention) > 1:
        raise UnsupportedModelError(f"{path}: attention layers with different {key} {sorted(attention)}")
    if not attention:
        raise UnsupportedModelError(f"{path}: {arch} without any attention layer is not supported")
    conv_len = _meta_int(path, metadata, f"{arch}.shortconv.l_cache") if any(conv_layers) else 0
    if any(conv_layers) and not 2 <= conv_len <= MAX_CONV_LEN:
        raise UnsupportedModelError(f"{path}: shortconv.l_cache {conv_len} is not in 2..{MAX_CONV_LEN}")
    return attention.pop(), conv_layers, conv_len
