"""FakeSlotPool(recurrent=True): the pool contract for state that cannot be rewound
(interface.py): extend only, snapshots carry the state, whole-slot copies, a rollback ring of k.

The recurrent fake mixes a second chain (its "state") into the logits and scrambles every state
it no longer holds, so a cut, copy or restore that used a state it should not have would change
the logits against the stateless reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_support import N_VOCAB, prompt_of
from slotserve.scheduler.fake_engine import FakeEngineError, FakeSlotPool
from slotserve.scheduler.interface import BatchItem, SlotPool


def rec_pool(num_slots: int = 2, ctx_len: int = 1024, **kw) -> FakeSlotPool:
    return FakeSlotPool(num_slots, ctx_len, N_VOCAB, recurrent=True, **kw)


def feed(pool: FakeSlotPool, slot: int, tokens) -> np.ndarray:
    toks = np.asarray(tokens, dtype=np.int32)
    return pool.forward([BatchItem(slot, toks, pool.slot_len(slot), True)])[0]


def test_is_a_slot_pool_whose_state_changes_the_logits():
    pool = rec_pool()
    assert isinstance(pool, SlotPool) and pool.kv_window is None
    prompt = prompt_of(1, 40)
    got = feed(pool, 0, prompt)
    assert np.array_equal(got, pool.reference_logits(prompt))
    plain = FakeSlotPool(1, 1024, N_VOCAB)
    assert not np.allclose(got, plain.reference_logits(prompt))  # the state is mixed in
    assert "recurrent" in pool.fingerprint and pool.fingerprint != plain.fingerprint


def test_a_recurrent_slot_extends_only_and_refused_cuts_change_nothing():
    pool = rec_pool()
    prompt = prompt_of(2, 50)
    feed(pool, 0, prompt)
    assert pool.min_truncate_len(0) == pool.slot_len(0) == 50
    for bad in (1, 25, 49):
        with pytest.raises(ValueError, match="recurrent state"):
            pool.truncate(0, bad)
        with pytest.raises(ValueError, match="recurrent state"):
            pool.copy_prefix(0, 1, bad)
        with pytest.raises(ValueError, match="recurrent state"):
            pool.snapshot(0, bad)
    assert np.array_equal(pool.record(0), prompt) and pool.slot_len(1) == 0
    pool.truncate(0, 50)  # a cut to its own length is a no-op, accepted
    assert np.array_equal(feed(pool, 0, [7, 8]), pool.reference_logits([*prompt, 7, 8]))
    assert pool.min_truncate_len(0) == 52
    pool.truncate(0, 0)  # emptying is always allowed
    assert pool.slot_len(0) == 0 and pool.min_truncate_len(0) == 0
    assert np.array_equal(feed(pool, 0, [9]), pool.reference_logits([9]))


def test_snapshot_carries_the_state_and_restores_only_its_own_length():
    pool = rec_pool(state_bytes=4096)
    prompt = prompt_of(3, 120)
    feed(pool, 0, prompt)
    snap = pool.snapshot(0, 120)
    assert len(snap) == pool.snapshot_nbytes(120)
    plain = FakeSlotPool(2, 1024, N_VOCAB)
    assert pool.snapshot_nbytes(120) - plain.snapshot_nbytes(120) == 4096 + len("/recurrent=4096")
    assert pool.restore(1, snap) == 120
    assert pool.min_truncate_len(1) == pool.restored_min_truncate_len(120) == 120
    assert all(pool.restored_min_truncate_len(n) == n for n in (1, 2, 500))
    with pytest.raises(ValueError, match="recurrent state"):
        pool.truncate(1, 119)
    assert np.array_equal(feed(pool, 1, [7]), pool.reference_logits([*prompt, 7]))
    # layouts that differ are refused and leave the slot unchanged; so is a damaged snapshot
    for other in (plain, rec_pool(state_bytes=256), FakeSlotPool(2, 1024, N_VOCAB, window=16)):
        with pytest.raises(ValueError, match="another"):
            other.restore(0, snap)
        assert other.slot_len(0) == 0
    feed(plain, 1, prompt)
    with pytest.raises(ValueError, match="another"):
        pool.restore(0, plain.snapshot(1, 120))
    bad = bytearray(snap)
    bad[-1] ^= 1  # the state's padding
    with pytest.raises(ValueError, match="damaged"):
        pool.restore(0, bytes(bad))
    assert pool.slot_len(0) == 120 and np.array_equal(pool.record(0), prompt)


def test_a_whole_slot_is_copied_for_a_fork():
    pool = rec_pool(3)
    prompt = prompt_of(4, 60)
    feed(pool, 0, prompt)
    pool.copy_prefix(0, 1, 60)
    pool.copy_prefix(0, 2, 60)
    outs = [feed(pool, s, [10 + s]) for s in range(3)]
    for s, got in enumerate(outs):
        assert np.array_equal(got, pool.reference_logits([*prompt, 10 + s]))
    assert pool.min_truncate_len(1) == 61
    pool.copy_prefix(0, 1, 0)  # n == 0 empties the destination
    assert pool.slot_len(1) == 0


def test_a_rollback_ring_takes_back_at_most_k_tokens_exactly():
    k = 4
    pool = rec_pool(rollback=k)
    prompt = prompt_of(5, 30)
    feed(pool, 0, prompt[:20])
    feed(pool, 0, prompt[20:])
    assert pool.min_truncate_len(0) == 30 - k
    with pytest.raises(ValueError, match="recurrent state"):
        pool.truncate(0, 30 - k - 1)
    pool.truncate(0, 28)  # take back two tokens (a rejected draft)
    assert pool.min_truncate_len(0) == 26  # still the ring's oldest state
    assert np.array_equal(feed(pool, 0, [5]), pool.reference_logits([*prompt[:28], 5]))
    assert pool.min_truncate_len(0) == 26  # the states the cut dropped do not come back
    pool.copy_prefix(0, 1, 26)  # a copy from the ring: no history in the destination
    assert pool.min_truncate_len(1) == 26
    assert np.array_equal(feed(pool, 1, [6]), pool.reference_logits([*prompt[:26], 6]))
    snap = pool.snapshot(0, 27)
    assert pool.restore(1, snap) == 27 and pool.min_truncate_len(1) == 27
    assert np.array_equal(feed(pool, 1, [7]), pool.reference_logits([*prompt[:27], 7]))
    feed(pool, 0, [6, 7, 8])
    assert pool.slot_len(0) == 32 and pool.min_truncate_len(0) == 32 - k
    assert FakeSlotPool(1, 64, N_VOCAB, recurrent=True, rollback=3).kv_bytes > rec_pool(1, 64).kv_bytes
    with pytest.raises(ValueError, match="rollback"):
        FakeSlotPool(1, 64, N_VOCAB, rollback=2)  # a ring of states needs recurrent state


def test_a_fault_empties_the_recurrent_slot_and_it_starts_again_cold():
    pool = rec_pool()
    feed(pool, 0, prompt_of(6, 40))
    feed(pool, 1, prompt_of(7, 10))
    pool._inject_fault(0)
    with pytest.raises(FakeEngineError):
        pool.forward([BatchItem(0, np.array([5], np.int32), 40, True)])
    assert pool.slot_len(0) == 0 and pool.min_truncate_len(0) == 0
    assert np.array_equal(feed(pool, 0, [8, 9]), pool.reference_logits([8, 9]))
    assert pool.slot_len(1) == 10


@settings(max_examples=60, deadline=None)
@given(
    rollback=st.integers(0, 6),
    ops=st.lists(
        st.tuples(st.sampled_from(["feed", "cut", "copy", "snap", "empty"]), st.integers(0, 40)), max_size=25
    ),
)
def test_every_accepted_operation_keeps_the_state_exact(rollback, ops):
    """Random feeds, cuts, copies and snapshot round trips: what the pool accepts is exact (the
    next logits equal the stateless reference of the record), what it refuses changes nothing,
    and the floor is never more than `rollback` below the length."""
    pool = rec_pool(2, 512, rollback=rollback)
    rng = np.random.default_rng(rollback)
    for op, arg in ops:
        slot = arg % 2
        held = pool.slot_len(slot)
        before = (pool.record(0).copy(), pool.record(1).copy())
        try:
            if op == "feed" and held + arg + 1 <= pool.ctx_len:
                toks = [int(t) for t in rng.integers(4, N_VOCAB, size=arg + 1)]
                logits = feed(pool, slot, toks)
                assert np.array_equal(logits, pool.reference_logits(list(pool.record(slot))))
            elif op == "cut" and held:
                pool.truncate(slot, held - arg % (held + 1))
            elif op == "copy" and held:
                pool.copy_prefix(slot, 1 - slot, held - arg % (held + 1))
            elif op == "snap" and held:
                pool.restore(1 - slot, pool.snapshot(slot, held - arg % held))
            elif op == "empty":
                pool.truncate(slot, 0)
        except ValueError:
            assert np.array_equal(pool.record(0), before[0]) and np.array_equal(pool.record(1), before[1])
        for s in (0, 1):
            n = pool.slot_len(s)
            assert n - rollback <= pool.min_truncate_len(s) <= n
            if n:
                probe = feed(pool, s, [9])
                assert np.array_equal(probe, pool.reference_logits(list(pool.record(s))))
                if rollback:  # take the probe back
                    pool.truncate(s, n)
                else:  # no ring: the probe stays
                    with pytest.raises(ValueError, match="recurrent state"):
                        pool.truncate(s, n)
