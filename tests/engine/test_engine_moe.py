"""Mixture-of-experts models (qwen3moe, qwen2moe, olmoe): loading as llama.cpp reads the keys and the
3-D expert tensors, the routing tie the fixtures carry, and the pool contract, which a MoE FFN
leaves exactly as a dense model of the same attention shape has it.

The logits against the NumPy reference and the == invariances (chunking, batching, threads,
copy, restore) run with the other architectures (test_engine_reference.py,
test_engine_invariance.py: gguf_fixtures.ARCHS)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_support import feed, make_pool, model_file, random_tokens
from gguf_fixtures import write_tiny_model
from reference import ReferenceModel
from slotserve.engine_ext.errors import UnsupportedModelError
from slotserve.engine_ext.gguf_file import load_model_file, required_tensor_names
from slotserve.engine_ext.model_config import MoeConfig

N_VOCAB = 299


def test_config_as_llama_cpp_reads_it(arch_model_factory):
    c = model_file(arch_model_factory("qwen3moe")).config
    assert c.moe == MoeConfig(n_expert=4, n_expert_used=2, expert_ffn=256, norm_weights=True, shared_ffn=0)
    assert c.qk_norm and not c.qkv_bias and c.ffn_dim == 256
    names = required_tensor_names(c)
    assert "blk.1.ffn_gate_exps.weight" in names and "blk.1.ffn_gate_inp.weight" in names
    assert "blk.1.ffn_gate.weight" not in names and "blk.1.ffn_gate_shexp.weight" not in names
    c = model_file(arch_model_factory("qwen2moe")).config
    assert c.moe == MoeConfig(n_expert=4, n_expert_used=2, expert_ffn=128, norm_weights=False, shared_ffn=256)
    assert c.qkv_bias and not c.qk_norm and c.ffn_dim == 256  # the shared expert's width
    names = required_tensor_names(c)
    assert {"blk.0.ffn_gate_inp_shexp.weight", "blk.0.ffn_down_shexp.weight"} <= set(names)
    # olmoe: experts of feed_forward_length (no expert key in the file), q/k norms over the
    # whole projection (4 heads of 64), no renormalisation
    m = model_file(arch_model_factory("olmoe"))
    c = m.config
    assert c.moe == MoeConfig(n_expert=4, n_expert_used=2, expert_ffn=256, norm_weights=False, shared_ffn=0)
    assert c.qk_norm and c.qk_norm_full and not c.qkv_bias and not c.tied_output
    assert "olmoe.expert_feed_forward_length" not in m.metadata
    shape = {
        name: m.tensor(f"blk.0.{name}.weight").shape
        for name in ("attn_q_norm", "attn_k_norm", "ffn_gate_exps")
    }
    assert shape == {"attn_q_norm": (256,), "attn_k_norm": (256,), "ffn_gate_exps": (256, 256, 4)}


def test_rejects_what_it_does_not_run(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="expert_used_count in 1..expert_count"):
        load_model_file(write_tiny_model(tmp_path / "k.gguf", "qwen3moe", n_expert=2, n_expert_used=3))
    import gguf

    monkeypatch.setattr(
        gguf.GGUFWriter, "add_expert_feed_forward_length", lambda self, n: self.add_expert_weights_scale(2.5)
    )
    with pytest.raises(UnsupportedModelError, match="expert_weights_scale"):
        load_model_file(write_tiny_model(tmp_path / "scale.gguf", "qwen3moe"))
    monkeypatch.undo()
    # experts on an architecture that has none in this engine
    monkeypatch.setattr(
        gguf.GGUFWriter,
        "add_head_count",
        lambda self, n: (self.add_expert_count(8), self.add_uint32(f"{self.arch}.attention.head_count", n)),
    )
    with pytest.raises(UnsupportedModelError, match="mixture-of-experts qwen3"):
        load_model_file(write_tiny_model(tmp_path / "dense.gguf", "qwen3"))


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe", "olmoe"])
def test_the_fixture_routes_through_ties(arch_model_factory, arch):
    """The fixtures' last two router rows are equal: on some rows those experts tie for the last
    chosen place, where llama.cpp's order is the sort's and ours the lower index. The reference
    breaks the tie the same way, so test_architectures_match_reference covers it: this makes
    sure the tie is really met at the cut (else that test would not see it)."""
    path = arch_model_factory(arch, weight_type="F32", tensor_types={})
    ref = ReferenceModel(path)
    tokens = random_tokens(40, N_VOCAB, seed=13)  # test_architectures_match_reference's tokens
    inputs: list[np.ndarray] = []  # each layer's FFN input, as the reference computes it
    moe = ref._moe
    ref._moe = lambda h, w: (inputs.append(h), moe(h, w))[1]  # type: ignore[method-assign]
    want = ref.logits(tokens)
    k, at_cut = ref.n_expert_used, 0
    for i, h in enumerate(inputs):
        logits = h @ ref.w[f"blk.{i}.ffn_gate_inp.weight"].T
        assert np.array_equal(logits[:, -1], logits[:, -2])
        order = np.argsort(-logits, axis=1, kind="stable")
        at_cut += sum(set(order[r, k - 1 : k + 1]) == {2, 3} for r in range(len(tokens)))
    assert at_cut > 0
    # and the engine, on the same file, matches the reference on those rows
    pool = make_pool(path, 1, 64, kv_dtype="f32")
    got = np.array([pool.forward([(0, tokens[p : p + 1], p, True)])[0] for p in range(len(tokens))])
    assert np.abs(got - want).max() <= 1e-3


def test_pool_contract_is_a_dense_models(arch_model_factory):
    """MoE changes nothing in the pool: no recurrent state, any length can be cut back to
    (min_truncate_len 0), and the KV and snapshot bytes of a dense qwen3 of the same attention
    shape (ARCH_MODELS["qwen3"]: 2 layers, 4 heads, 2 kv heads of 128, dim 256)."""
    moe, dense = arch_model_factory("qwen3moe"), arch_model_factory("qwen3")
    for kv_dtype in ("f16", "f32"):
        a, b = make_pool(moe, 2, 96, kv_dtype=kv_dtype), make_pool(dense, 2, 96, kv_dtype=kv_dtype)
        assert a.kv_bytes == b.kv_bytes and a.state_bytes == 0
        feed(a, 0, random_tokens(50, N_VOCAB, seed=2))
        assert a.min_truncate_len(0) == 0 and a.restored_min_truncate_len(50) == 0
        for n in (0, 1, 7, 8, 50):
            assert a.snapshot_nbytes(n) == b.snapshot_nbytes(n) == len(a.snapshot(0, n))
        a.check_integrity()


def test_a_step_runs_only_the_chosen_experts_once_each(tmp_path):
    """Decode reads only the chosen experts' weights, and a batched step (a prefill chunk, or
    several slots decoding) runs each chosen expert once for all of its rows: the experts the
    engine ran per layer (Engine.moe_active) are exactly the distinct experts the reference
    routes the step's rows to. 16 experts, 2 per token: one row runs 2 per layer, a step of
    rows runs their union (fewer than 2 per row)."""
    path = write_tiny_model(tmp_path / "m.gguf", "qwen3moe", n_expert=16, weight_type="F32", tensor_types={})
    ref = ReferenceModel(path)
    k, n_layers = ref.n_expert_used, 2

    def routed(tokens: np.ndarray) -> list[np.ndarray]:
        """Per layer, the reference's chosen experts of every row [rows, k]."""
        inputs: list[np.ndarray] = []
        moe = ref._moe
        ref._moe = lambda h, w: (inputs.append(h), moe(h, w))[1]  # type: ignore[method-assign]
        ref.logits(tokens)
        ref._moe = moe  # type: ignore[method-assign]
        assert len(inputs) == n_layers
        return [
            np.argsort(-(h @ ref.w[f"blk.{i}.ffn_gate_inp.weight"].T), axis=1, kind="stable")[:, :k]
            for i, h in enumerate(inputs)
        ]

    tokens = random_tokens(12, N_VOCAB, seed=5)
    pool = make_pool(path, 3, 64, kv_dtype="f32")
    prefix = routed(tokens[:9])
    pool.forward([(0, tokens[:9], 0, True)])  # one step of 9 rows
    ran = pool._engine.moe_active()
    assert ran == [len(set(c.ravel())) for c in prefix]
    assert all(k < n < 9 * k for n in ran)  # grouped: fewer than one expert run per (row, rank)
    for s in (1, 2):
        pool.copy_prefix(0, s, 9)
    last = [routed(np.append(tokens[:9], t)) for t in tokens[9:12]]  # each slot's decode row
    pool.forward([(0, tokens[9:10], 9, True)])  # one decode row
    assert pool._engine.moe_active() == [len(set(c[-1])) for c in last[0]] == [k] * n_layers
    pool.truncate(0, 9)
    pool.forward([(s, tokens[9 + s : 10 + s], 9, True) for s in range(3)])  # 3 slots, one step
    union = [len({int(x) for r in range(3) for x in last[r][i][-1]}) for i in range(n_layers)]
    assert pool._engine.moe_active() == union
