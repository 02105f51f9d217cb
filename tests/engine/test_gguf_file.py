"""engine_ext.gguf_file: config, tensor table, zero-copy views and load-time errors."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize
from gguf_fixtures import (
    WEIGHT_TYPES,
    write_tiny_llama,
    write_tiny_model,
    write_unsupported_type,
    write_wrong_arch,
)
from slotserve.engine_ext.errors import UnsupportedModelError
from slotserve.engine_ext.gguf_file import SUPPORTED_TYPES, load_model_file, required_tensor_names
from slotserve.engine_ext.model_config import Activation, RopeMode


def test_supported_types_are_the_engine_types():
    names = {GGMLQuantizationType(t).name for t in SUPPORTED_TYPES}
    assert names == {
        "F32",
        "F16",
        "BF16",
        "Q4_0",
        "Q4_1",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
    }
    # every one of them has kernels: the engine decodes a row of it
    from slotserve.engine_ext import _engine

    kt = _engine.KernelTable("scalar")
    for t in SUPPORTED_TYPES:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(t)]
        k = 256 if block == 1 else 256 // block * block
        raw = np.zeros(k // block * block_bytes, np.uint8)
        assert np.array_equal(kt.dequantize_row(t, raw, k), np.zeros(k, np.float32))


@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
def test_tiny_model_config_and_tensors(tiny_model_factory, weight_type):
    mf = load_model_file(tiny_model_factory(weight_type))
    c = mf.config
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim) == (2, 64, 4, 2, 16, 128)
    assert c.n_vocab == 299 and c.tied_output and c.rope_base == 10000.0 and c.ctx_train == 2048
    assert c.rms_eps == pytest.approx(1e-5)
    assert mf.name == f"tiny-llama-{weight_type}"
    assert set(required_tensor_names(c)) <= set(mf.tensors)
    q = mf.tensor("blk.1.attn_q.weight")
    assert q.shape == (64, 64) and q.ggml_type == GGMLQuantizationType[weight_type]
    assert mf.tensor("blk.0.attn_k.weight").shape == (64, 32)
    assert mf.tensor("blk.0.ffn_down.weight").shape == (128, 64)
    assert mf.tensor("output_norm.weight").ggml_type == GGMLQuantizationType.F32
    assert mf.metadata["tokenizer.ggml.bos_token_id"] == 1
    assert len(mf.metadata["tokenizer.ggml.tokens"]) == 299


def test_tensor_data_is_a_readonly_view_of_the_file(tiny_model_path):
    mf = load_model_file(tiny_model_path)
    raw = tiny_model_path.read_bytes()
    for t in mf.tensors.values():
        assert t.data.dtype == np.uint8 and t.data.flags.c_contiguous
        assert not t.data.flags.writeable and not t.data.flags.owndata
        start = raw.find(t.data.tobytes())
        assert start >= 0
    embd = mf.tensor("token_embd.weight")
    values = dequantize(embd.data.reshape(embd.shape[1], -1), GGMLQuantizationType(embd.ggml_type))
    assert values.shape == (299, 64) and np.isfinite(values).all() and values.std() > 0.1


def test_untied_output(tiny_model_factory):
    mf = load_model_file(tiny_model_factory("Q8_0", tied=False))
    assert not mf.config.tied_output and mf.tensor("output.weight").shape == (64, 299)


def test_fingerprint_is_stable_and_distinguishes_models(tiny_model_factory, tmp_path):
    a = load_model_file(tiny_model_factory("Q8_0"))
    assert load_model_file(a.path).fingerprint == a.fingerprint
    same = write_tiny_llama(tmp_path / "same.gguf", weight_type="Q8_0")
    assert load_model_file(same).fingerprint == a.fingerprint  # same layout, same file size
    assert load_model_file(tiny_model_factory("Q4_0")).fingerprint != a.fingerprint
    assert load_model_file(tiny_model_factory("Q8_0", rope_base=500.0)).fingerprint != a.fingerprint


def test_missing_tensor_lookup_names_it(tiny_model_path):
    with pytest.raises(ValueError, match="blk.7.attn_q.weight"):
        load_model_file(tiny_model_path).tensor("blk.7.attn_q.weight")


def test_wrong_architecture_is_rejected(tmp_path):
    with pytest.raises(
        UnsupportedModelError, match=r"architecture 'gpt2'; supported: llama, qwen2, qwen3, gemma3"
    ):
        load_model_file(write_wrong_arch(tmp_path / "gpt2.gguf"))


def test_architecture_configs(tmp_path):
    """Each architecture's switches and per-layer arrays come from its own metadata prefix."""
    q2 = load_model_file(write_tiny_model(tmp_path / "q2.gguf", "qwen2")).config
    assert (q2.arch, q2.rope_mode, q2.activation, q2.qkv_bias, q2.qk_norm, q2.post_norms) == (
        "qwen2",
        RopeMode.NEOX,
        Activation.SILU,
        True,
        False,
        False,
    )
    assert q2.rope_base == 1e6 and q2.rms_eps == pytest.approx(1e-6) and q2.layer_windows == (0, 0)
    q3 = load_model_file(write_tiny_model(tmp_path / "q3.gguf", "qwen3")).config
    assert q3.qk_norm and not q3.qkv_bias and q3.head_dim == 128 and q3.q_dim == 512 != q3.dim
    assert q3.attn_scale == pytest.approx(128**-0.5)
    g = load_model_file(write_tiny_model(tmp_path / "g3.gguf", "gemma3")).config
    assert (g.activation, g.qk_norm, g.post_norms, g.n_kv_heads, g.head_dim) == (
        Activation.GELU_TANH,
        True,
        True,
        1,
        64,
    )
    assert g.embed_scale == pytest.approx(8.0)
    assert g.layer_windows == (16, 16, 16, 16, 16, 0)  # every sixth layer is global
    assert g.layer_rope_bases == (1e4,) * 5 + (1e6,)
    l3 = load_model_file(write_tiny_model(tmp_path / "l3.gguf", "llama3")).config
    assert (
        l3.rope_freqs and l3.rope_mode == RopeMode.NORMAL and "rope_freqs.weight" in required_tensor_names(l3)
    )
    assert "blk.0.attn_q.bias" in required_tensor_names(
        q2
    ) and "blk.5.post_ffw_norm.weight" in required_tensor_names(g)


def test_missing_architecture_tensor_is_rejected(tmp_path):
    """A qwen2 file without its biases is not silently run as llama."""
    import gguf_fixtures_llama

    path = tmp_path / "nobias.gguf"
    original = gguf_fixtures_llama._add
    try:
        gguf_fixtures_llama._add = lambda w, name, *a: (
            None if name.endswith("attn_k.bias") else original(w, name, *a)
        )
        write_tiny_model(path, "qwen2")
    finally:
        gguf_fixtures_llama._add = original
    with pytest.raises(ValueError, match=r"required tensors missing: blk.0.attn_k.bias"):
        load_model_file(path)


def test_unsupported_architecture_features_are_rejected(tmp_path):
    rope_freqs_on_qwen = write_tiny_model(tmp_path / "rf.gguf", "qwen2", rope_freqs=True)
    with pytest.raises(UnsupportedModelError, match="rope_freqs"):
        load_model_file(rope_freqs_on_qwen)


def test_unsupported_tensor_type_names_tensor_and_type(tmp_path):
    path = write_unsupported_type(tmp_path / "mxfp4.gguf", tensor="blk.1.ffn_down.weight", type_name="MXFP4")
    with pytest.raises(
        UnsupportedModelError, match=r"'blk.1.ffn_down.weight' has type MXFP4.*supported: .*Q4_K"
    ) as e:
        load_model_file(path)
    assert "\n" not in str(e.value)


def test_non_gguf_and_missing_files_are_rejected(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"definitely not a gguf file" * 10)
    with pytest.raises(ValueError, match="not a readable GGUF"):
        load_model_file(junk)
    with pytest.raises(ValueError, match="no such model file"):
        load_model_file(tmp_path / "absent.gguf")


def test_truncated_file_is_rejected(tiny_model_path, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_model_path.read_bytes()[:-1000])
    with pytest.raises(ValueError):
        load_model_file(cut)


def test_shape_inconsistent_with_metadata_is_rejected(tmp_path):
    # ffn_dim metadata says 128; write a file whose metadata disagrees with its tensors.
    import gguf_fixtures_llama

    path = tmp_path / "bad_shape.gguf"
    original = gguf_fixtures_llama.GGUFWriter.add_feed_forward_length
    try:
        gguf_fixtures_llama.GGUFWriter.add_feed_forward_length = lambda self, n: original(self, 96)
        write_tiny_llama(path)
    finally:
        gguf_fixtures_llama.GGUFWriter.add_feed_forward_length = original
    with pytest.raises(
        ValueError, match=r"'blk.0.ffn_gate.weight' has shape \(64, 128\), expected \(64, 96\)"
    ):
        load_model_file(path)


@pytest.mark.real_model
def test_real_model_config(real_model_file):
    mf = real_model_file
    c = mf.config
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.n_vocab) == (
        30,
        576,
        9,
        3,
        64,
        1536,
        49152,
    )
    assert c.rope_base == 100000.0 and c.tied_output
    assert mf.tensor("token_embd.weight").ggml_type == GGMLQuantizationType.Q8_0
    assert mf.tensor("blk.0.attn_q.weight").ggml_type == GGMLQuantizationType.Q4_1
    assert mf.metadata["tokenizer.ggml.eos_token_id"] == 2


def test_models_doc_lists_exactly_the_supported_types():
    """docs/models.md's tensor type table names every supported type and no other."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    section = doc.split("## Tensor types", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")]
    listed = {name for name in rows if name not in ("type",) and not name.startswith("-")}
    assert listed == {GGMLQuantizationType(t).name for t in SUPPORTED_TYPES}


def test_models_doc_lists_exactly_the_supported_architectures():
    """docs/models.md's architecture table names every architecture the loader accepts."""
    from pathlib import Path

    from slotserve.engine_ext.model_config import ARCHITECTURES

    doc = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    section = doc.split("## Architectures", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1].strip().strip("`") for line in section.splitlines() if line.startswith("| ")]
    assert {name for name in rows if name != "architecture"} == set(ARCHITECTURES)
