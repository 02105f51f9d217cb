"""The avx2 variant's prefill tiles (arch/x86_avx2_tiles.c) engage where they claim to: a matmul
of whole 16-row tiles on Q5_0, Q5_1, Q4_K, Q5_K or Q6_K weights read from their row groups runs
its whole groups on the tiles (counted by `_engine.avx2_tile_pairs`), and nothing else does
(fewer rows, weights without row groups, the types left on the row-group kernels). Their
results are held to == elsewhere (test_kernels_kquants.py: the vnni variant, row independence);
here a tiled call also equals its rows computed one at a time on the row-group kernels."""

from __future__ import annotations

import numpy as np
import pytest
from engine_support import make_pool, random_tokens
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from gguf_fixtures import random_blocks, write_tiny_llama
from kernel_support import needs_avx2
from slotserve.engine_ext import _engine

pytestmark = needs_avx2

TILED = ("Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
ROW_GROUP_ONLY = ("Q4_0", "Q4_1", "Q8_0")  # x86_gemm_x8.h's row groups: the tiles measured slower
TILE_ROWS = 16


def tid(type_name: str) -> int:
    return int(GGMLQuantizationType[type_name])


def operands(type_name: str, n_out: int, n_rows: int) -> tuple[np.ndarray, np.ndarray, int]:
    k = 512 if type_name.endswith("_K") else 96
    rng = np.random.default_rng(n_out)
    if type_name in ROW_GROUP_ONLY:  # types random_blocks does not write: gguf's quantizer
        blocks = quantize(rng.standard_normal((n_out, k)).astype(np.float32), GGMLQuantizationType[type_name])
    else:
        blocks = random_blocks(type_name, n_out, k, rng)
    raw = np.ascontiguousarray(blocks).view(np.uint8).reshape(-1)
    x = np.random.default_rng(n_rows).standard_normal((n_rows, k)).astype(np.float32)
    return raw, x, k


def tile_pairs(kt: _engine.KernelTable, type_name: str, n_out: int, n_rows: int, **kwargs: object) -> int:
    """Tile pairs one avx2 gemm call added (other threads of this process run no engine here)."""
    raw, x, _ = operands(type_name, n_out, n_rows)
    q = kt.quantize_q8a(x)
    before = _engine.avx2_tile_pairs(tid(type_name))
    kt.gemm(tid(type_name), raw, n_out, x, quantized=q, **kwargs)
    return _engine.avx2_tile_pairs(tid(type_name)) - before


@pytest.mark.parametrize("type_name", TILED)
def test_whole_tiles_run_on_the_tiles(type_name):
    """37 rows x 43 outputs: two whole tiles (32 rows) x five whole groups (40 outputs) on the
    tiles; the 5 rows past them and the 3 outputs past the groups elsewhere."""
    kt = _engine.KernelTable("avx2")
    assert tile_pairs(kt, type_name, 43, 37) == 32 * 40
    assert tile_pairs(kt, type_name, 43, 37, o0=8, o1=40) == 32 * 32  # a range of whole groups
    assert tile_pairs(kt, type_name, 43, TILE_ROWS - 1) == 0  # decode-sized calls stay on row groups
    assert tile_pairs(kt, type_name, 43, 37, grouped=False) == 0  # file rows: no x8 layout to tile


@pytest.mark.parametrize("type_name", TILED)
def test_tiled_call_equals_rows_alone(type_name):
    kt = _engine.KernelTable("avx2")
    raw, x, _ = operands(type_name, 43, 37)
    q = kt.quantize_q8a(x)
    got = kt.gemm(tid(type_name), raw, 43, x, quantized=q)
    for r in range(37):
        one = tuple(np.ascontiguousarray(part[r : r + 1]) for part in q)
        alone = kt.gemm(tid(type_name), raw, 43, np.ascontiguousarray(x[r : r + 1]), quantized=one)
        assert np.array_equal(got[r], alone[0]), f"{type_name} row {r}"


@pytest.mark.parametrize("type_name", ROW_GROUP_ONLY)
def test_untiled_types_do_not_count(type_name):
    kt = _engine.KernelTable("avx2")
    assert tile_pairs(kt, type_name, 43, 37) == 0


@pytest.mark.parametrize("variant", ["scalar", "avx512vnni"])
def test_other_variants_do_not_run_the_avx2_tiles(variant):
    if variant == "avx512vnni" and not _engine.avx512vnni_supported():
        pytest.skip("this CPU has no AVX512-VNNI")
    assert tile_pairs(_engine.KernelTable(variant), "Q5_0", 43, 37) == 0


def test_engine_prefill_runs_the_tiles(tmp_path):
    """A prefill on the avx2 variant runs its Q5_0, Q4_K and Q6_K projections on the tiles (the
    engine reaches them through the kernel table, as a KernelTable does), a decode step does not."""
    path = write_tiny_llama(
        tmp_path / "mix.gguf",
        weight_type="Q4_K",
        dim=256,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=512,
        tensor_types={"attn_q": "Q5_0", "ffn_down": "Q6_K", "token_embd": "Q8_0"},
    )
    pool = make_pool(path, num_slots=1, ctx_len=128, threads=2, kernels="avx2")
    types = ("Q5_0", "Q4_K", "Q6_K")
    before = {t: _engine.avx2_tile_pairs(tid(t)) for t in types}
    pool.forward([(0, random_tokens(48, pool.n_vocab), 0, True)])
    after = {t: _engine.avx2_tile_pairs(tid(t)) for t in types}
    for t in types:
        assert after[t] > before[t], f"{t}: the prefill ran no tile"
    pool.forward([(0, random_tokens(1, pool.n_vocab, seed=1), 48, True)])
    assert {t: _engine.avx2_tile_pairs(tid(t)) for t in types} == after
