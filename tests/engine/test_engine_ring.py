"""Sliding-window rings (engine_kv.c "Rings"): the tiny gemma3 fixture (window 16, five of six layers)
with a ring of 256 rows per window layer gives bit-identical logits to full planes (swa_full),
compared with `==`, however the slot was fed, cut back, copied or restored; cuts deeper than the
ring holds are refused and change nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_support import feed, make_pool, random_tokens
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slotserve.engine_ext.pool import SlotPool

N_VOCAB = 299
WINDOW = 16  # gguf_fixtures.ARCH_MODELS["gemma3"]
CTX = 1024
MAX_BATCH = 32  # ring = window + 32 - 1 rounded up to ATTN_CHUNK (256) rows


@pytest.fixture(scope="module")
def path(arch_model_factory):
    return arch_model_factory("gemma3")


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    return random_tokens(1000, N_VOCAB, seed=77)


def pools(path, num_slots: int = 2, threads: int = 2) -> tuple[SlotPool, SlotPool]:
    ring = make_pool(path, num_slots, CTX, max_batch_tokens=MAX_BATCH, threads=threads)
    full = make_pool(path, num_slots, CTX, max_batch_tokens=MAX_BATCH, threads=threads, swa_full=True)
    return ring, full


@pytest.fixture(scope="module")
def cold(path, tokens):
    """cold(n): logits after tokens[:n] fed at once into a fresh full-KV slot."""
    full = make_pool(path, 1, CTX, max_batch_tokens=MAX_BATCH, swa_full=True)
    cache: dict[int, np.ndarray] = {}

    def run(n: int) -> np.ndarray:
        if n not in cache:
            full.truncate(0, 0)
            cache[n] = feed(full, 0, tokens[:n])
        return cache[n]

    return run


def test_ring_layout_and_memory(path):
    ring, full = pools(path)
    assert (ring.ring_len, ring.kv_window, full.ring_len, full.kv_window) == (256, WINDOW, 0, None)
    # per slot: 1 global layer x 1024 rows + 5 window layers x 256 rows, vs 6 x 1024 (k and v, f16)
    row = 2 * 1 * 64 * 2  # k and v, one kv head, head_dim 64, f16
    assert full.kv_bytes == 2 * 6 * CTX * row
    assert ring.kv_bytes == 2 * (CTX + 5 * 256) * row
    assert ring.fingerprint != full.fingerprint and ring.fingerprint.endswith(f"/ring={WINDOW}")
    small = make_pool(path, 1, 200, max_batch_tokens=MAX_BATCH)  # a ring would not be smaller
    assert small.ring_len == 0 and small.kv_window is None


@pytest.mark.parametrize("threads", [1, 2])
def test_long_prefill_and_decode_equal_full_kv(path, tokens, threads):
    """Random chunks wrap the ring three times; decode steps split attention per chunk."""
    ring, full = pools(path, threads=threads)
    rng = np.random.default_rng(threads)
    at = 0
    while at < 900:
        n = min(int(rng.integers(1, 90)), 900 - at)
        a = ring.forward([(0, tokens[at : at + n], at, True)])[0]
        b = full.forward([(0, tokens[at : at + n], at, True)])[0]
        assert np.array_equal(a, b), f"at {at}: largest difference {np.abs(a - b).max()}"
        at += n
    for _ in range(12):  # decode, batched with the other slot's prefill
        out_r = ring.forward(
            [(0, tokens[at : at + 1], at, True), (1, tokens[at : at + 40], ring.slot_len(1), True)]
        )
        out_f = full.forward(
            [(0, tokens[at : at + 1], at, True), (1, tokens[at : at + 40], full.slot_len(1), True)]
        )
        assert np.array_equal(out_r, out_f)
        at += 1


def test_rewind_reach_exact_cuts_and_refused_ones(path, tokens, cold):
    ring, _ = pools(path)
    feed(ring, 0, tokens[:200])
    assert ring.min_truncate_len(0) == 0  # not wrapped yet
    feed(ring, 0, tokens[200:700], chunks=[100] * 5)
    floor = ring.min_truncate_len(0)
    assert floor == 700 - 256 + WINDOW - 1
    rec = ring.record(0).copy()
    for bad in (1, 300, floor - 1):
        with pytest.raises(ValueError, match="can only be cut back"):
            ring.truncate(0, bad)
        with pytest.raises(ValueError, match="can only be cut back"):
            ring.copy_prefix(0, 1, bad)
        with pytest.raises(ValueError, match="can only be cut back"):
            ring.snapshot(0, bad)
    assert np.array_equal(ring.record(0), rec) and ring.slot_len(1) == 0
    ring.truncate(0, floor)
    assert np.array_equal(feed(ring, 0, tokens[floor:750]), cold(750))
    ring.truncate(0, 0)  # emptying is always allowed
    assert ring.min_truncate_len(0) == 0
    assert np.array_equal(feed(ring, 0, tokens[:30]), cold(30))


def test_copy_and_snapshot_carry_the_ring(path, tokens, cold):
    ring, full = pools(path, num_slots=3)
    feed(ring, 0, tokens[:800], chunks=[32] * 25)
    n = ring.min_truncate_len(0) + 3
    ring.copy_prefix(0, 1, n)
    assert ring.min_truncate_len(1) == ring.min_truncate_len(0)
    assert np.array_equal(feed(ring, 1, tokens[n:820]), cold(820))
    snap = ring.snapshot(0, 790)
    assert len(snap) == ring.snapshot_nbytes(790) < full.snapshot_nbytes(790)
    other, _ = pools(path, num_slots=1)
    assert other.restore(0, snap) == 790
    assert other.min_truncate_len(0) == ring.restored_min_truncate_len(790) == 790
    with pytest.raises(ValueError, match="can only be cut back"):
        other.truncate(0, 789)
    assert np.array_equal(feed(other, 0, tokens[790:830], chunks=[1] * 10 + [30]), cold(830))
    # a snapshot within the window restores with every row: any cut is exact
    feed(ring, 2, tokens[:10])
    ring.restore(2, ring.snapshot(2, 10))
    assert ring.min_truncate_len(2) == 0 == ring.restored_min_truncate_len(WINDOW - 1)
    # ring and full-KV snapshots never cross (nothing changes in the refusing slot)
    with pytest.raises(ValueError, match="fingerprint"):
        full.restore(0, snap)
    feed(full, 1, tokens[:50])
    with pytest.raises(ValueError, match="fingerprint"):
        other.restore(0, full.snapshot(1, 50))
    assert other.slot_len(0) == 830


def test_a_failed_step_never_leaves_a_ring_missing_rows(path, tokens, cold):
    ring, _ = pools(path)
    feed(ring, 0, tokens[:600], chunks=[60] * 10)
    feed(ring, 1, tokens[:300])
    ring._inject_fault(1)
    with pytest.raises(RuntimeError):
        ring.forward([(0, tokens[600:700], 600, True), (1, tokens[300:301], 300, True)])
    # slot 0 is back at 600, but its ring may hold rows up to 699: it cannot be cut back past them
    assert ring.slot_len(0) == 600 and ring.slot_len(1) == 0
    assert ring.min_truncate_len(0) <= 600
    assert np.array_equal(feed(ring, 0, tokens[600:640]), cold(640))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_schedules_with_cuts_equal_full_kv(path, tokens, cold, data):
    """Random chunk sizes, batch mates and cuts anywhere the pool allows: the slot always ends
    exactly where a cold full-KV run does; cuts the pool refuses change nothing."""
    ring, _ = pools(path, num_slots=2, threads=data.draw(st.sampled_from([1, 2]), label="threads"))
    mate = random_tokens(900, N_VOCAB, seed=9)
    for _ in range(data.draw(st.integers(2, 5), label="rounds")):
        if ring.slot_len(0) >= 950:
            ring.truncate(0, 0)
        goal = data.draw(st.integers(ring.slot_len(0) + 1, 950), label="goal")
        while ring.slot_len(0) < goal:
            at = ring.slot_len(0)
            size = data.draw(st.integers(1, min(goal - at, 120)), label="chunk")
            batch = [(0, tokens[at : at + size], at, True)]
            at_m = ring.slot_len(1)
            if at_m + 5 <= 900 and data.draw(st.booleans(), label="mate"):
                batch.append((1, mate[at_m : at_m + 5], at_m, False))
            out = ring.forward(batch)
            assert np.array_equal(out[0], cold(at + size))
        cut = data.draw(st.integers(0, ring.slot_len(0)), label="cut")
        held = ring.slot_len(0)
        if cut == 0 or cut >= ring.min_truncate_len(0):
            ring.truncate(0, cut)
        else:
            with pytest.raises(ValueError):
                ring.truncate(0, cut)
            assert ring.slot_len(0) == held
