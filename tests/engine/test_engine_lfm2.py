"""lfm2 (LFM2 / LFM2.5): loading as llama.cpp reads the file, the short-convolution state kept
as one row per position (so a slot rewinds, copies and snapshots exactly like full KV), and
what storing those rows in f16 costs against the float64 reference.

The architecture's logits against the reference and the == invariances run with the other
architectures (test_engine_reference.py, test_engine_invariance.py: gguf_fixtures.ARCHS)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_support import feed, make_pool, model_file, random_tokens
from gguf_fixtures import write_tiny_llama, write_tiny_model
from reference import ReferenceModel
from slotserve.engine_ext.errors import UnsupportedModelError
from slotserve.engine_ext.gguf_file import load_model_file, required_tensor_names
from slotserve.engine_ext.model_config import RopeMode

N_VOCAB = 299


@pytest.fixture(scope="module")
def path(arch_model_factory):
    return arch_model_factory("lfm2")


@pytest.fixture(scope="module")
def f32_path(arch_model_factory):
    return arch_model_factory("lfm2", weight_type="F32", tensor_types={})


def test_config_as_llama_cpp_reads_it(path):
    c = model_file(path).config
    assert c.arch == "lfm2" and c.rope_mode == RopeMode.NEOX and c.qk_norm
    assert c.conv_layers == (True, False, True)
    assert c.n_kv_heads == 2 and c.conv_len == 3  # the attention layers' count; shortconv.l_cache
    names = required_tensor_names(c)
    assert "token_embd_norm.weight" in names and "output_norm.weight" not in names
    assert "blk.0.shortconv.conv.weight" in names and "blk.0.attn_q.weight" not in names
    assert "blk.1.attn_q_norm.weight" in names and "blk.1.shortconv.in_proj.weight" not in names


def test_rejects_what_it_does_not_run(tmp_path, monkeypatch):
    import gguf_fixtures_llama

    original = gguf_fixtures_llama._add

    def conv_in_f16(w, name, values, type_name):
        return original(w, name, values, "F16" if name.endswith("shortconv.conv.weight") else type_name)

    monkeypatch.setattr(gguf_fixtures_llama, "_add", conv_in_f16)
    f16_conv = write_tiny_model(tmp_path / "f16conv.gguf", "lfm2")
    monkeypatch.setattr(gguf_fixtures_llama, "_add", original)
    with pytest.raises(UnsupportedModelError, match="shortconv.conv.weight.*only F32"):
        load_model_file(f16_conv)
    with pytest.raises(UnsupportedModelError, match="sliding_window"):
        load_model_file(write_tiny_model(tmp_path / "swa.gguf", "lfm2", sliding_window=8))
    with pytest.raises(UnsupportedModelError, match="l_cache 20"):
        load_model_file(write_tiny_model(tmp_path / "long.gguf", "lfm2", conv_len=20))


def test_pool_keeps_conv_rows_per_position(path):
    """Bytes: per attention layer 2 x kv_dim, per conv layer dim, per position and slot; a slot
    is rewindable to any length; snapshot_nbytes is the snapshot's exact size; the fingerprint
    names the conv layout."""
    c = model_file(path).config
    n_conv = sum(c.conv_layers)
    for kv_dtype, elt in (("f16", 2), ("f32", 4)):
        pool = make_pool(path, 3, 160, kv_dtype=kv_dtype)
        per_pos = ((c.n_layers - n_conv) * 2 * c.kv_dim + n_conv * c.dim) * elt
        assert pool.kv_bytes == 3 * 160 * per_pos
        assert "/conv_rows=3" in pool.fingerprint
        tokens = random_tokens(100, N_VOCAB, seed=3)
        feed(pool, 0, tokens)
        assert pool.min_truncate_len(0) == 0 and pool.restored_min_truncate_len(100) == 0
        for n in (0, 1, 2, 3, 17, 100):
            snap = pool.snapshot(0, n)
            assert len(snap) == pool.snapshot_nbytes(n)
        pool.truncate(0, 2)  # below the conv's reach: the rows of positions 0, 1 stay
        assert pool.slot_len(0) == 2
        pool.check_integrity()


def test_snapshot_refused_across_layouts(path, tiny_model_path):
    lfm2 = make_pool(path, 1, 64)
    llama = make_pool(tiny_model_path, 1, 64)
    feed(lfm2, 0, random_tokens(10, N_VOCAB, seed=1))
    with pytest.raises(ValueError, match="fingerprint"):
        llama.restore(0, lfm2.snapshot(0, 10))
    f32 = make_pool(path, 1, 64, kv_dtype="f32")
    with pytest.raises(ValueError, match="fingerprint"):
        f32.restore(0, lfm2.snapshot(0, 10))


def test_rewind_inside_the_conv_reach_equals_cold(path):
    """Cut back to every length around the conv's 3 taps and refeed: exactly the cold logits
    (the conv reads the stored rows of the 2 positions before the cut)."""
    tokens = random_tokens(40, N_VOCAB, seed=8)
    cold = make_pool(path, 1, 64)
    want = feed(cold, 0, tokens)
    pool = make_pool(path, 1, 64)
    feed(pool, 0, random_tokens(5, N_VOCAB, seed=9))
    for cut in (0, 1, 2, 3, 4, 20, 39):
        pool.truncate(0, 0)
        feed(pool, 0, tokens[:cut] if cut else tokens[:1])
        feed(pool, 0, random_tokens(7, N_VOCAB, seed=cut))  # other tokens past the cut
        pool.truncate(0, max(cut, 1))
        got = feed(pool, 0, tokens[max(cut, 1) :])
        assert np.array_equal(got, want), f"cut {cut}"


def test_f16_conv_rows_against_f32_and_the_reference(f32_path):
    """The decision to store conv inputs in the KV dtype (f16 by default) while llama.cpp keeps
    its conv state in f32: with float weights, the f16 pool (conv rows and attention KV in f16)
    stays within 0.02 of the float64 reference, the f16-KV tolerance of the other
    architectures (test_engine_reference.py FLOAT_F16KV_ATOL; measured 0.005), and picks the
    same greedy token at every position; the f32 pool is within float rounding."""
    tokens = random_tokens(48, N_VOCAB, seed=17)
    exact = ReferenceModel(f32_path).logits(tokens)
    got = {}
    for kv_dtype in ("f16", "f32"):
        pool = make_pool(f32_path, 1, 64, kv_dtype=kv_dtype)
        got[kv_dtype] = np.array(
            [pool.forward([(0, tokens[:1], 0, True)])[0]]
            + [pool.forward([(0, tokens[p : p + 1], p, True)])[0] for p in range(1, len(tokens))]
        )
    f32_err = np.abs(got["f32"] - exact).max()
    f16_err = np.abs(got["f16"] - exact).max()
    assert f32_err <= 1e-3, f32_err
    assert f16_err <= 0.02, f16_err
    assert f16_err > f32_err  # the rows really are rounded
    assert np.array_equal(got["f16"].argmax(axis=1), exact.argmax(axis=1))


def test_fault_after_the_conv_rows_are_written_taints_only_its_slot(path):
    """The test fault fires after layer 0 (a convolution) stored its rows for the whole step:
    the faulted slot is emptied; the batch mate's rows past its length were written too, but it
    is back to its length and continues exactly as a cold run."""
    from slotserve.engine_ext.pool import ComputeError

    tokens = random_tokens(40, N_VOCAB, seed=4)
    pool = make_pool(path, 2, 64)
    feed(pool, 0, tokens[:20])
    feed(pool, 1, tokens[:10])
    pool._inject_fault(0)
    with pytest.raises(ComputeError) as info:
        pool.forward([(0, tokens[20:25], 20, True), (1, tokens[10:15], 10, True)])
    assert info.value.tainted == (0,)
    assert pool.slot_len(0) == 0 and pool.slot_len(1) == 10
    cold = make_pool(path, 1, 64)
    assert np.array_equal(feed(pool, 1, tokens[10:30]), feed(cold, 0, tokens[:30]))
    pool.check_integrity()


def test_rejects_per_layer_kv_heads_it_cannot_run(tmp_path, monkeypatch):
    """head_count_kv per layer: only lfm2 reads an array; its attention layers must agree, and
    a file of convolutions only is refused."""
    import gguf

    with pytest.raises(UnsupportedModelError, match="without any attention layer"):
        load_model_file(write_tiny_model(tmp_path / "allconv.gguf", "lfm2", conv_layers=(0, 1, 2)))
    original = gguf.GGUFWriter.add_array

    def uneven(self, key, values):
        if key.endswith("head_count_kv"):
            values = [v if i != 3 else 1 for i, v in enumerate(values)]
        return original(self, key, values)

    monkeypatch.setattr(gguf.GGUFWriter, "add_array", uneven)
    path = write_tiny_model(tmp_path / "uneven.gguf", "lfm2", n_layers=4, conv_layers=(0, 2))
    with pytest.raises(UnsupportedModelError, match=r"different .*head_count_kv \[1, 2\]"):
        load_model_file(path)
    monkeypatch.setattr(gguf.GGUFWriter, "add_array", original)
    monkeypatch.setattr(
        gguf.GGUFWriter,
        "add_head_count_kv",
        lambda self, n: original(self, f"{self.arch}.attention.head_count_kv", [n, n]),
    )
    with pytest.raises(UnsupportedModelError, match="per-layer llama.attention.head_count_kv"):
        load_model_file(write_tiny_llama(tmp_path / "llama.gguf"))
