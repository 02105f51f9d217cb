"""Open a GGUF model file: validated config, tensor table and raw weight bytes (memory-mapped).

Design: `load_model_file` parses the file with the `gguf` package's GGUFReader over a read-only
memory map and checks everything the engine relies on before any C code sees a pointer: a
supported architecture (`ARCHITECTURES`: llama, qwen2, qwen3, gemma3, lfm2, qwen35, qwen3moe,
qwen2moe, olmoe), tensor types the kernels
implement, every required tensor present, every shape consistent with the config. One
`ModelConfig` describes every architecture: the `{arch}.*` hyper-parameters plus the switches
(rope mode, activation, biases, q/k norms, post-norms, embedding scale) and per-layer arrays
(sliding window, RoPE base) that the engine's one phase sequence reads. The weights are never copied: each `TensorRef.data` is a uint8
view into the map, and the map lives as long as any `ModelFile` or `TensorRef` refers to it.

Tensor shapes are in GGUF/ggml order: `shape[0]` is the row length (the input dimension of a
matmul, contiguous in memory), `shape[1]` the number of rows (the output dimension). A weight
W with shape (n_in, n_out) computes y[j] = sum_i W[j, i] * x[i] over its rows j < n_out.

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

NOTE: gemma's norms. HF Gemma computes rmsnorm(x) * (1 + w); llama.cpp's converter stores
w + 1 in the GGUF, so every norm here, gemma3's included, is plain rmsnorm(x) * w.
"""

from __future__ import annotations

import enum
import hashlib
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

from .errors import UnsupportedModelError
from .gguf_split import part_paths

SUPPORTED_TYPES: frozenset[int] = frozenset(
    int(t)
    for t in (
        GGMLQuantizationType.F32,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_1,
        GGMLQuantizationType.Q8_0,
        GGMLQuantizationType.Q5_0,
        GGMLQuantizationType.Q5_1,
        GGMLQuantizationType.Q2_K,
        GGMLQuantizationType.Q3_K,
        GGMLQuantizationType.Q4_K,
        GGMLQuantizationType.Q5_K,
        GGMLQuantizationType.Q6_K,
        GGMLQuantizationType.BF16,
    )
)

# Per-layer tensors every architecture has: blk.{i}.{suffix}.weight.
LAYER_TENSORS = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_norm",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


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
}
SUPPORTED_ARCHITECTURES = tuple(ARCHITECTURES)

# gemma3 (as llama.cpp reads it): layer i uses the sliding window unless (i + 1) % 6 == 0, and
# its sliding-window layers use RoPE base 10000 whatever rope.freq_base says (that one is the
# global layers').
SWA_PATTERN = 6
SWA_ROPE_BASE = 10000.0


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


MAX_SSM_CONV = 16  # engine.c: longest DeltaNet conv


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
    recurrent_layers: tuple[bool, ...] = ()  # per layer: Gated DeltaNet (no KV); () = none
    ffn_norm_name: str = "ffn_norm"  # the FFN's norm tensor (qwen35: post_attention_norm)
    moe: MoeConfig | None = (
        None  # mixture-of-experts FFN (ffn_dim is then the shared expert's, or the experts')
    )

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
        if len(self.recurrent_layers) != self.n_layers or any(self.recurrent_layers) != (
            self.ssm is not None
        ):
            raise ValueError("recurrent_layers needs one entry per layer, and ssm exactly when one is set")

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim


@dataclass(frozen=True, eq=False)
class TensorRef:
    """One tensor of the file, by reference.

    shape is in GGUF/ggml order (shape[0] = row length, shape[1] = number of rows).
    data is a read-only, C-contiguous uint8 view [n_bytes] of the raw encoded bytes inside the
    file's memory map (no copy); its lifetime keeps the map open.
    """

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    data: np.ndarray  # uint8 [n_bytes], read-only view into the memmap

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.ggml_type)


@dataclass(frozen=True, eq=False)
class ModelFile:
    """A validated GGUF model. Holds the memory map open for as long as it (or any of its
    TensorRefs) is alive; the engine may keep raw pointers into `tensors[...].data` while it
    holds a reference to this object."""

    path: Path
    name: str  # general.name, or the file stem
    config: ModelConfig
    tensors: dict[str, TensorRef]
    metadata: dict[str, object]  # every key/value field, decoded to Python scalars/str/lists
    fingerprint: str  # hex digest of metadata + tensor layout + file size (not the weight bytes)
    _readers: tuple[GGUFReader, ...] = field(repr=False)  # one per file (a split GGUF has several)

    @property
    def read_only_map(self) -> bool:
        """True when every tensor's bytes lie in a read-only memory map of its file: pages the
        engine has copied may then be given back to the kernel (they are re-read from the file
        if touched again)."""
        return all(isinstance(r.data, np.memmap) and r.data.mode == "r" for r in self._readers)

    def tensor(self, name: str) -> TensorRef:
        """The tensor called `name`; ValueError naming it if the file has no such tensor."""
        try:
            return self.tensors[name]
        except KeyError:
            raise ValueError(f"{self.path}: the model has no tensor {name!r}") from None


def ggml_type_name(ggml_type: int) -> str:
    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"unknown type {ggml_type}"


def load_model_file(path: str | os.PathLike[str]) -> ModelFile:
    """Open and validate the GGUF at `path`.

    Raises ValueError with a message naming the problem (and, where there is one, the fix) if
    the file is missing, not a GGUF, uses a tensor type the engine lacks, misses a required
    tensor, or has shapes that disagree with its metadata; UnsupportedModelError (a ValueError)
    for an architecture or architecture feature the engine does not implement.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such model file (pass the path of a local .gguf file)")
    try:
        reader = _FastReader(path, "r")
    except Exception as exc:  # the reader raises ValueError/KeyError/IndexError on garbage
        raise ValueError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    if reader.byte_order == "S":
        raise ValueError(f"{path}: big-endian GGUF files are not supported; convert it little-endian")

    metadata = {name: _decode_field(path, f) for name, f in reader.fields.items()}
    files = part_paths(path, metadata)  # [path], or every part of a split GGUF (read in place)
    readers = [reader, *(_open_part(p) for p in files[1:])]
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: unsupported model architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}"
        )
    tensors = {
        t.name: TensorRef(
            name=t.name,
            ggml_type=int(t.tensor_type),
            shape=tuple(int(d) for d in t.shape),
            data=_raw_bytes(r, t),
        )
        for r in readers
        for t in r.tensors
    }
    if len(tensors) != sum(len(r.tensors) for r in readers):
        raise ValueError(f"{path}: the parts of this split GGUF repeat a tensor name")
    config = _read_config(path, metadata, tensors)
    _check_tensors(path, config, tensors)
    name = metadata.get("general.name")
    return ModelFile(
        path=path,
        name=name if isinstance(name, str) and name else path.stem,
        config=config,
        tensors=tensors,
        metadata=metadata,
        fingerprint=_fingerprint(files, metadata, readers),
        _readers=tuple(readers),
    )


def required_tensor_names(config: ModelConfig) -> list[str]:
    """Tensors a model of this config must have (output.weight only when not tied)."""
    return list(_expected_shapes(config))


class _FastReader(GGUFReader):
    """GGUFReader whose field parsing slices a plain ndarray view of the memmap.

    NOTE: GGUFReader slices the np.memmap subclass once per string of the vocabulary; memmap's
    Python-level __getitem__/__array_finalize__ make that ~4 s for a 49k vocabulary. Slicing a
    plain ndarray view of the same mapping (still no copy; the view keeps the map alive) takes
    ~1 s. This overrides a private method; the result is checked by the tests on every load.
    """

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self._plain = self.data.view(np.ndarray)
        dt = np.dtype(dtype)
        count = int(count)
        arr = plain[offset : offset + dt.itemsize * count].view(dt)
        order = self.byte_order if override_order is None else override_order
        if order == "I" or (order == "<" and sys.byteorder == "little"):
            return arr
        return arr.view(arr.dtype.newbyteorder(order))


def _raw_bytes(reader: GGUFReader, t: Any) -> np.ndarray:
    start = int(t.data_offset)
    raw = reader.data.view(np.ndarray)[start : start + int(t.n_bytes)]
    assert raw.flags.c_contiguous and raw.dtype == np.uint8
    return raw


def _decode_field(path: Path, f: Any) -> object:
    """A metadata field as a Python value: scalar, str, or list of those."""
    try:
        if f.types[0] == GGUFValueType.ARRAY:
            if len(f.types) > 1 and f.types[1] == GGUFValueType.ARRAY:
                return None  # nested arrays: not used by llama models, left undecoded
            return [_decode_part(f.parts[i], f.types[-1] if len(f.types) > 1 else None) for i in f.data]
        return _decode_part(f.parts[f.data[0]], f.types[0])
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: metadata field {f.name!r} is not valid UTF-8") from exc


def _decode_part(part: np.ndarray, vtype: Any) -> object:
    if vtype == GGUFValueType.STRING:
        return bytes(part).decode("utf-8")
    value = part[0].item()
    return bool(value) if vtype == GGUFValueType.BOOL else value


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


def _read_config(path: Path, metadata: dict[str, object], tensors: dict[str, TensorRef]) -> ModelConfig:
    arch = str(metadata["general.architecture"])
    spec = ARCHITECTURES[arch]

    def key(name: str) -> str:
        return f"{arch}.{name}"

    n_layers = _meta_int(path, metadata, key("block_count"))
    dim = _meta_int(path, metadata, key("embedding_length"))
    n_heads = _meta_int(path, metadata, key("attention.head_count"))
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
    ssm, recurrent = (
        _read_deltanet(path, metadata, arch, n_layers, rope_dim, head_dim) if spec.deltanet else (None, ())
    )
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
        embed_scale=float(np.float32(math.sqrt(dim))) if spec.embed_scaled else 1.0,
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


def _read_deltanet(
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


MAX_CONV_LEN = 16  # engine.c MAX_CONV_LEN


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


def _expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    q_dim, kv_dim = c.q_dim, c.kv_dim
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (c.dim, c.n_vocab),
        c.output_norm_name: (c.dim,),
    }
    if not c.tied_output:
        shapes["output.weight"] = (c.dim, c.n_vocab)
    if c.rope_freqs:
        shapes["rope_freqs.weight"] = (c.head_dim // 2,)
    per_layer = {
        "attn_norm.weight": (c.dim,),
        "attn_q.weight": (c.dim, 2 * q_dim if c.q_gate else q_dim),
        "attn_k.weight": (c.dim, kv_dim),
        "attn_v.weight": (c.dim, kv_dim),
        "attn_output.weight": (q_dim, c.dim),
        f"{c.ffn_norm_name}.weight": (c.dim,),
        "ffn_gate.weight": (c.dim, c.ffn_dim),
        "ffn_up.weight": (c.dim, c.ffn_dim),
        "ffn_down.weight": (c.ffn_dim, c.dim),
    }
    if c.qkv_bias:
        per_layer.update({"attn_q.bias": (q_dim,), "attn_k.bias": (kv_dim,), "attn_v.bias": (kv_dim,)})
    if c.qk_norm:
        qn, kn = (q_dim, kv_dim) if c.qk_norm_full else (c.head_dim, c.head_dim)
        per_layer.update({"attn_q_norm.weight": (qn,), "attn_k_norm.weight": (kn,)})
    if c.post_norms:
        per_layer.update({"post_attention_norm.weight": (c.dim,), "post_ffw_norm.weight": (c.dim,)})
    conv_layer = {  # lfm2: these replace the attention tensors
        "attn_norm.weight": (c.dim,),
        "shortconv.in_proj.weight": (c.dim, 3 * c.dim),
        "shortconv.conv.weight": (c.conv_len, c.dim),
        "shortconv.out_proj.weight": (c.dim, c.dim),
        **{k: v for k, v in per_layer.items() if k.startswith("ffn_")},
    }
    if c.moe is not None:  # the experts replace the dense FFN (qwen2moe: which is the shared expert's)
        per_layer = {
            k: v for k, v in per_layer.items() if not k.startswith("ffn_") or k.startswith("ffn_norm")
        }
        e, f = c.moe.n_expert, c.moe.expert_ffn
        per_layer.update(
            {
                "ffn_gate_inp.weight": (c.dim, e),
                "ffn_gate_exps.weight": (c.dim, f, e),
                "ffn_up_exps.weight": (c.dim, f, e),
                "ffn_down_exps.weight": (f, c.dim, e),
            }
        )
        if c.moe.shared_ffn:
            s = c.moe.shared_ffn
            per_layer.update(
                {
                    "ffn_gate_inp_shexp.weight": (c.dim,),
                    "ffn_gate_shexp.weight": (c.dim, s),
                    "ffn_up_shexp.weight": (c.dim, s),
                    "ffn_down_shexp.weight": (s, c.dim),
                }
            )
    recurrent = _deltanet_shapes(c, per_layer) if c.ssm is not None else per_layer
    for i in range(c.n_layers):
        kind = conv_layer if c.conv_layers[i] else recurrent if c.recurrent_layers[i] else per_layer
        for suffix, shape in kind.items():
            shapes[f"blk.{i}.{suffix}"] = shape
    return shapes


def _deltanet_shapes(c: ModelConfig, per_layer: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """A DeltaNet layer's tensors (llama.cpp's names): these replace the attention tensors."""
    assert c.ssm is not None
    s = c.ssm
    return {
        "attn_norm.weight": (c.dim,),
        "attn_qkv.weight": (c.dim, s.conv_dim),
        "attn_gate.weight": (c.dim, s.value_dim),
        "ssm_conv1d.weight": (s.conv, s.conv_dim),
        "ssm_dt.bias": (s.v_heads,),
        "ssm_a": (s.v_heads,),
        "ssm_beta.weight": (c.dim, s.v_heads),
        "ssm_alpha.weight": (c.dim, s.v_heads),
        "ssm_norm.weight": (s.d_state,),
        "ssm_out.weight": (s.value_dim, c.dim),
        **{k: v for k, v in per_layer.items() if k.startswith(("ffn_", c.ffn_norm_name))},
    }


def _check_tensors(path: Path, config: ModelConfig, tensors: dict[str, TensorRef]) -> None:
    expected = _expected_shapes(config)
    missing = [name for name in expected if name not in tensors]
    if missing:
        shown = ", ".join(missing[:5]) + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
        raise ValueError(f"{path}: required tensors missing: {shown}")
    for name, shape in expected.items():
        t = tensors[name]
        if t.ggml_type not in SUPPORTED_TYPES:
            supported = ", ".join(ggml_type_name(x) for x in sorted(SUPPORTED_TYPES))
            raise UnsupportedModelError(
                f"{path}: tensor {name!r} has type {t.type_name}, which the engine does "
                f"not support (supported: {supported}); re-quantize the model"
            )
        if t.shape != shape:
            raise ValueError(
                f"{path}: tensor {name!r} has shape {t.shape}, expected {shape} from the model's metadata"
            )
        if name.endswith("shortconv.conv.weight") and t.ggml_type != GGMLQuantizationType.F32:
            raise UnsupportedModelError(
                f"{path}: convolution kernel {name!r} has type {t.type_name}; only F32 is supported"
            )
        if len(shape) == 1 and t.ggml_type != GGMLQuantizationType.F32:
            raise ValueError(
                f"{path}: vector tensor {name!r} (norm, bias) has type {t.type_name}; only F32 is supported"
            )
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)]
        if shape[0] % block != 0:
            raise ValueError(
                f"{path}: tensor {name!r} row length {shape[0]} is not a multiple of "
                f"the {t.type_name} block size {block}"
            )
        n_rows = int(np.prod(shape[1:], dtype=np.int64))
        if t.data.nbytes != n_rows * (shape[0] // block) * block_bytes:
            raise ValueError(f"{path}: tensor {name!r} data is truncated or has the wrong size")


def _open_part(path: Path) -> GGUFReader:
    """A later part of a split GGUF (engine_ext/gguf_split.py), mapped like the first."""
    try:
        return _FastReader(path, "r")
    except Exception as exc:
        raise ValueError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc


def _fingerprint(files: list[Path], metadata: dict[str, object], readers: list[GGUFReader]) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"size={files[0].stat().st_size}\n".encode())
    for key in sorted(metadata):
        h.update(f"{key}={metadata[key]!r}\n".encode("utf-8", "surrogatepass"))
    for i, (part, reader) in enumerate(zip(files, readers)):
        if i:  # a split's later parts: their size and tensor layout
            h.update(f"part {i} size={part.stat().st_size}\n".encode())
        for t in reader.tensors:
            h.update(
                f"{t.name}:{int(t.tensor_type)}:{tuple(int(d) for d in t.shape)}@{int(t.data_offset)}\n".encode()
            )
    return h.hexdigest()
