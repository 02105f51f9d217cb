"""Invariances of the slot pool, on every architecture: however a slot's tokens were fed (chunks, batch mates,
rewinds, copies, snapshots, internal steps, threads), its logits are bit-identical to a cold
single-chunk run, so greedy tokens are identical too.

qwen35 (Gated DeltaNet) and granitehybrid (Mamba2): a recurrent state per slot, extend only; they run every test with a
rollback ring of ROLLBACK states, deep enough for each rewind here (and the random schedules
keep their rewinds within it), so its rewinds go through the ring.

Exact equality is the design (kernels.h NOTE: every row is computed by the same float
operations whatever it is batched with), not luck: these tests compare with `==`.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_support import feed, greedy, model_file, random_tokens
from engine_support import make_pool as _make_pool
from gguf_fixtures import ARCHS, K_DIMS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slotserve.scheduler.interface import BatchItem

N_VOCAB = 299
GREEDY_STEPS = 6
ROLLBACK = 64  # the recurrent models' rollback ring (slots are otherwise extend-only)


def make_pool(path, *args, **kwargs):
    if model_file(path).config.has_recurrent_state:
        kwargs.setdefault("rollback", ROLLBACK)
    return _make_pool(path, *args, **kwargs)


def max_rewind(path) -> int:
    return ROLLBACK if model_file(path).config.has_recurrent_state else 10**9


@pytest.fixture(
    scope="module", params=("Q4_1", "K_MIX") + ARCHS + ("qwen35", "granitehybrid", "granitehybrid-moe")
)
def path(request, tiny_model_factory, arch_model_factory, qwen35_model_factory, granite_model_factory):
    """Q4_1 (the default model's main type), a llama-quantize-style mix of K-quants, 5-bit and
    8-bit blocks (gguf_fixtures.WEIGHT_MIXES), and every other architecture's tiny model
    (gemma3's sliding window of 16 is crossed many times), qwen35's DeltaNet hybrid and
    granitehybrid's Mamba2 one (the granite scales on)."""
    if request.param == "K_MIX":
        return tiny_model_factory("K_MIX", **K_DIMS)
    if request.param == "qwen35":
        return qwen35_model_factory("Q8_0")
    if request.param == "granitehybrid":
        return granite_model_factory("Q8_0")
    if request.param == "granitehybrid-moe":  # Granite 4.0 H Tiny's FFN: experts + an ungated shared one
        return granite_model_factory("Q8_0", n_expert=4, n_expert_used=2, shared_ffn=96)
    if request.param in ARCHS:
        return arch_model_factory(request.param)
    return tiny_model_factory(request.param)


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    return random_tokens(120, N_VOCAB, seed=21)


@pytest.fixture(scope="module")
def cold(path, tokens):
    """cold(n) -> (logits after tokens[:n] fed as one chunk to a fresh slot, greedy tokens)."""
    pool = make_pool(path, 1, 160)
    cache: dict[int, tuple[np.ndarray, list[int]]] = {}

    def run(n: int) -> tuple[np.ndarray, list[int]]:
        if n not in cache:
            pool.truncate(0, 0)
            logits = feed(pool, 0, tokens[:n])
            cache[n] = (logits, greedy(pool, 0, logits, GREEDY_STEPS)[0])
        return cache[n]

    return run


def assert_same_as_cold(pool, slot, logits, cold, n):
    want_logits, want_tokens = cold(n)
    assert pool.slot_len(slot) == n
    assert np.array_equal(logits, want_logits), f"largest difference {np.abs(logits - want_logits).max()}"
    assert greedy(pool, slot, logits, GREEDY_STEPS)[0] == want_tokens


def test_one_chunk_equals_many_chunks(path, tokens, cold):
    pool = make_pool(path, 2, 160)
    logits = feed(pool, 1, tokens[:77], chunks=[1, 9, 31, 2, 34])
    assert np.array_equal(pool.record(1), tokens[:77])
    assert_same_as_cold(pool, 1, logits, cold, 77)


def test_prefill_then_decode_equals_longer_prefill(path, tokens, cold):
    pool = make_pool(path, 1, 160)
    feed(pool, 0, tokens[:50])
    logits = pool.forward([(0, tokens[50:51], 50, True)])[0]
    assert_same_as_cold(pool, 0, logits, cold, 51)


def test_batch_mates_do_not_change_a_slot(path, tokens, cold):
    pool = make_pool(path, 4, 160)
    other = random_tokens(100, N_VOCAB, seed=99)
    # slot 2 prefills alongside others' prefill chunks and decode tokens, in varying order
    pool.forward([(0, other[:40], 0, False), (2, tokens[:30], 0, False), (3, other[:1], 0, True)])
    pool.forward([(3, other[1:2], 1, True), (2, tokens[30:60], 30, False), (1, other[:70], 0, True)])
    out = pool.forward(
        [(1, other[70:71], 70, True), (0, other[40:41], 40, True), (2, tokens[60:64], 60, True)]
    )
    assert out.shape == (3, N_VOCAB)
    assert_same_as_cold(pool, 2, out[2], cold, 64)
    # and the batch mates are exactly their own cold runs too
    solo = make_pool(path, 1, 160)
    assert np.array_equal(out[1], feed(solo, 0, other[:41]))  # slot 0
    solo.truncate(0, 0)
    assert np.array_equal(out[0], feed(solo, 0, other[:71]))  # slot 1


def test_internal_steps_do_not_change_results(path, tokens, cold):
    """A forward longer than max_batch_tokens runs in several internal steps."""
    pool = make_pool(path, 3, 160, max_batch_tokens=7)
    out = pool.forward([(0, tokens[:90], 0, True), (1, tokens[:5], 0, True), (2, tokens[:64], 0, True)])
    assert_same_as_cold(pool, 0, out[0], cold, 90)
    assert_same_as_cold(pool, 1, out[1], cold, 5)
    assert_same_as_cold(pool, 2, out[2], cold, 64)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_thread_count_does_not_change_results(path, tokens, cold, threads):
    pool = make_pool(path, 1, 160, threads=threads)
    assert pool.n_threads == threads
    assert_same_as_cold(pool, 0, feed(pool, 0, tokens[:70]), cold, 70)


@pytest.mark.parametrize("kv_dtype", ["f16", "f32"])
def test_truncate_and_refeed_equals_cold(path, tokens, kv_dtype):
    pool = make_pool(path, 1, 160, kv_dtype=kv_dtype)
    want = feed(make_pool(path, 1, 160, kv_dtype=kv_dtype), 0, tokens[:60])
    feed(pool, 0, tokens[:90])
    greedy(pool, 0, feed(pool, 0, tokens[90:95]), 3)  # the slot moves on
    pool.truncate(0, 40)
    assert pool.slot_len(0) == 40 and np.array_equal(pool.record(0), tokens[:40])
    assert np.array_equal(feed(pool, 0, tokens[40:60]), want)


def test_copy_prefix_and_tail_equals_cold(path, tokens, cold):
    pool = make_pool(path, 3, 160)
    feed(pool, 0, tokens[:100])
    feed(pool, 2, random_tokens(30, N_VOCAB, seed=5))  # dst held something else
    pool.copy_prefix(0, 2, 70)
    assert np.array_equal(pool.record(2), tokens[:70])
    assert pool.slot_len(0) == 100  # source unchanged
    logits = feed(pool, 2, tokens[70:80])
    assert_same_as_cold(pool, 2, logits, cold, 80)


def test_snapshot_restore_and_tail_equals_cold(path, tokens, cold):
    pool = make_pool(path, 2, 160)
    feed(pool, 0, tokens[:60])
    snap = pool.snapshot(0, 45)
    assert isinstance(snap, bytes)
    pool.truncate(0, 3)  # the source moves on; the snapshot keeps its copy
    feed(pool, 0, random_tokens(10, N_VOCAB, seed=6))
    other = make_pool(path, 2, 160)  # a second pool of the same model
    for target, slot in ((pool, 1), (other, 0)):
        assert target.restore(slot, snap) == 45
        assert np.array_equal(target.record(slot), tokens[:45])
        assert_same_as_cold(target, slot, feed(target, slot, tokens[45:72]), cold, 72)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_schedules_equal_cold(path, tokens, cold, data):
    """Random chunk sizes, batch mixes (other slots' prefill and decode in the same calls) and
    truncation points: the target slot always ends exactly where a cold run does."""
    pool = make_pool(
        path, 3, 160, max_batch_tokens=data.draw(st.sampled_from([5, 64, 512]), label="max_batch")
    )
    target_len = data.draw(st.integers(20, 110), label="target_len")
    rewind = data.draw(st.none() | st.integers(0, target_len - 1), label="rewind")
    plan = (
        [target_len]
        if rewind is None
        else [
            data.draw(st.integers(rewind + 1, min(115, rewind + max_rewind(path))), label="first"),
            target_len,
        ]
    )
    others = {1: random_tokens(150, N_VOCAB, seed=7), 2: random_tokens(150, N_VOCAB, seed=8)}
    logits = None
    for goal in plan:
        if pool.slot_len(0) > goal:
            pool.truncate(0, rewind)
        while pool.slot_len(0) < goal:
            at = pool.slot_len(0)
            size = data.draw(st.integers(1, goal - at), label="chunk")
            batch = [(0, tokens[at : at + size], at, True)]
            for slot, seq in others.items():
                mate = data.draw(st.integers(0, 3), label=f"mate{slot}")  # 0: sits out
                at_o = pool.slot_len(slot)
                if mate and at_o + mate <= 150:
                    batch.append((slot, seq[at_o : at_o + mate], at_o, mate % 2 == 1))
            order = data.draw(st.permutations(batch), label="order")
            out = pool.forward(order)
            wanted = [item for item in order if item[3]]
            logits = out[wanted.index(batch[0])]
    assert logits is not None
    want_logits, _ = cold(target_len)
    assert np.array_equal(pool.record(0), tokens[:target_len])
    assert np.array_equal(logits, want_logits)


@pytest.mark.parametrize("threads", [1, 2])
def test_long_context_decode_equals_prefill(path, threads):
    """Past several attention chunks (ATTN_CHUNK = 256 keys): decode steps, whose attention is
    split into per-chunk units across threads, fold to exactly what prefill computes whole."""
    long = random_tokens(700, N_VOCAB, seed=31)
    pool = make_pool(path, 2, 720, threads=threads)
    want = feed(pool, 0, long[:660])
    feed(pool, 1, long[:600])
    got = feed(pool, 1, long[600:660], chunks=[1] * 60)
    assert np.array_equal(got, want)
    assert greedy(pool, 1, got, 4)[0] == greedy(pool, 0, want, 4)[0]


@pytest.mark.parametrize("swa", ["full", "ring"])
def test_every_row_logits_equal_cold_rows(path, tokens, cold, swa):
    """An item asking for its last k rows' logits (a verified draft) gets, row for row, the
    logits a cold slot computes at each of those positions: across internal steps (4 rows), beside
    a batch mate, on full KV and on a ring; the rows of rejected tokens are then cut off."""
    pool = make_pool(path, 2, 160, max_batch_tokens=4, swa_full=swa == "full")
    feed(pool, 0, tokens[:40])
    feed(pool, 1, tokens[:7])
    out = pool.forward(
        [
            BatchItem(slot=1, tokens=tokens[7:9], start_pos=7, want_logits=1),
            BatchItem(slot=0, tokens=tokens[40:46], start_pos=40, want_logits=6),
        ]
    )
    assert out.shape == (7, N_VOCAB)
    assert np.array_equal(out[0], cold(9)[0])
    for j in range(6):
        assert np.array_equal(out[1 + j], cold(41 + j)[0]), f"row {j}"
    pool.truncate(0, 43)  # the last 3 rows rejected: a ring still holds what 43 needs
    assert pool.min_truncate_len(0) <= 43
    assert_same_as_cold(pool, 0, pool.forward([BatchItem(0, tokens[43:44], 43, True)])[0], cold, 44)
    n = pool.slot_len(0)
    with pytest.raises(ValueError, match="want_logits"):
        pool.forward([BatchItem(0, tokens[:2], n, 3)])
    assert pool.slot_len(0) == n
