"""Synthetic GGUF models at real sizes: a real architecture's dimensions, random weights, and the
tensor type mix llama-quantize gives it at Q4_K_M (`slotserve bench engine --synthetic NAME`).

Speed at 0.5B-8B parameters is set by memory bandwidth and by the K-quant kernels, which the tiny
test fixtures never stress; real files of those sizes are not on every machine. The weights are
random valid blocks (random quant and scale bytes; f16 super-block scales chosen so each matmul's
output stays O(1): std 1/sqrt(n_in) for projections into a block, 4/sqrt(n_in) for the two back
into the residual stream, 0.25 for the embeddings), so logits are finite but the text is noise.
The file is a regular GGUF that llama.cpp reads too (`llama_bench_command`).

Tokenizer: gpt2 byte-level BPE with the 256 byte tokens, three ChatML control tokens and a few
merges, padded to the preset's n_vocab with UNUSED tokens (the loader needs one token per
token_embd row).

Design: three modules: synthetic_presets.py the shapes and bench sizes, synthetic_plan.py each
preset's tensors (Q4_K_M types, value spreads; the per-architecture tensor rules are there),
this one the file: random blocks, the vocabulary, the GGUF keys, the atomic write. The names
callers use are re-exported here (`__all__`).
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import dequantize

from .synthetic_plan import TensorPlan, q4_k_m_type, tensor_plan, use_more_bits
from .synthetic_presets import BENCH_SIZES, PRESETS, BenchSizes, Preset, llama_bench_command, shrunk

__all__ = [
    "BENCH_SIZES",
    "MERGES",
    "PRESETS",
    "BenchSizes",
    "Preset",
    "TensorPlan",
    "default_dir",
    "ensure_synthetic",
    "llama_bench_command",
    "q4_k_m_type",
    "shrunk",
    "tensor_plan",
    "use_more_bits",
    "vocab",
    "write_synthetic",
]

FILE_TYPE_Q4_K_M = 15  # general.file_type (llama_ftype LLAMA_FTYPE_MOSTLY_Q4_K_M)
CHUNK_BYTES = 32 << 20  # random block bytes generated and written at a time

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
