"""bench/synthetic.py: real shapes at random Q4_K_M weights, for `bench engine --synthetic`.

The presets' files are 0.5-4.9 GB, so the tests write them with fewer layers and a smaller
vocabulary (every per-layer tensor keeps its real shape and type), check that the engine loads
them and computes finite logits, that the type of every tensor follows the stated llama-quantize
rule, and run the benchmark command end to end on a tiny preset.
"""

from __future__ import annotations

import argparse
import json
import re

import numpy as np
import pytest
from gguf import GGUFReader
from slotserve.bench import engine as bench_engine
from slotserve.bench import synthetic
from slotserve.bench.synthetic import PRESETS, shrunk, tensor_plan, use_more_bits
from slotserve.engine_ext import SlotPool
from slotserve.engine_ext.loader import read_model


def test_use_more_bits_is_llama_cpps_layer_choice() -> None:
    # 28 layers: n/8 = 3, 7n/8 = 24: layers 0-2, 24-27 and every third from 5
    assert [i for i in range(28) if use_more_bits(i, 28)] == [
        0,
        1,
        2,
        5,
        8,
        11,
        14,
        17,
        20,
        23,
        24,
        25,
        26,
        27,
    ]


# qwen3-moe-tiny has no released file: this plan's own total
TINY_MOE_BYTES = 5.14e6


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_q4_k_m_types_follow_the_rule(name: str) -> None:
    p = PRESETS[name]
    plan = {t.name: t for t in tensor_plan(p)}
    fallback = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}
    attention = p.attention_layers()
    for t in plan.values():
        if t.rows == 1 or t.name.endswith(
            ("shortconv.conv.weight", "ssm_conv1d.weight", "ffn_gate_inp.weight", ".ssm_a", ".ssm_d")
        ):  # norms, conv kernels, MoE routers, Mamba2's A and D
            assert t.type_name == "F32", t.name
            continue
        layer = int(t.name.split(".")[1]) if t.name.startswith("blk.") else -1
        # llama-quantize counts attn_v tensors: lfm2 has them on its attention layers only
        index = (
            (attention.index(layer), len(attention))
            if t.name.endswith("attn_v.weight")
            else (layer, p.n_layers)
        )
        more_bits = t.name.endswith(
            ("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight")
        ) and use_more_bits(*index)
        is_output = t.name == "output.weight" or (p.tied and t.name == "token_embd.weight")
        wanted = "Q6_K" if more_bits or is_output else "Q4_K"
        if t.name.endswith("attn_qkv.weight"):  # qwen35's DeltaNet input projection
            wanted = "Q5_K"
        assert t.type_name == (wanted if t.cols % 256 == 0 else fallback[wanted]), t.name
    # the file sizes llama-quantize's Q4_K_M gives these models, within a few percent
    total = sum(t.nbytes for t in plan.values())
    # (qwen3.5-0.8b: this plan's own total, 0.516 GB, half of it the Q6_K embeddings; not an
    # outside figure)
    expected = {
        "qwen2-0.5b": 0.40e9,
        "qwen2-1.5b": 0.99e9,
        "llama3-8b": 4.92e9,
        "lfm2-350m": 0.229e9,
        "qwen3.5-0.8b": 0.516e9,
        "granite-4.0-h-350m": 0.213e9,  # granite-4.0-h-350m-Q4_K_M.gguf: 213 MB
        "qwen3-30b-a3b": 18.6e9,  # Qwen3-30B-A3B-Q4_K_M.gguf: 18.6 GB
        "qwen3-moe-tiny": TINY_MOE_BYTES,
    }[name]
    assert abs(total / expected - 1) < 0.05, total
    if name == "qwen2-0.5b":  # rows of 896 fall back; ffn_down (rows of 4864) does not
        assert plan["blk.0.attn_q.weight"].type_name == "Q5_0"
        assert plan["blk.0.attn_v.weight"].type_name == "Q8_0"
        assert plan["blk.0.ffn_down.weight"].type_name == "Q6_K"
        assert plan["blk.3.ffn_down.weight"].type_name == "Q4_K"
        assert plan["token_embd.weight"].type_name == "Q8_0"
    if name == "llama3-8b":  # untied: token_embd is a plain Q4_K weight, output Q6_K
        assert plan["token_embd.weight"].type_name == "Q4_K"
        assert plan["output.weight"].type_name == "Q6_K"
        assert "rope_freqs.weight" in plan
    if name == "lfm2-350m":  # 10 conv + 6 attention layers; attn_v's extra bit on the 3rd and 6th
        assert sum("shortconv.in_proj" in n for n in plan) == 10 and sum("attn_q." in n for n in plan) == 6
        assert [n for n in plan if n.endswith("attn_v.weight") and plan[n].type_name == "Q6_K"] == [
            "blk.8.attn_v.weight",
            "blk.14.attn_v.weight",
        ]
    if name == "granite-4.0-h-350m":  # 28 Mamba2 + 4 attention layers; attn_v's extra bit on the 3rd and 4th
        assert sum("ssm_in" in n for n in plan) == 28 and sum("attn_q." in n for n in plan) == 4
        assert plan["blk.0.ssm_in.weight"].rows == 2 * 1536 + 2 * 128 + 48
        assert [n for n in plan if n.endswith("attn_v.weight") and plan[n].type_name == "Q6_K"] == [
            "blk.17.attn_v.weight",
            "blk.27.attn_v.weight",
        ]
    if name == "qwen3.5-0.8b":  # 18 DeltaNet + 6 attention layers (3, 7, ..., 23)
        assert sum("attn_qkv" in n for n in plan) == 18 and sum("attn_q." in n for n in plan) == 6
        assert plan["blk.3.attn_q.weight"].rows == 2 * 8 * 256  # queries and gates
        assert [n for n in plan if n.endswith("attn_v.weight") and plan[n].type_name == "Q6_K"] == [
            "blk.11.attn_v.weight",
            "blk.23.attn_v.weight",
        ]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_engine_loads_the_file_and_logits_are_finite(tmp_path, name: str) -> None:
    # lfm2: 3 layers reach its first attention layer (2); qwen35: 4 reach its first (3)
    p = PRESETS[name]
    p = shrunk(p, n_layers=4 if p.deltanet else 3 if p.conv_layers else 2, n_vocab=600)
    if p.mamba:  # granitehybrid: Mamba2, then attention
        p = shrunk(p, attn_layers=(1,))
    if p.moe:  # 8 experts of 256, 2 per token: the file stays small
        p = shrunk(p, moe=(8, 2, 256))
    path = synthetic.write_synthetic(tmp_path / "m.gguf", p)
    reader = GGUFReader(path)
    written = {t.name: t.tensor_type.name for t in reader.tensors}
    assert written == {t.name: t.type_name for t in tensor_plan(p)}
    model, tokenizer = read_model(path)
    c = model.config
    assert (c.arch, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim) == (
        p.arch,
        p.dim,
        p.n_heads,
        p.n_kv_heads,
        p.head_dim,
        p.moe[2] if p.moe else p.ffn_dim,  # MoE: the experts' width (no shared expert)
    )
    assert (c.tied_output, c.rope_freqs, c.qkv_bias, c.n_vocab) == (
        p.tied,
        p.rope_freqs,
        p.arch == "qwen2",
        600,
    )
    pool = SlotPool(model, 1, 64, threads=1)
    prompt = np.array(tokenizer.encode("The capital of France is"), np.int32)
    logits = pool.forward([(0, prompt, 0, True)])[0]
    assert logits.shape == (600,) and np.isfinite(logits).all()
    assert 0.5 < float(logits.std()) < 100.0  # random weights at the stated spread: not flat, not blown up


def test_bench_engine_synthetic_writes_keeps_and_reuses_the_file(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(
        PRESETS, "tiny", shrunk(PRESETS["qwen2-1.5b"], n_layers=1, dim=256, ffn_dim=512, n_vocab=400)
    )
    monkeypatch.setitem(synthetic.BENCH_SIZES, "tiny", synthetic.BenchSizes((16,), 4, 8))
    parser = argparse.ArgumentParser()
    bench_engine.configure(parser)
    argv = ["--synthetic", "tiny", "--synthetic-dir", str(tmp_path), "--threads", "1", "--reps", "1"]
    assert bench_engine.run(parser.parse_args(argv)) == 0
    out = capsys.readouterr().out
    path = tmp_path / "synthetic-tiny-Q4_K_M.gguf"
    assert path.is_file() and f"wrote {path}" in out
    assert f"llama-bench -m {path} -t 1 -p 16 -n 4 -d 0,8" in out
    assert "pp16" in out and "tg4_d8" in out and "tg4_x4" in out
    assert " | loaded in " in out and "peak RSS " in out
    mtime = path.stat().st_mtime_ns
    assert bench_engine.run(parser.parse_args([*argv, "--json", "--step-ms"])) == 0
    info = json.loads(capsys.readouterr().out)
    assert path.stat().st_mtime_ns == mtime  # reused, not rewritten
    assert info["synthetic"] == "tiny" and info["validation"]["exact_chunking_and_batching"]
    assert set(info["results"]["threads=1"]) == {"pp16", "tg4", "tg4_d8", "tg4_x4", "step_ms"}
    step_ms = info["results"]["threads=1"]["step_ms"]
    assert set(step_ms) == {"1", "2", "4"} and all(v > 0 for v in step_ms.values())  # a 4-slot pool
    assert "numpy" not in info
    assert info["load_s"] >= 0 and info["peak_rss_gib"] > 0
    with pytest.raises(SystemExit, match="unknown preset"):
        bench_engine.run(parser.parse_args(["--synthetic", "nope", "--synthetic-dir", str(tmp_path)]))


def test_bench_engine_depth_measures_prefill_and_decode_after_n_tokens(tmp_path, monkeypatch, capsys) -> None:
    """--depth N (as llama-bench -d N): pp512_dN and tgS_dN for each N, nothing else; --kv-type
    reaches the pool (q8_0 KV is about half of f16's bytes a slot)."""
    monkeypatch.setitem(
        PRESETS, "tiny", shrunk(PRESETS["qwen2-1.5b"], n_layers=1, dim=256, ffn_dim=512, n_vocab=400)
    )
    monkeypatch.setitem(synthetic.BENCH_SIZES, "tiny", synthetic.BenchSizes((16,), 4, 8))
    parser = argparse.ArgumentParser()
    bench_engine.configure(parser)
    argv = [
        "--synthetic",
        "tiny",
        "--synthetic-dir",
        str(tmp_path),
        "--threads",
        "1",
        "--reps",
        "1",
        "--json",
    ]
    sizes = {}
    for kv in ("f16", "q8_0"):
        assert (
            bench_engine.run(parser.parse_args([*argv, "--depth", "40", "--depth", "0", "--kv-type", kv]))
            == 0
        )
        info = json.loads(capsys.readouterr().out)
        assert info["kv_type"] == kv
        results = info["results"]["threads=1"]
        assert set(results) == {"pp512_d40", "tg128_d40", "pp512_d0", "tg128_d0"}
        assert all(v > 0 for v in results.values())
        sizes[kv] = info["kv_bytes_per_slot"]
    assert 0.5 < sizes["q8_0"] / sizes["f16"] < 0.6  # 34 bytes a 32-value block against 64
    with pytest.raises(SystemExit, match="--depth"):
        bench_engine.run(parser.parse_args([*argv, "--depth", "-1"]))


def test_every_bench_engine_flag_is_in_docs_benchmarks() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md").read_text()
    parser = argparse.ArgumentParser()
    bench_engine.configure(parser)
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"]
    assert "--synthetic-dir" in flags
    for flag in flags:
        assert re.search(rf"(?<![\w-]){flag}(?![\w-])", text), (
            f"bench engine {flag} is not in docs/benchmarks.md"
        )
    for name in PRESETS:
        assert f"`{name}`" in text, f"preset {name} is not in docs/benchmarks.md"
