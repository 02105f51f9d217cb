"""SlotPool contract: bad calls raise ValueError and change nothing, a failed step taints only
the slot it failed in, snapshots refuse other models and damage, and the pool reports itself."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from engine_support import feed, make_pool, model_file, random_tokens
from slotserve.engine_ext import SlotPool, _engine
from slotserve.engine_ext.pool import ComputeError
from slotserve.engine_ext.snapshot_format import LAYOUT_VERSION
from slotserve.scheduler.interface import BatchItem
from slotserve.scheduler.interface import SlotPool as SlotPoolProtocol

N_VOCAB = 299


@pytest.fixture(scope="module")
def path(tiny_model_factory):
    return tiny_model_factory("Q8_0")


@pytest.fixture
def pool(path):
    """4 slots of 64 tokens; slots 0 and 1 hold 20 and 33 tokens."""
    p = make_pool(path, 4, 64)
    feed(p, 0, random_tokens(20, N_VOCAB, seed=1))
    feed(p, 1, random_tokens(33, N_VOCAB, seed=2))
    return p


def state(pool: SlotPool) -> list[np.ndarray]:
    return [pool.record(s).copy() for s in range(pool.num_slots)]


def next_logits(pool: SlotPool, slot: int, token: int = 7) -> np.ndarray:
    """Logits of feeding one more token (then rewound, so the slot is as before)."""
    n = pool.slot_len(slot)
    out = pool.forward([(slot, np.array([token], np.int32), n, True)])[0]
    pool.truncate(slot, n)
    return out


def assert_unchanged(pool: SlotPool, before_records: list[np.ndarray], before_logits: dict[int, np.ndarray]):
    for s, rec in enumerate(before_records):
        assert np.array_equal(pool.record(s), rec), f"slot {s} record changed"
    for s, logits in before_logits.items():
        assert np.array_equal(next_logits(pool, s), logits), f"slot {s} KV changed"
    pool.check_integrity()


BAD_BATCHES = {
    "empty batch": lambda t: [],
    "unknown slot": lambda t: [(4, t[:2], 0, True)],
    "negative slot": lambda t: [(-1, t[:2], 0, True)],
    "slot twice": lambda t: [(2, t[:2], 0, True), (2, t[2:3], 2, True)],
    "empty item": lambda t: [(2, t[:0], 0, True)],
    "start_pos ahead": lambda t: [(0, t[:2], 21, True)],
    "start_pos behind": lambda t: [(0, t[:2], 19, True)],
    "past ctx_len": lambda t: [(1, t[:32], 33, True)],
    "token id too large": lambda t: [(2, np.array([1, N_VOCAB]), 0, True)],
    "negative token id": lambda t: [(2, np.array([-1, 3]), 0, True)],
    "float tokens": lambda t: [(2, np.array([1.0, 2.0]), 0, True)],
    "2-D tokens": lambda t: [(2, t[:4].reshape(2, 2), 0, True)],
    "not an item": lambda t: [(2, t[:2])],
    "start_pos None": lambda t: [(2, t[:2], None, True)],
    "start_pos text": lambda t: [(2, t[:2], "0", True)],
}


@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_bad_forward_raises_and_changes_nothing(pool, case):
    tokens = random_tokens(40, N_VOCAB, seed=3)
    before, logits = state(pool), {0: next_logits(pool, 0), 1: next_logits(pool, 1)}
    good = (3, tokens[:5], 0, True)  # a valid item in the same batch is not applied either
    batch = BAD_BATCHES[case](tokens)
    with pytest.raises(ValueError) as err:
        pool.forward(batch + [good] if batch else batch)
    assert len(str(err.value)) > 20  # says what is wrong
    assert_unchanged(pool, before, logits)
    assert pool.slot_len(3) == 0


@pytest.mark.parametrize(
    "call", ["slot_len", "record", "truncate", "copy_src", "copy_dst", "snapshot", "restore"]
)
def test_unknown_slot_everywhere(pool, call):
    snap = pool.snapshot(0, 5)
    before = state(pool)
    calls = {
        "slot_len": lambda: pool.slot_len(9),
        "record": lambda: pool.record(-1),
        "truncate": lambda: pool.truncate(4, 0),
        "copy_src": lambda: pool.copy_prefix(7, 0, 1),
        "copy_dst": lambda: pool.copy_prefix(0, 7, 1),
        "snapshot": lambda: pool.snapshot(True, 1),
        "restore": lambda: pool.restore(4, snap),
    }
    with pytest.raises(ValueError, match="slot"):
        calls[call]()
    assert_unchanged(pool, before, {})


@pytest.mark.parametrize("call", ["truncate", "copy_prefix", "snapshot"])
@pytest.mark.parametrize("n", [-1, 21, 2.5])
def test_bad_lengths(pool, call, n):
    before = state(pool)
    with pytest.raises(ValueError, match="holds 20 tokens"):
        {
            "truncate": lambda: pool.truncate(0, n),
            "copy_prefix": lambda: pool.copy_prefix(0, 2, n),
            "snapshot": lambda: pool.snapshot(0, n),
        }[call]()
    assert_unchanged(pool, before, {})


def test_fault_taints_only_the_faulted_slot(pool, path):
    """A compute failure in one slot empties that slot (its KV rows may be half written); the
    other slot of the same batch is back to what it held before the step, and slots outside
    the batch are intact."""
    tokens = random_tokens(40, N_VOCAB, seed=4)
    feed(pool, 2, tokens[:10])
    intact = {0: next_logits(pool, 0)}
    intact_record = pool.record(0)
    record_2 = pool.record(2)
    pool._inject_fault(1)
    with pytest.raises(ComputeError) as info:
        pool.forward([(1, tokens[:1], 33, True), (2, tokens[10:15], 10, True)])
    assert info.value.tainted == (1,)
    assert pool.slot_len(1) == 0 and pool.slot_len(2) == 10
    assert np.array_equal(pool.record(2), record_2)
    assert np.array_equal(pool.record(0), intact_record)
    assert np.array_equal(next_logits(pool, 0), intact[0])
    # slot 2 continues as if the failed step never happened; the fault fires once and the
    # tainted slot is usable again from scratch
    cold = make_pool(path, 2, 64)
    assert np.array_equal(feed(pool, 2, tokens[10:12]), feed(cold, 0, tokens[:12]))
    assert np.array_equal(feed(pool, 1, tokens[:12]), feed(cold, 1, tokens[:12]))
    pool.check_integrity()


def test_fault_only_fires_for_its_slot(pool):
    pool._inject_fault(3)
    out = pool.forward([(0, np.array([5], np.int32), 20, True)])  # slot 3 not involved
    assert out.shape == (1, N_VOCAB) and pool.slot_len(0) == 21
    with pytest.raises(ComputeError):
        pool.forward([(3, np.array([5], np.int32), 0, False)])
    assert pool.slot_len(3) == 0 and pool.slot_len(0) == 21


def test_restore_refuses_another_model(pool, tiny_model_factory):
    snap = pool.snapshot(1, 30)
    for kwargs in (
        {"weight_type": "Q4_1"},
        {"weight_type": "Q8_0", "seed": 1},
    ):  # type; same shapes, other weights
        other = make_pool(tiny_model_factory(**kwargs), 2, 64)
        feed(other, 0, random_tokens(9, N_VOCAB, seed=5))
        before = state(other)
        with pytest.raises(ValueError, match="another model"):
            other.restore(0, snap)
        assert_unchanged(other, before, {})


def test_restore_refuses_other_kv_dtype_kernels_and_small_ctx(path, pool):
    snap = pool.snapshot(1, 30)
    with pytest.raises(ValueError, match="another model or KV layout"):
        make_pool(path, 1, 64, kv_dtype="f32").restore(0, snap)
    other = "scalar" if pool.kernel_variant != "scalar" else "avx2"
    if other == "scalar" or _engine.avx2_supported():  # KV summed in another order
        with pytest.raises(ValueError, match="another model or KV layout"):
            make_pool(path, 1, 64, kernels=other).restore(0, snap)
    with pytest.raises(ValueError, match="ctx_len"):
        make_pool(path, 1, 16).restore(0, snap)


def test_restore_refuses_damage(pool):
    snap = pool.snapshot(1, 30)
    before, logits = state(pool), {0: next_logits(pool, 0), 1: next_logits(pool, 1)}
    flipped = bytearray(snap)
    flipped[len(snap) // 2] ^= 0x10  # one bit inside the KV rows
    header = bytearray(snap)
    struct.pack_into("<I", header, 8, LAYOUT_VERSION + 1)
    bad = {
        "bit flip": bytes(flipped),
        "truncated": snap[:-100],
        "empty": b"",
        "bad magic": b"X" + snap[1:],
        "other layout": bytes(header),
        "appended": snap + b"\0",
    }
    for _name, data in bad.items():
        with pytest.raises(ValueError, match="restore"):
            pool.restore(1, data)
        assert_unchanged(pool, before, logits)


def test_restore_of_empty_snapshot_and_into_busy_slot(pool):
    assert pool.restore(1, pool.snapshot(3, 0)) == 0
    assert pool.slot_len(1) == 0
    snap = pool.snapshot(0, 20)
    assert pool.restore(1, memoryview(snap)) == 20
    assert np.array_equal(pool.record(1), pool.record(0))
    assert np.array_equal(next_logits(pool, 1), next_logits(pool, 0))


def test_copy_prefix_onto_itself_truncates(pool):
    rec = pool.record(1)
    pool.copy_prefix(1, 1, 10)
    assert np.array_equal(pool.record(1), rec[:10])


def test_pool_reports_itself(path):
    pool = make_pool(path, 3, 48, threads=2, max_batch_tokens=16)
    cfg = model_file(path).config
    assert isinstance(pool, SlotPoolProtocol)
    assert (pool.num_slots, pool.ctx_len, pool.n_vocab, pool.n_threads) == (3, 48, N_VOCAB, 2)
    assert pool.can_copy and pool.can_snapshot and pool.kv_window is None
    pool.forward(
        [BatchItem(slot=0, tokens=random_tokens(20, N_VOCAB, seed=3), start_pos=0, want_logits=False)]
    )
    assert pool.min_truncate_len(0) == 0 and pool.restored_min_truncate_len(20) == 0  # full KV
    assert len(pool.snapshot(0, 20)) == pool.snapshot_nbytes(20)
    assert pool.kv_bytes == 3 * 48 * cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 2  # f16
    assert make_pool(path, 3, 48, kv_dtype="f32").kv_bytes == 2 * pool.kv_bytes
    assert pool.kernel_variant in ("avx512vnni", "avx2", "scalar")
    assert f"layout={LAYOUT_VERSION}" in pool.fingerprint and "kv=f16" in pool.fingerprint
    assert make_pool(path, 1, 8, kv_dtype="f32").fingerprint != pool.fingerprint


def test_batch_items_and_records(path):
    pool = make_pool(path, 2, 32)
    tokens = random_tokens(9, N_VOCAB, seed=8)
    out = pool.forward(
        [
            BatchItem(slot=1, tokens=tokens[:6], start_pos=0, want_logits=False),
            BatchItem(slot=0, tokens=tokens.astype(np.int64)[:3], start_pos=0, want_logits=True),
        ]
    )
    assert out.shape == (1, N_VOCAB) and out.dtype == np.float32
    rec = pool.record(1)
    assert rec.dtype == np.int32 and np.array_equal(rec, tokens[:6])
    with pytest.raises(ValueError):
        rec[0] = 1  # read-only
    assert pool.forward([(0, [4], 3, False)]).shape == (0, N_VOCAB)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_slots": 0}, "num_slots"),
        ({"ctx_len": -3}, "ctx_len"),
        ({"threads": 0}, "threads"),
        ({"kv_dtype": "bf16"}, "kv_dtype"),
        ({"max_batch_tokens": 0}, "max_batch_tokens"),
        ({"num_slots": 2**40}, "num_slots"),
        ({"ctx_len": 2**31 - 1}, "ctx_len"),
        ({"max_batch_tokens": 2**31}, "max_batch_tokens"),
        ({"kernels": "sse9"}, "sse9"),
    ],
)
def test_bad_construction(path, kwargs, match):
    args = {"num_slots": 1, "ctx_len": 16, **kwargs}
    with pytest.raises(ValueError, match=match):
        SlotPool(model_file(path), args.pop("num_slots"), args.pop("ctx_len"), **args)


def test_accepts_a_path(path):
    pool = SlotPool(path, 1, 8)
    assert pool.forward([(0, [1, 2], 0, True)]).shape == (1, N_VOCAB)


def test_engine_forward_refuses_a_logits_array_of_the_wrong_height(pool):
    # the C engine writes one logits row per want_logits item: a shorter array must be refused
    meta = np.array([[2, 0, 3, 1], [3, 0, 2, 1]], dtype=np.int32)
    tokens = random_tokens(5, N_VOCAB, seed=4).astype(np.int32)
    for rows in (0, 1, 3):
        with pytest.raises(ValueError, match="logits"):
            pool._engine.forward(meta, tokens, np.empty((rows, N_VOCAB), np.float32))
    assert pool.slot_len(2) == pool.slot_len(3) == 0


def test_engine_forward_refuses_a_start_pos_whose_end_overflows(pool):
    # start_pos + n_tokens past INT32_MAX must not wrap around into range
    meta = np.array([[2, 2**31 - 3, 5, 1]], dtype=np.int32)
    tokens = random_tokens(5, N_VOCAB, seed=5).astype(np.int32)
    with pytest.raises(ValueError, match="rejected the batch"):
        pool._engine.forward(meta, tokens, np.empty((1, N_VOCAB), np.float32))
    assert pool.slot_len(2) == 0
