"""The weight writers every GGUF fixture writer here shares: the tensor types a fixture may use
(WEIGHT_TYPES, MORE_WEIGHT_TYPES, K_TYPES, the WEIGHT_MIXES and K_DIMS), one tensor converted
to its type (`_add`), random valid K-quant blocks of a wanted spread (`random_blocks`) and
`RandomTensors`, a fixture's random weights, vectors and norms in their types (the qwen35 and
granitehybrid writers')."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
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


@dataclass(frozen=True)
class RandomTensors:
    """One fixture's tensors added to `w` in the order called, drawn from `rng` (the draws'
    order is the file's bytes, and the qwen35 and granitehybrid fixtures' records were written
    with these: keep it). A 2-D weight is in `weight_type` unless `overrides` names the tensor,
    or its kind (the name's last part before `.weight`); vectors and norms are F32."""

    w: GGUFWriter
    rng: np.random.Generator
    weight_type: str
    overrides: Mapping[str, str]
    dim: int  # a norm's default length

    def type_of(self, name: str) -> str:
        """The type a weight of this name is written in."""
        kind = name.removesuffix(".weight").split(".")[-1]
        return self.overrides.get(name, self.overrides.get(kind, self.weight_type))

    def weight(self, name: str, rows: int, cols: int, scale: float) -> None:
        """A [rows, cols] weight of std `scale` in its type: random blocks for the K-quants,
        else normal floats converted."""
        type_name = self.type_of(name)
        if type_name in K_TYPES:
            qtype = GGMLQuantizationType[type_name]
            self.w.add_tensor(
                name, random_blocks(type_name, rows, cols, self.rng, std=scale), raw_dtype=qtype
            )
        else:
            _add(self.w, name, (self.rng.standard_normal((rows, cols)) * scale).astype(np.float32), type_name)

    def vec(self, name: str, values: np.ndarray) -> None:
        """`values` as an F32 tensor of their shape."""
        self.w.add_tensor(name, values.astype(np.float32))

    def norm(self, name: str, n: int | None = None) -> None:
        """A norm's weights of length n (default dim), 1 + N(0, 0.1^2)."""
        self.vec(name, 1.0 + 0.1 * self.rng.standard_normal(self.dim if n is None else n))

    def close(self) -> None:
        """Write the file (header, keys, tensors) and close it."""
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


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
