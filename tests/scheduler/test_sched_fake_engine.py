"""The fake slot pool honours the SlotPool protocol, so scheduler tests on it mean something."""

from __future__ import annotations

import numpy as np
import pytest
from slotserve.scheduler.fake_engine import FakeEngineError, FakeSlotPool
from slotserve.scheduler.interface import BatchItem, SlotPool


def item(slot, toks, start, want=True):
    return BatchItem(slot, np.asarray(toks, dtype=np.int32), start, want)


def test_is_a_slot_pool():
    assert isinstance(FakeSlotPool(2, 64), SlotPool)


def test_logits_depend_on_the_whole_record():
    pool = FakeSlotPool(2, 64)
    a = pool.forward([item(0, [5, 6, 7], 0), item(1, [4, 6, 7], 0)])
    assert not np.allclose(a[0], a[1])  # same last tokens, different history
    assert np.array_equal(a[0], pool.reference_logits([5, 6, 7]))


def test_rewind_copy_snapshot_restore_reproduce_the_same_logits():
    pool = FakeSlotPool(3, 64)
    pool.forward([item(0, [5, 6, 7, 8, 9], 0, False)])
    pool.truncate(0, 3)
    got = pool.forward([item(0, [10], 3)])[0]
    assert np.array_equal(got, pool.reference_logits([5, 6, 7, 10]))
    pool.copy_prefix(0, 1, 2)
    got = pool.forward([item(1, [11], 2)])[0]
    assert np.array_equal(got, pool.reference_logits([5, 6, 11]))
    snap = pool.snapshot(0, 4)
    assert pool.restore(2, snap) == 4
    assert np.array_equal(pool.record(2), [5, 6, 7, 10])
    got = pool.forward([item(2, [12], 4)])[0]
    assert np.array_equal(got, pool.reference_logits([5, 6, 7, 10, 12]))
    assert pool.num_computed_tokens == 5 + 1 + 1 + 1


@pytest.mark.parametrize(
    "batch, msg",
    [
        ([], "empty batch"),
        ([item(5, [1], 0)], "unknown slot"),
        ([item(0, [5], 0)], "start_pos"),
        ([item(0, [], 0)], "empty item"),
        ([item(1, [99], 0)], "outside vocabulary"),
        ([item(0, [1], 1), item(0, [2], 2)], "twice"),
        ([item(1, list(range(4, 60)) * 2, 0)], "past ctx_len"),
    ],
)
def test_bad_forward_calls_raise_and_change_nothing(batch, msg):
    pool = FakeSlotPool(2, 64)
    pool.forward([item(0, [4], 0, False)])
    with pytest.raises(ValueError, match=msg):
        pool.forward(batch)
    assert pool.slot_len(0) == 1 and pool.slot_len(1) == 0 and pool.num_computed_tokens == 1


def test_snapshot_validation_leaves_the_slot_unchanged():
    pool = FakeSlotPool(2, 64)
    pool.forward([item(0, [4, 5, 6], 0, False), item(1, [7], 0, False)])
    snap = bytearray(pool.snapshot(0, 3))
    snap[-1] ^= 1
    with pytest.raises(ValueError, match="checksum"):
        pool.restore(1, bytes(snap))
    other = FakeSlotPool(2, 64, model_id="other")
    other.forward([item(0, [4, 5, 6], 0, False)])
    with pytest.raises(ValueError, match="another model"):
        pool.restore(1, other.snapshot(0, 3))
    with pytest.raises(ValueError, match="bad magic"):
        pool.restore(1, b"GARBAGE!" + bytes(40))
    assert np.array_equal(pool.record(1), [7])


def test_capability_flags_are_enforced():
    pool = FakeSlotPool(2, 64, can_truncate=False, can_copy=False, can_snapshot=False)
    pool.forward([item(0, [4, 5, 6], 0, False)])
    pool.truncate(0, 3)
    with pytest.raises(ValueError, match="can_truncate"):
        pool.truncate(0, 1)
    pool.truncate(0, 0)
    with pytest.raises(ValueError, match="can_copy"):
        pool.copy_prefix(0, 1, 0)
    with pytest.raises(ValueError, match="can_snapshot"):
        pool.snapshot(0, 1)


def test_injected_fault_empties_only_that_slot():
    pool = FakeSlotPool(2, 64)
    pool.forward([item(0, [4, 5], 0, False), item(1, [6, 7], 0, False)])
    pool._inject_fault(1)
    with pytest.raises(FakeEngineError):
        pool.forward([item(0, [8], 2), item(1, [9], 2)])
    assert pool.slot_len(0) == 2 and pool.slot_len(1) == 0
    pool.forward([item(0, [8], 2), item(1, [9], 0)])  # both usable again


@pytest.mark.parametrize("window", [None, 4])
def test_every_row_logits_equal_one_token_steps(window):
    """want_logits=k returns the logits of the item's last k rows, each as a one-token step
    would; a bad count is refused before anything changes."""
    kw = {} if window is None else {"window": window, "step_tokens": 8}
    a, b = FakeSlotPool(2, 64, 50, **kw), FakeSlotPool(2, 64, 50, **kw)
    toks = np.arange(3, 20, dtype=np.int32)
    a.forward([BatchItem(0, toks[:10], 0, False)])
    b.forward([BatchItem(0, toks[:10], 0, False)])
    out = a.forward([BatchItem(0, toks[10:15], 10, 5)])
    assert out.shape == (5, 50)
    for j in range(5):
        assert np.array_equal(out[j], b.forward([BatchItem(0, toks[10 + j : 11 + j], 10 + j, True)])[0])
    with pytest.raises(ValueError, match="want_logits"):
        a.forward([BatchItem(0, toks[:2], 15, 3)])
    assert a.slot_len(0) == 15
