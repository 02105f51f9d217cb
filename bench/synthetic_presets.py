"""The synthetic models' presets: real models' shapes (`Preset`: their GGUF metadata, without
weights; `PRESETS` by name, `shrunk` for smaller copies in tests) and what `bench engine
--synthetic NAME` times on each (`BENCH_SIZES`, and `llama_bench_command`, llama.cpp's benchmark
of the same file). The tensors of a preset are synthetic_plan.py's, the file synthetic.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path


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
