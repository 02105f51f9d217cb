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

The architectures and their hyper-parameters (`ModelConfig`, read from the `{arch}.*` keys)
live in model_config.py.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

from .errors import UnsupportedModelError
from .gguf_split import part_paths
from .model_config import ARCHITECTURES, ModelConfig, read_config

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
    config = read_config(path, metadata, tensors)
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
                    **({"ffn_gate_inp_shexp.weight": (c.dim,)} if c.moe.shared_gate else {}),
                    "ffn_gate_shexp.weight": (c.dim, s),
                    "ffn_up_shexp.weight": (c.dim, s),
                    "ffn_down_shexp.weight": (s, c.dim),
                }
            )
    recurrent = (
        _deltanet_shapes(c, per_layer)
        if c.ssm is not None
        else _mamba2_shapes(c, per_layer)
        if c.mamba is not None
        else per_layer
    )
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


def _mamba2_shapes(c: ModelConfig, per_layer: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """A Mamba2 layer's tensors (llama.cpp's names, granite-hybrid.cpp): these replace attention's."""
    assert c.mamba is not None
    m = c.mamba
    return {
        "attn_norm.weight": (c.dim,),
        "ssm_in.weight": (c.dim, m.in_proj),
        "ssm_conv1d.weight": (m.conv, m.conv_dim),
        "ssm_conv1d.bias": (m.conv_dim,),
        "ssm_dt.bias": (m.n_heads,),
        "ssm_a": (1, m.n_heads),
        "ssm_d": (1, m.n_heads),
        "ssm_norm.weight": (m.inner // m.n_group, m.n_group),
        "ssm_out.weight": (m.inner, c.dim),
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
