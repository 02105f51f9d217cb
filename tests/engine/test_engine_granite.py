"""granitehybrid (IBM Granite 4.0 H: Mamba2 layers and llama attention, the granite scales) in the
engine: its loading and its logits against the NumPy reference (tests/reference.py), experts
included. The pool contract of its recurrent slots (extend only, snapshots, copies, the rollback
ring) is test_engine_recurrent_pool.py's, shared with qwen35."""

from __future__ import annotations

import numpy as np
import pytest
from engine_support import make_pool, model_file, prefill_then_decode, random_tokens
from gguf_fixtures_granite import write_tiny_granite
from reference import ReferenceModel
from slotserve.engine_ext.errors import UnsupportedModelError
from slotserve.engine_ext.gguf_file import load_model_file

N_VOCAB = 299
KERNELS = ("scalar", "avx2")
# float weights with f32 KV round float32 against float64 only (measured <= 6.2e-6 largest on
# every variant, rope on and off); 8-bit weights also quantize every matmul input to 8-bit
# blocks (measured <= 0.27 largest, 0.042 mean, logits of mean magnitude 1.07)
FLOAT_ATOL = (1e-4, 1e-5)
BLOCK_ATOL = (0.6, 0.08)


@pytest.fixture(scope="module")
def q8(granite_model_factory):
    return granite_model_factory("Q8_0")


# -- loading ------------------------------------------------------------------------------------


def test_config_reads_layer_kinds_dimensions_and_scales(q8):
    cfg = model_file(q8).config
    assert cfg.arch == "granitehybrid" and cfg.has_recurrent_state and cfg.ssm is None
    assert cfg.recurrent_layers == (True, False, True, False, True)  # head_count_kv 0: Mamba2
    assert cfg.n_kv_heads == 2 and cfg.conv_layers == (False,) * 5
    m = cfg.mamba
    assert m is not None
    assert (m.conv, m.d_state, m.n_group, m.n_heads, m.inner, m.head_dim) == (4, 24, 2, 8, 128, 16)
    assert (m.conv_dim, m.in_proj) == (128 + 2 * 2 * 24, 128 + 224 + 8)
    assert cfg.embed_scale == 2.0 and cfg.residual_scale == 0.5 and cfg.logit_scale == 1.5
    assert cfg.attn_scale == pytest.approx(0.2) and cfg.rope is False
    assert cfg.recurrent_state_floats == 3 * 224 + 128 * 24


def test_absent_scales_mean_none(granite_model_factory):
    cfg = model_file(
        granite_model_factory(
            "F32",
            rope=True,
            scales={k: 0.0 for k in ("embedding_scale", "residual_scale", "attention.scale", "logit_scale")},
        )
    ).config
    assert (cfg.embed_scale, cfg.residual_scale, cfg.logit_scale) == (1.0, 1.0, 1.0)
    assert cfg.attn_scale == pytest.approx(16**-0.5) and cfg.rope is True


def test_what_the_engine_does_not_run_is_refused(tmp_path):
    with pytest.raises(UnsupportedModelError, match="bias"):
        load_model_file(write_tiny_granite(tmp_path / "b.gguf", extra_tensors=["blk.1.attn_q.bias"]))
    with pytest.raises(UnsupportedModelError, match="without any attention"):
        load_model_file(write_tiny_granite(tmp_path / "a.gguf", attention_layers=()))


# -- against the reference ------------------------------------------------------------------------


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize(("weight_type", "rope"), [("F32", False), ("F32", True), ("Q8_0", False)])
def test_prefill_and_decode_match_reference(granite_model_factory, weight_type, rope, kernels):
    path = granite_model_factory(weight_type, rope=rope)
    toks = random_tokens(40, N_VOCAB, seed=11)
    want = ReferenceModel(path).logits(toks)[29:]
    pool = make_pool(path, 2, 64, kv_dtype="f32", kernels=kernels)
    rows = prefill_then_decode(pool, 1, toks, 30)
    diff = np.abs(rows - want)
    max_atol, mean_atol = FLOAT_ATOL if weight_type == "F32" else BLOCK_ATOL
    assert diff.max() <= max_atol and diff.mean() <= mean_atol, (diff.max(), diff.mean())
    if weight_type == "F32":  # greedy picks the reference's token wherever it is clear
        top2 = np.sort(want, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 2 * max_atol
        assert clear.sum() >= 8
        assert np.array_equal(rows[clear].argmax(axis=1), want[clear].argmax(axis=1))


def test_rope_changes_the_logits(granite_model_factory):
    """rope.scaling.finetuned switches rotation on: the same weights give other logits (so the
    reference test above tests both paths)."""
    toks = random_tokens(20, N_VOCAB, seed=3)
    a = make_pool(granite_model_factory("F32"), 1, 32, kv_dtype="f32").forward([(0, toks, 0, True)])[0]
    b = make_pool(granite_model_factory("F32", rope=True), 1, 32, kv_dtype="f32").forward(
        [(0, toks, 0, True)]
    )[0]
    assert np.abs(a - b).max() > 1e-3


def test_other_shapes_untied_and_unscaled_match_reference(granite_model_factory):
    """One group, a state of 16 (no scan tail), 3 taps, own output matrix, no scale keys."""
    path = granite_model_factory(
        "F32", n_group=1, d_state=16, conv=3, tied=False, n_layers=4, attention_layers=(2,),
        scales={"embedding_scale": 0.0, "residual_scale": 0.0, "attention.scale": 0.0, "logit_scale": 0.0},
    )  # fmt: skip
    toks = random_tokens(24, N_VOCAB, seed=4)
    want = ReferenceModel(path).logits(toks)[-1]
    got = make_pool(path, 1, 32, kv_dtype="f32").forward([(0, toks, 0, True)])[0]
    assert np.abs(got - want).max() <= FLOAT_ATOL[0]


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("shared_ffn", [96, 0])
def test_experts_match_reference(granite_model_factory, kernels, shared_ffn):
    """Granite 4.0 H Tiny's FFN: 4 experts of ffn_dim (two of them tie on every token), 2 per
    token renormalised, and a shared expert added without a gate (or none)."""
    path = granite_model_factory("F32", n_expert=4, n_expert_used=2, shared_ffn=shared_ffn)
    cfg = model_file(path).config
    assert cfg.moe is not None and not cfg.moe.shared_gate and cfg.moe.norm_weights
    assert (cfg.moe.n_expert, cfg.moe.n_expert_used, cfg.moe.expert_ffn, cfg.moe.shared_ffn) == (
        4,
        2,
        128,
        shared_ffn,
    )
    assert cfg.ffn_dim == (shared_ffn or 128)
    toks = random_tokens(30, N_VOCAB, seed=5)
    want = ReferenceModel(path).logits(toks)[19:]
    pool = make_pool(path, 1, 64, kv_dtype="f32", kernels=kernels)
    diff = np.abs(prefill_then_decode(pool, 0, toks, 20) - want)
    assert diff.max() <= FLOAT_ATOL[0], diff.max()


def test_f16_kv_stays_within_the_f16_tolerance(granite_model_factory):
    path = granite_model_factory("F32")
    toks = random_tokens(40, N_VOCAB, seed=12)
    want = ReferenceModel(path).logits(toks)[29:]
    pool = make_pool(path, 1, 64)
    assert pool.kv_dtype == "f16"
    diff = np.abs(prefill_then_decode(pool, 0, toks, 30) - want)
    assert diff.max() <= 0.02 and diff.mean() <= 0.003, (diff.max(), diff.mean())
