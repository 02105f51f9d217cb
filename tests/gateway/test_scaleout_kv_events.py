"""KV events: wire format, the slot-mirror diff, and the ZMQ publisher on loopback.

A subscriber here decodes with plain `msgpack` (not slotserve's msgspec structs), so the tests
check the bytes a vLLM-format consumer sees, and rebuilds the set of live blocks from the event
stream; that set must equal the hashes of the full blocks of every slot's record.
"""

from __future__ import annotations

import random
import threading
import time

import msgpack
import numpy as np
import pytest
from slotserve.gateway.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventPool,
    KVEventsConfig,
    ZmqPublisher,
    block_hash,
    chain_hashes,
    decode_batch,
    encode_batch,
)
from slotserve.scheduler.fake_engine import FakeEngineError, FakeSlotPool
from slotserve.scheduler.interface import BatchItem

BS = 4  # small blocks so short records span several


class LiveBlocks:
    """What a router's indexer keeps: the set of live block hashes, rebuilt from raw payloads."""

    def __init__(self, strict_parent: bool = True) -> None:
        self.strict_parent = strict_parent  # False: a reported chain may hang off an unreported block
        self.live: set[int] = set()
        self.tokens: dict[int, list[int]] = {}
        self.num_stored = 0
        self.num_removed = 0

    def apply_payload(self, payload: bytes) -> None:
        batch = msgpack.unpackb(payload)
        assert isinstance(batch, list) and isinstance(batch[0], float)
        for event in batch[1]:
            self.apply_event(event)

    def apply_event(self, event: list) -> None:
        kind = event[0]
        if kind == "BlockStored":
            _, hashes, parent, token_ids, block_size, lora_id, medium = event
            assert lora_id is None and medium is None
            assert len(token_ids) == len(hashes) * block_size
            assert parent is None or parent in self.live or not self.strict_parent, (
                "a stored chain must hang off a live block"
            )
            for i, h in enumerate(hashes):
                assert h not in self.live, f"block {h:#x} stored twice without removal"
                self.live.add(h)
                self.tokens[h] = token_ids[i * block_size : (i + 1) * block_size]
            self.num_stored += len(hashes)
        elif kind == "BlockRemoved":
            _, hashes, medium = event
            for h in hashes:
                assert h in self.live, f"block {h:#x} removed but not live"
                self.live.discard(h)
            self.num_removed += len(hashes)
        elif kind == "AllBlocksCleared":
            assert event == ["AllBlocksCleared"]
            self.live.clear()
        else:
            raise AssertionError(f"unknown event {kind!r}")


def expected_live(pool: FakeSlotPool, block_size: int) -> set[int]:
    """The hashes of every block a request could reuse: those ending at or past the slot's
    min_truncate_len (every full block of a full-KV slot)."""
    out: set[int] = set()
    for slot in range(pool.num_slots):
        hashes = chain_hashes(np.asarray(pool.record(slot)), block_size)
        m = pool.min_truncate_len(slot)
        out.update(h for i, h in enumerate(hashes) if (i + 1) * block_size >= m)
    return out


def make_wrapped(num_slots: int = 3, ctx_len: int = 64, block_size: int = BS, **pool_kw):
    pool = FakeSlotPool(num_slots, ctx_len, n_vocab=16, **pool_kw)
    sub = LiveBlocks(strict_parent=not pool_kw)
    batches: list[bytes] = []

    def publish(events):
        payload = encode_batch(KVEventBatch(ts=time.time(), events=list(events)))
        batches.append(payload)
        sub.apply_payload(payload)

    return pool, KVEventPool(pool, publish, block_size=block_size), sub, batches


def feed(wrapped: KVEventPool, slot: int, tokens: list[int]) -> None:
    wrapped.forward([BatchItem(slot, np.array(tokens, dtype=np.int32), wrapped.slot_len(slot), True)])


def test_wire_format_is_vllm_array_encoding():
    stored = BlockStored(
        block_hashes=[1, 2**64 - 1],
        parent_block_hash=None,
        token_ids=[5, 6, 7, 8],
        block_size=2,
        lora_id=None,
        medium=None,
    )
    batch = KVEventBatch(
        ts=12.5, events=[stored, BlockRemoved(block_hashes=[3], medium=None), AllBlocksCleared()]
    )
    raw = msgpack.unpackb(encode_batch(batch))
    assert raw == [
        12.5,
        [
            ["BlockStored", [1, 2**64 - 1], None, [5, 6, 7, 8], 2, None, None],
            ["BlockRemoved", [3], None],
            ["AllBlocksCleared"],
        ],
        None,  # data_parallel_rank: msgspec keeps a trailing None in array form, as in vLLM's batches
    ]
    assert decode_batch(encode_batch(batch)) == batch
    ranked = msgpack.unpackb(encode_batch(KVEventBatch(ts=1.0, events=[], data_parallel_rank=2)))
    assert ranked == [1.0, [], 2]


def test_block_hash_chains_and_is_64_bit():
    toks = np.arange(12, dtype=np.int32)
    hashes = chain_hashes(toks, 4)
    assert len(hashes) == 3
    assert hashes[0] == block_hash(None, toks[:4])
    assert hashes[2] == block_hash(block_hash(block_hash(None, toks[:4]), toks[4:8]), toks[8:12])
    assert all(0 <= h < 2**64 for h in hashes)
    # the same block content under another parent is another block
    assert block_hash(hashes[0], toks[:4]) != hashes[0]
    assert chain_hashes(toks[:11], 4) == hashes[:2]  # partial tail block not reported


def test_grow_rewind_and_shared_prefix_events():
    pool, wrapped, sub, batches = make_wrapped()
    feed(wrapped, 0, [1, 2, 3, 4, 5, 6, 7, 8, 1, 2])  # 2 full blocks + tail of 2
    assert len(sub.live) == 2 and sub.live == expected_live(pool, BS)
    feed(wrapped, 0, [3, 4])  # completes block 3
    assert len(sub.live) == 3
    # slot 1 gets the same first 6 tokens: block 0 is shared, refcount 2, no new event for it
    n_before = sub.num_stored
    feed(wrapped, 1, [1, 2, 3, 4, 5, 6])
    assert sub.num_stored == n_before  # block 0 already live; 5,6 is a partial block
    # rewind slot 0 to 5 tokens: blocks 1 and 2 leave the union, block 0 stays (slot 1 holds it)
    wrapped.truncate(0, 5)
    assert len(sub.live) == 1 and sub.live == expected_live(pool, BS)
    wrapped.truncate(1, 0)
    assert len(sub.live) == 1  # slot 0 still holds block 0
    wrapped.truncate(0, 3)
    assert sub.live == set() and sub.num_removed == 3
    wrapped.check_integrity()


def test_copy_restore_and_fault_paths():
    pool, wrapped, sub, _ = make_wrapped()
    feed(wrapped, 0, list(range(8)) * 2)  # 16 tokens = 4 blocks
    wrapped.copy_prefix(0, 2, 9)  # slot 2 := first 9 tokens: blocks 0, 1 (shared), no new hashes
    assert wrapped.slot_hashes(2) == wrapped.slot_hashes(0)[:2]
    assert sub.live == expected_live(pool, BS)
    snap = wrapped.snapshot(0, 12)
    feed(wrapped, 1, [7, 7, 7, 7, 7])
    assert wrapped.restore(1, snap) == 12  # slot 1's [7,7,7,7] block is replaced by slot 0's prefix
    assert sub.live == expected_live(pool, BS) and len(sub.live) == 4
    with pytest.raises(ValueError):
        wrapped.truncate(1, 99)  # bad call: nothing changes, mirror stays right
    pool._inject_fault(0)
    with pytest.raises(FakeEngineError):
        feed(wrapped, 0, [1])  # compute failure empties slot 0
    assert pool.slot_len(0) == 0
    assert sub.live == expected_live(pool, BS)
    wrapped.check_integrity()


POOL_KINDS = {
    "full": {},
    "recurrent": {"recurrent": True},
    "rollback": {"recurrent": True, "rollback": 3},
    "window": {"window": 6, "step_tokens": 2},
}


@pytest.mark.parametrize("kind", list(POOL_KINDS))
@pytest.mark.parametrize("seed", range(5))
def test_random_operations_subscriber_matches_records(seed, kind):
    rng = random.Random(seed)
    pool, wrapped, sub, _ = make_wrapped(num_slots=4, ctx_len=48, **POOL_KINDS[kind])
    snaps: list[bytes] = []
    for _ in range(300):
        slot = rng.randrange(4)
        length = pool.slot_len(slot)
        least = pool.min_truncate_len(slot)  # the cuts, copies and snapshots the pool accepts
        op = rng.random()
        if op < 0.5 and length < 48:
            # few distinct tokens so slots often share prefixes
            feed(wrapped, slot, [rng.randrange(2) for _ in range(rng.randint(1, min(9, 48 - length)))])
        elif op < 0.6:
            wrapped.truncate(slot, rng.randint(least, length))
        elif op < 0.7:
            wrapped.truncate(slot, 0)  # a slot emptied for another conversation
        elif op < 0.8:
            src = rng.randrange(4)
            if src != slot:
                wrapped.copy_prefix(src, slot, rng.randint(pool.min_truncate_len(src), pool.slot_len(src)))
        elif op < 0.9 and length:
            snaps.append(wrapped.snapshot(slot, rng.randint(max(1, least), length)))
        elif snaps:
            wrapped.restore(slot, rng.choice(snaps))
        assert sub.live == expected_live(pool, BS)
    wrapped.check_integrity()
    assert sub.num_stored > 20 and sub.num_removed > 10  # the walk really exercised both


def test_recurrent_slot_reports_only_the_blocks_it_can_resume_at():
    # an extend-only slot can serve its whole record, never a prompt that diverges inside it
    pool, wrapped, sub, _ = make_wrapped(recurrent=True)
    feed(wrapped, 0, list(range(10)))  # 2 full blocks and a tail: it ends on no block boundary
    assert sub.live == set() and len(wrapped.slot_hashes(0)) == 2
    feed(wrapped, 0, [10, 11])  # 12 tokens: the last block ends where the slot does
    chain = chain_hashes(np.arange(12, dtype=np.int32), BS)
    assert wrapped.slot_hashes(0) == chain and sub.live == {chain[2]}
    feed(wrapped, 0, [12])  # past it: block 2 can no longer be resumed at
    assert sub.live == set() and sub.num_removed == 1
    # a rollback ring of 3 states: cuts to 10..13 are exact, so block 2 (ends at 12) is reported
    pool, wrapped, sub, _ = make_wrapped(recurrent=True, rollback=3)
    feed(wrapped, 0, list(range(13)))
    assert pool.min_truncate_len(0) == 10 and sub.live == {chain[2]}
    wrapped.truncate(0, 12)
    assert sub.live == {chain[2]}
    wrapped.check_integrity()


def test_full_state_resync_rebuilds_a_late_subscriber():
    pool, wrapped, sub, _ = make_wrapped()
    feed(wrapped, 0, [1, 2, 3, 4, 5, 6, 7, 8])
    feed(wrapped, 1, [1, 2, 3, 4, 0, 0, 0, 0, 1])
    late = LiveBlocks()
    late.live = {12345}  # stale knowledge from an older server process
    for event in msgpack.unpackb(encode_batch(KVEventBatch(ts=0.0, events=wrapped.full_state())))[1]:
        late.apply_event(event)
    assert late.live == expected_live(pool, BS) == sub.live
    assert len(late.live) == 3  # [1,2,3,4] shared, then one block per slot


class Subscriber:
    """A SUB socket read continuously by its own thread, as a router's indexer does.

    NOTE: a ZMQ socket that nobody reads does not process its connection commands, so its
    subscription would never reach the publisher; hence the thread.
    """

    def __init__(self, ctx, *, bind: bool, endpoint: str | None = None):
        import zmq

        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.LINGER, 0)
        if bind:
            port = self.sock.bind_to_random_port("tcp://127.0.0.1")
            self.endpoint = f"tcp://127.0.0.1:{port}"
        else:
            assert endpoint is not None
            self.sock.connect(endpoint)
            self.endpoint = endpoint
        self.frames: list[list[bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self.sock.poll(20):
                self.frames.append(self.sock.recv_multipart())

    def wait_for(self, predicate, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for KV events; got {len(self.frames)} batches")
            time.sleep(0.01)

    def live(self) -> set[int]:
        state = LiveBlocks()
        for frame in list(self.frames):
            state.apply_payload(frame[2])
        return state.live

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def _wait_sent(publisher: ZmqPublisher, n: int) -> None:
    deadline = time.monotonic() + 5.0
    while publisher.num_sent < n:
        assert time.monotonic() < deadline, f"the publisher sent {publisher.num_sent} of {n} batches"
        time.sleep(0.005)


def _wait_joined(publisher: ZmqPublisher) -> None:
    deadline = time.monotonic() + 5.0
    while not publisher.resync_requested.is_set():
        assert time.monotonic() < deadline, "the subscription never reached the publisher"
        time.sleep(0.005)


def test_zmq_publisher_connects_to_a_bound_subscriber_and_resyncs_on_join():
    zmq = pytest.importorskip("zmq")
    ctx = zmq.Context()
    sub = Subscriber(ctx, bind=True)
    config = KVEventsConfig(endpoint=sub.endpoint, topic="kv@127.0.0.1@tiny", block_size=BS)
    assert not config.binds
    publisher = ZmqPublisher(config)
    publisher.start()
    try:
        pool = FakeSlotPool(2, 32, n_vocab=16)
        wrapped = KVEventPool(pool, publisher.publish, block_size=BS, resync=publisher.resync_requested)
        _wait_joined(publisher)
        feed(wrapped, 0, [1, 2, 3, 4, 5, 6, 7, 8, 9])  # first call after the join: full state first
        feed(wrapped, 1, [1, 2, 3, 4, 4, 4, 4, 4])
        wrapped.truncate(0, 4)
        sub.wait_for(lambda: len(sub.frames) >= 4 and sub.live() == expected_live(pool, BS))
        assert len(sub.live()) == 2
        assert {f[0] for f in sub.frames} == {b"kv@127.0.0.1@tiny"}
        assert all(len(f) == 3 and len(f[1]) == 8 for f in sub.frames)
        seqs = [int.from_bytes(f[1], "big") for f in sub.frames]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"gap in {seqs}"
        assert seqs[-1] == publisher.num_sent - 1
    finally:
        publisher.close()
        sub.close()
        ctx.term()


def test_zmq_publisher_binds_ipc_and_late_subscribers_get_the_state(tmp_path):
    zmq = pytest.importorskip("zmq")
    endpoint = f"ipc://{tmp_path}/kv.sock"
    config = KVEventsConfig(endpoint=endpoint, block_size=BS)
    assert config.binds
    publisher = ZmqPublisher(config)
    publisher.start()
    ctx = zmq.Context()
    subs: list[Subscriber] = []
    try:
        pool = FakeSlotPool(2, 32, n_vocab=16)
        published = [1]  # start() publishes one AllBlocksCleared

        def publish(events):
            published[0] += bool(events)
            publisher.publish(events)

        wrapped = KVEventPool(pool, publish, block_size=BS, resync=publisher.resync_requested)
        feed(wrapped, 0, [1, 2, 3, 4, 5, 6, 7, 8])  # published before anyone listens: lost
        for _ in range(2):
            # Let the publisher thread send what is queued before the next subscriber joins, or a
            # slow thread hands that subscriber an older batch ahead of its resync.
            _wait_sent(publisher, published[0])
            subs.append(Subscriber(ctx, bind=False, endpoint=endpoint))
            _wait_joined(publisher)
            feed(wrapped, 1, [pool.slot_len(1) % 8])  # any pool call delivers the full state
        for sub in subs:
            sub.wait_for(lambda: sub.live() == expected_live(pool, BS))  # noqa: B023
            assert msgpack.unpackb(sub.frames[0][2])[1][0] == ["AllBlocksCleared"]
        assert len(expected_live(pool, BS)) == 2
    finally:
        publisher.close()
        for sub in subs:
            sub.close()
        ctx.term()


def test_config_rejects_bad_endpoints():
    for bad in ("localhost:5557", "http://127.0.0.1:5557", "tcp://127.0.0.1", "tcp://"):
        with pytest.raises(ValueError, match="kv-events-endpoint"):
            KVEventsConfig(endpoint=bad)
    with pytest.raises(ValueError, match="block size"):
        KVEventsConfig(endpoint="tcp://127.0.0.1:5557", block_size=0)


def test_publisher_reports_bind_failure():
    pytest.importorskip("zmq")
    with pytest.raises(ValueError, match="kv-events-endpoint"):
        ZmqPublisher(KVEventsConfig(endpoint="ipc:///nonexistent-dir/for/sure/kv.sock")).start()


def test_server_wiring_wraps_the_pool_only_with_an_endpoint(tmp_path):
    pytest.importorskip("zmq")
    from slotserve.gateway.config import ServeConfig
    from slotserve.gateway.runtime import with_kv_events

    pool = FakeSlotPool(2, 32, n_vocab=16)
    same, closers = with_kv_events(pool, ServeConfig())
    assert same is pool and closers == []
    config = ServeConfig(kv_events_endpoint=f"ipc://{tmp_path}/kv.sock", kv_events_block_size=BS)
    wrapped, closers = with_kv_events(pool, config)
    try:
        assert isinstance(wrapped, KVEventPool) and wrapped.wrapped is pool
        assert wrapped.block_size == BS and len(closers) == 1
        feed(wrapped, 0, [1, 2, 3, 4, 5])
        assert wrapped.live_hashes() == expected_live(pool, BS) and len(wrapped.live_hashes()) == 1
    finally:
        for close in closers:
            close()
