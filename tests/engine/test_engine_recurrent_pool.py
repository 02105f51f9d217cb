"""The pool contract of a recurrent slot (scheduler/interface.py) on both recurrent architectures,
qwen35 (Gated DeltaNet layers) and granitehybrid (Mamba2 layers): extend only, snapshots that
carry the state, whole-slot copies, an injected fault, and the rollback ring. Each test runs on
both tiny Q8_0 fixtures (`Recurrent`); their loading and logits are test_engine_qwen35.py's and
test_engine_granite.py's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from engine_support import feed, greedy, make_pool, model_file, random_tokens
from slotserve.engine_ext import SlotPool
from slotserve.engine_ext.pool import MAX_ROLLBACK, ComputeError

N_VOCAB = 299


@dataclass(frozen=True)
class Recurrent:
    """One recurrent architecture's fixture and what the tests expect of it."""

    path: Path  # the tiny Q8_0 model
    tokens: np.ndarray  # [100] prompt ids
    state_bytes: int  # one slot's recurrent state, from the fixture's dimensions
    others: tuple[
        Path, ...
    ]  # models whose pools refuse this one's snapshots (same kind, other seed; another kind)
    walk_seed: int  # the rollback random walk's


@pytest.fixture(scope="module", params=["qwen35", "granitehybrid"])
def rec(
    request: pytest.FixtureRequest,
    qwen35_model_factory: Callable[..., Path],
    granite_model_factory: Callable[..., Path],
    tiny_model_factory: Callable[..., Path],
) -> Recurrent:
    if request.param == "qwen35":
        return Recurrent(
            path=qwen35_model_factory("Q8_0"),
            tokens=random_tokens(100, N_VOCAB, seed=35),
            # 4 DeltaNet layers x f32 x (a tail of 3 conv inputs of 2 * 32 + 64 channels + 4 matrices 16 x 16)
            state_bytes=4 * 4 * (3 * 128 + 4 * 16 * 16),
            others=(qwen35_model_factory("Q8_0", seed=1), tiny_model_factory("Q8_0")),
            walk_seed=7,
        )
    return Recurrent(
        path=granite_model_factory("Q8_0"),
        tokens=random_tokens(100, N_VOCAB, seed=36),
        # 3 Mamba2 layers x f32 x (a tail of 3 conv inputs of 128 + 2 x 2 x 24 channels + 8 heads of 16 x 24)
        state_bytes=3 * 4 * (3 * 224 + 8 * 16 * 24),
        others=(granite_model_factory("Q8_0", seed=1), qwen35_model_factory("Q8_0")),
        walk_seed=8,
    )


def test_extend_only(rec):
    q8, tokens = rec.path, rec.tokens
    pool = make_pool(q8, 2, 128)
    assert pool.recurrent and pool.kv_window is None
    feed(pool, 0, tokens[:40])
    assert pool.min_truncate_len(0) == pool.slot_len(0) == 40
    assert pool.min_truncate_len(1) == 0  # empty
    assert [pool.restored_min_truncate_len(n) for n in (1, 7, 40)] == [1, 7, 40]
    for bad in (
        lambda: pool.truncate(0, 39),
        lambda: pool.copy_prefix(0, 1, 20),
        lambda: pool.snapshot(0, 20),
    ):
        with pytest.raises(ValueError, match="recurrent state"):
            bad()
        assert pool.slot_len(0) == 40 and pool.slot_len(1) == 0
    pool.truncate(0, 40)  # its own length: nothing to do
    pool.truncate(0, 0)  # emptying is always allowed, and the slot starts afresh
    cold = make_pool(q8, 1, 128)
    assert np.array_equal(feed(pool, 0, tokens[:30]), feed(cold, 0, tokens[:30]))
    pool.check_integrity()


def test_snapshot_restore_then_extend_equals_cold(rec):
    """Warm == cold through the pool: a snapshot of 50 tokens, restored into another slot and
    another pool, reuses all 50 and only the tail is fed."""
    q8, tokens = rec.path, rec.tokens
    pool = make_pool(q8, 2, 128)
    feed(pool, 0, tokens[:50])
    snap = pool.snapshot(0, 50)
    assert len(snap) == pool.snapshot_nbytes(50)
    cold = make_pool(q8, 1, 128)
    want = feed(cold, 0, tokens[:80])
    want_tokens = greedy(cold, 0, want, 5)[0]
    for target, slot in ((pool, 1), (make_pool(q8, 2, 128), 0)):
        assert target.restore(slot, snap) == 50  # the reused tokens
        assert target.min_truncate_len(slot) == 50
        got = feed(target, slot, tokens[50:80])  # the tail only
        assert np.array_equal(got, want)
        assert greedy(target, slot, got, 5)[0] == want_tokens


def test_snapshot_nbytes_is_exact(rec):
    pool = make_pool(rec.path, 1, 128)
    for n in (1, 8, 9, 33):
        pool.truncate(0, 0)
        feed(pool, 0, rec.tokens[:n])
        assert len(pool.snapshot(0, n)) == pool.snapshot_nbytes(n)
    assert pool.state_bytes == rec.state_bytes


def test_restore_refuses_other_layouts(rec):
    q8, tokens = rec.path, rec.tokens
    pool = make_pool(q8, 1, 128)
    feed(pool, 0, tokens[:20])
    snap = pool.snapshot(0, 20)
    others = (make_pool(q8, 1, 128, kv_dtype="f32"), *(make_pool(path, 1, 128) for path in rec.others))
    for other in others:
        feed(other, 0, tokens[:5])
        with pytest.raises(ValueError, match="another model|dtype"):
            other.restore(0, snap)
        assert other.slot_len(0) == 5
    damaged = bytearray(snap)
    damaged[-100] ^= 1  # a bit of the recurrent state
    with pytest.raises(ValueError, match="damaged"):
        pool.restore(0, bytes(damaged))


def test_whole_slot_copy_forks(rec):
    """copy_prefix of the whole slot (n == slot_len): both copies continue exactly like cold runs
    (how n > 1 forks a prompt)."""
    q8, tokens = rec.path, rec.tokens
    pool = make_pool(q8, 3, 128)
    logits = feed(pool, 0, tokens[:45])
    pool.copy_prefix(0, 1, 45)
    pool.copy_prefix(0, 2, 45)
    assert pool.min_truncate_len(1) == 45
    cold = make_pool(q8, 1, 128)
    for slot, tail in ((0, tokens[45:60]), (1, tokens[60:75]), (2, tokens[45:50])):
        cold.truncate(0, 0)
        want = feed(cold, 0, np.concatenate([tokens[:45], tail]))
        assert np.array_equal(feed(pool, slot, tail), want)
    assert np.array_equal(logits, feed(make_pool(q8, 1, 128), 0, tokens[:45]))


def test_injected_fault_empties_only_its_slot(rec):
    q8, tokens = rec.path, rec.tokens
    pool = make_pool(q8, 2, 128)
    feed(pool, 0, tokens[:20])
    feed(pool, 1, tokens[:10])
    pool._inject_fault(1)
    with pytest.raises(ComputeError) as info:
        pool.forward([(1, tokens[10:12], 10, True), (0, tokens[20:25], 20, True)])
    assert info.value.tainted == (1,)
    assert pool.slot_len(1) == 0 and pool.slot_len(0) == 20
    cold = make_pool(q8, 1, 128)
    assert np.array_equal(feed(pool, 0, tokens[20:30]), feed(cold, 0, tokens[:30]))  # state untouched
    pool.check_integrity()


# -- rollback ring ----------------------------------------------------------------------------------


@pytest.mark.parametrize("max_batch_tokens", [3, 512])
def test_rollback_ring_takes_back_up_to_k_tokens_exactly(rec, max_batch_tokens):
    q8, tokens = rec.path, rec.tokens
    k = 4
    pool = make_pool(q8, 2, 128, rollback=k, max_batch_tokens=max_batch_tokens)
    assert pool.kv_bytes >= 2 * (1 + k) * pool.state_bytes
    feed(pool, 0, tokens[:2])
    assert pool.min_truncate_len(0) == 0  # every length it went through is still held
    feed(pool, 0, tokens[2:30], chunks=[10, 1, 17])
    assert pool.min_truncate_len(0) == 30 - k
    with pytest.raises(ValueError, match="recurrent state"):
        pool.truncate(0, 30 - k - 1)
    cold = make_pool(q8, 1, 128)
    for back in (k, 1, 3):
        n = pool.slot_len(0) - back
        pool.truncate(0, n)
        assert pool.min_truncate_len(0) <= n
        cold.truncate(0, 0)
        assert np.array_equal(feed(pool, 0, tokens[n : n + 2]), feed(cold, 0, tokens[: n + 2]))
    # a snapshot and a copy at a held length below the slot's own, then their continuations
    n = pool.slot_len(0) - 2
    snap = pool.snapshot(0, n)
    pool.copy_prefix(0, 1, n)
    assert pool.min_truncate_len(1) == n  # a copy starts with no history
    cold.truncate(0, 0)
    want = feed(cold, 0, tokens[: n + 3])
    assert np.array_equal(feed(pool, 1, tokens[n : n + 3]), want)
    pool.truncate(0, 0)
    assert pool.restore(0, snap) == n and pool.min_truncate_len(0) == n
    assert np.array_equal(feed(pool, 0, tokens[n : n + 3]), want)
    pool.check_integrity()


def test_rollback_ring_random_walk_matches_cold(rec):
    """The k + 1 states rotate through their entries (engine.h): random runs of feeds (1 to 6
    tokens, so a step ends inside, at and past the ring) and cuts to any held length, one after
    another without a feed between some, always continue as a cold pool fed the same tokens."""
    q8, tokens = rec.path, rec.tokens
    k = 3
    rng = np.random.default_rng(rec.walk_seed)
    pool, cold = make_pool(q8, 1, 128, rollback=k), make_pool(q8, 1, 128)
    feed(pool, 0, tokens[:5])
    cuts = 0
    for _ in range(24):
        n = pool.slot_len(0)
        if rng.random() < 0.45 and n > pool.min_truncate_len(0):
            pool.truncate(0, int(rng.integers(pool.min_truncate_len(0), n)))
            cuts += 1
            continue
        m = min(int(rng.integers(1, 7)), len(tokens) - n)
        cold.truncate(0, 0)
        assert np.array_equal(feed(pool, 0, tokens[n : n + m]), feed(cold, 0, tokens[: n + m]))
    assert cuts >= 5
    pool.check_integrity()


def test_rollback_needs_a_recurrent_model_and_a_small_count(tiny_model_path, rec):
    with pytest.raises(ValueError, match="rollback"):
        SlotPool(model_file(tiny_model_path), 1, 32, rollback=2)
    for bad in (-1, MAX_ROLLBACK + 1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="rollback must be an integer"):
            SlotPool(model_file(rec.path), 1, 32, rollback=bad)  # type: ignore[arg-type]
    assert SlotPool(model_file(rec.path), 1, 32, rollback=MAX_ROLLBACK).rollback == MAX_ROLLBACK
