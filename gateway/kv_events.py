"""KV cache events for cache-aware routers, in vLLM's ZMQ wire format.

Design: `KVEventPool` wraps the engine's SlotPool (same protocol, every call delegated) and keeps
a mirror of each slot's live prefix as fixed-size *virtual blocks*: block i of a slot covers
record[i*B:(i+1)*B] and is named by a chained hash, hash_i = H(hash_{i-1}, tokens of block i), so
one hash names one whole prefix. Only full blocks exist; a partial tail block is not reported
until it fills. After each call that changes a slot (forward, truncate, copy_prefix, restore) the
mirror is brought up to date from the pool's own record, and the difference becomes events:

    slot record  |t0 ... t15|t16 ... t31|t32 .. t40|         B = 16
    blocks       |  h0      |  h1       |  (tail, not reported)
    h0 = H(ROOT, t0..t15)   h1 = H(h0, t16..t31)

    truncate(slot, 20): keeps h0 (20 // 16 = 1 block), BlockRemoved [h1]
    forward(+30 tokens): len 50 -> 3 full blocks, BlockStored [h1', h2'] parent h0

Several slots may hold the same prefix (same hashes). A refcount per hash over all slots makes
the events describe the union: BlockStored when a hash goes 0 -> 1 slots, BlockRemoved when it
goes 1 -> 0. A subscriber that applies the events in sequence order therefore holds exactly the
set of hashes of all full blocks live in any slot.

Wire format (vLLM's `vllm.distributed.kv_events`, msgpack via msgspec array-like structs): one
ZMQ multipart message per batch, [topic, seq as 8-byte big-endian unsigned, payload], payload =
msgpack array [ts, [event, ...], data_parallel_rank (nil)] where each event is a tagged array:

    ["BlockStored", [hash, ...], parent_hash | nil, [token_id, ...], block_size, lora_id | nil, medium | nil]
    ["BlockRemoved", [hash, ...], medium | nil]
    ["AllBlocksCleared"]

Hashes are unsigned 64-bit integers (the first 8 bytes of a SHA-256, big-endian). seq counts
batches from 0; a gap tells a subscriber it missed events. The first batch is AllBlocksCleared,
so a subscriber that hears a restarted server drops what it knew of the old process.

A subscriber that joins late is caught up without a replay protocol: the publisher's XPUB socket
reports each subscription, and the next pool call after one publishes AllBlocksCleared and every
live block (a no-op for subscribers that already knew them).

Threads: the wrapped pool's methods run on the scheduler's engine thread (the pool contract
serialises them); events are handed over a queue to one publisher thread that owns the ZMQ
socket (ZMQ sockets are not thread-safe). Publishing never blocks the engine: past the socket's
high-water mark ZMQ drops messages, which subscribers see as a seq gap.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

log = logging.getLogger("slotserve.kv_events")

DEFAULT_BLOCK_SIZE = 16  # tokens per virtual block (vLLM's and llm-d's default)
_ROOT = b"\x00" * 8  # parent of a slot's first block


# ---------------------------------------------------------------- wire format


class BlockStored(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    """Blocks newly live: a chain of `block_hashes`, the first one's parent, their tokens in order."""

    block_hashes: list[int]
    parent_block_hash: int | None  # None: the chain starts at position 0
    token_ids: list[int]  # len(block_hashes) * block_size ids
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    """Blocks no longer held by any slot."""

    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    """Forget every block of this publisher."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float  # unix time the batch was produced
    events: list[KVEvent]
    data_parallel_rank: int | None = None  # omitted on the wire when None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """Inverse of `encode_batch` (raises msgspec.DecodeError on a malformed payload)."""
    return _decoder.decode(payload)


def block_hash(parent: int | None, tokens: np.ndarray) -> int:
    """Chained hash of one block: first 8 bytes (big-endian) of SHA-256(parent, int32 LE ids)."""
    head = _ROOT if parent is None else parent.to_bytes(8, "big")
    digest = hashlib.sha256(head + np.ascontiguousarray(tokens, dtype="<i4").tobytes()).digest()
    return int.from_bytes(digest[:8], "big")


def chain_hashes(tokens: np.ndarray, block_size: int, parent: int | None = None) -> list[int]:
    """Hashes of the full blocks of `tokens` (int32 [n]), chained from `parent`."""
    out: list[int] = []
    for start in range(0, (len(tokens) // block_size) * block_size, block_size):
        parent = block_hash(parent, tokens[start : start + block_size])
        out.append(parent)
    return out


# ---------------------------------------------------------------- endpoint


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """`--kv-events-endpoint`, `--kv-events-topic`, block size; validated at construction.

    endpoint: a ZMQ endpoint. Following vLLM's rule, slotserve *binds* when the address has a
    wildcard (`tcp://*:5557`) or is ipc:// / inproc://, and *connects* otherwise
    (`tcp://indexer:5557`: the subscriber binds, as the llm-d indexer does).
    topic: first frame of every message; llm-d expects `kv@<pod-ip>@<model>`.
    """

    endpoint: str
    topic: str = ""
    block_size: int = DEFAULT_BLOCK_SIZE
    medium: str | None = None  # None = the server's primary KV tier (slotserve has one)
    send_hwm: int = 100_000  # messages ZMQ buffers for a slow subscriber before dropping

    def __post_init__(self) -> None:
        scheme, sep, rest = self.endpoint.partition("://")
        if not sep or scheme not in ("tcp", "ipc", "inproc") or not rest:
            raise ValueError(
                f"--kv-events-endpoint {self.endpoint!r} is not a ZMQ endpoint; "
                "use tcp://HOST:PORT (connect), tcp://*:PORT (bind) or ipc://PATH"
            )
        if scheme == "tcp" and not rest.rpartition(":")[2].isdigit():
            raise ValueError(f"--kv-events-endpoint {self.endpoint!r} needs a port: tcp://HOST:PORT")
        if not 1 <= self.block_size <= 4096:
            raise ValueError(f"KV events block size must be in 1..4096 tokens, got {self.block_size}")
        if self.send_hwm < 1:
            raise ValueError(f"send_hwm must be >= 1, got {self.send_hwm}")

    @property
    def binds(self) -> bool:
        """True: bind the PUB socket here; False: connect it to a subscriber that binds."""
        e = self.endpoint
        return "*" in e or "::" in e or e.startswith(("ipc://", "inproc://"))


# ---------------------------------------------------------------- publisher


class ZmqPublisher:
    """Owns a ZMQ XPUB socket on a daemon thread; `publish(events)` is safe from any thread.

    `start()` opens the socket and sends AllBlocksCleared as batch 0; `close()` sends what is
    queued (waiting at most `linger_s`) and closes. Needs pyzmq (`pip install pyzmq`).

    NOTE: XPUB, not PUB: the same on the wire for SUB subscribers, but it also hands us every
    subscription as it takes effect. Each one sets `resync_requested`; the pool wrapper then
    republishes its whole state (AllBlocksCleared + every live block) at its next call, so a
    router that (re)starts after slotserve learns the live blocks without a replay protocol,
    and subscribers that already knew them end with the same set.
    """

    _STOP = object()

    def __init__(self, config: KVEventsConfig, *, linger_s: float = 1.0):
        self.config = config
        self.linger_s = linger_s
        self.resync_requested = threading.Event()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.num_sent = 0  # batches handed to ZMQ (the next seq)

    def start(self) -> None:
        """Open the socket on the publisher thread; raises ValueError if bind/connect fails."""
        if self._thread is not None:
            return
        try:
            import zmq  # noqa: F401
        except ImportError:
            raise ValueError("--kv-events-endpoint needs pyzmq: pip install pyzmq") from None
        self._thread = threading.Thread(target=self._run, name="slotserve-kv-events", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread = None
            raise ValueError(f"--kv-events-endpoint {self.config.endpoint}: {self._error}") from self._error
        self.publish([AllBlocksCleared()])

    def publish(self, events: Sequence[KVEvent]) -> None:
        if events:
            self._queue.put(KVEventBatch(ts=time.time(), events=list(events)))

    def close(self) -> None:
        """Flush and stop; idempotent."""
        if self._thread is None:
            return
        self._queue.put(self._STOP)
        self._thread.join(timeout=self.linger_s + 5.0)
        self._thread = None

    def _run(self) -> None:
        import zmq

        ctx = zmq.Context()
        sock = ctx.socket(zmq.XPUB)
        try:
            sock.setsockopt(zmq.SNDHWM, self.config.send_hwm)
            sock.setsockopt(zmq.LINGER, int(self.linger_s * 1000))
            sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscribe, not only the first per topic
            if self.config.binds:
                sock.bind(self.config.endpoint)
            else:
                sock.connect(self.config.endpoint)
        except Exception as exc:  # reported to start()
            self._error = exc
            sock.close(0)
            ctx.term()
            self._ready.set()
            return
        self._ready.set()
        topic = self.config.topic.encode()
        seq = 0
        try:
            while True:
                while sock.poll(0, zmq.POLLIN):
                    if sock.recv()[:1] == b"\x01":  # a subscription (b"\x00" + topic: unsubscribe)
                        self.resync_requested.set()
                try:
                    item = self._queue.get(timeout=0.05)
                except queue.Empty:
                    continue
                if item is self._STOP:
                    break
                try:
                    sock.send_multipart(
                        (topic, seq.to_bytes(8, "big"), encode_batch(item)), flags=zmq.NOBLOCK
                    )
                except zmq.Again:  # past the high-water mark: dropped, subscribers see a seq gap
                    log.warning("kv events: batch %d dropped (subscriber too slow)", seq)
                seq += 1
                self.num_sent = seq
        finally:
            sock.close()
            ctx.term()


# ---------------------------------------------------------------- the pool wrapper


class KVEventPool:
    """A SlotPool that reports its slots' live prefixes as KV events; everything else delegates.

    `publish` receives a list of events after each call that changed the live block set (from
    the thread calling the pool). When `resync` is set, the next mutating call first publishes
    AllBlocksCleared and every live block, then clears it. Attributes not in the SlotPool
    protocol are read from the wrapped pool unchanged.
    """

    def __init__(
        self,
        pool: Any,
        publish: Callable[[list[KVEvent]], None],
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        medium: str | None = None,
        resync: threading.Event | None = None,
    ):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self._pool = pool
        self._publish = publish
        self._resync = resync
        self.block_size = block_size
        self.medium = medium
        self._blocks: list[list[int]] = [[] for _ in range(pool.num_slots)]  # [slot][block] hash
        self._refs: dict[int, int] = {}  # hash -> number of slots holding it
        for slot in range(pool.num_slots):  # a pool may start non-empty (tests, restored state)
            if pool.slot_len(slot):
                self._sync(slot, 0)

    # protocol attributes
    num_slots = property(lambda self: self._pool.num_slots)
    ctx_len = property(lambda self: self._pool.ctx_len)
    n_vocab = property(lambda self: self._pool.n_vocab)
    kv_bytes = property(lambda self: self._pool.kv_bytes)
    fingerprint = property(lambda self: self._pool.fingerprint)
    kv_window = property(lambda self: self._pool.kv_window)
    can_copy = property(lambda self: self._pool.can_copy)
    can_snapshot = property(lambda self: self._pool.can_snapshot)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    @property
    def wrapped(self) -> Any:
        return self._pool

    def slot_len(self, slot: int) -> int:
        return self._pool.slot_len(slot)

    def record(self, slot: int) -> np.ndarray:
        return self._pool.record(slot)

    def min_truncate_len(self, slot: int) -> int:
        return self._pool.min_truncate_len(slot)

    def restored_min_truncate_len(self, n: int) -> int:
        return self._pool.restored_min_truncate_len(n)

    def snapshot(self, slot: int, n: int) -> bytes:
        return self._pool.snapshot(slot, n)

    def snapshot_nbytes(self, n: int) -> int:
        return self._pool.snapshot_nbytes(n)

    def forward(self, batch: Sequence[Any]) -> np.ndarray:
        self._maybe_resync()
        try:
            return self._pool.forward(batch)
        finally:
            # On success every item only appended; on a compute failure some slots were emptied.
            # Either way the full blocks below min(old blocks, new length) are unchanged.
            self._emit([ev for item in batch for ev in self._sync(item.slot, None)])

    def truncate(self, slot: int, n: int) -> None:
        self._maybe_resync()
        try:
            self._pool.truncate(slot, n)
        finally:
            self._emit(self._sync(slot, None))

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        self._maybe_resync()
        try:
            self._pool.copy_prefix(src, dst, n)
        except BaseException:
            self._emit(self._sync(dst, None))  # unchanged (ValueError) or emptied (compute failure)
            raise
        self._emit(self._replace(dst, self._blocks[src][: n // self.block_size]))

    def restore(self, slot: int, snap: bytes) -> int:
        self._maybe_resync()
        try:
            n = self._pool.restore(slot, snap)
        except BaseException:
            self._emit(self._sync(slot, None))
            raise
        self._emit(self._sync(slot, 0))
        return n

    # mirror maintenance (caller: the thread that called the pool)

    def live_hashes(self) -> set[int]:
        """Hashes of every full block live in some slot (what a subscriber should hold)."""
        return set(self._refs)

    def slot_hashes(self, slot: int) -> list[int]:
        return list(self._blocks[slot])

    def check_integrity(self) -> None:
        """Recompute every slot's hashes from its record and compare with the mirror."""
        refs: dict[int, int] = {}
        for slot in range(self._pool.num_slots):
            expect = chain_hashes(np.asarray(self._pool.record(slot)), self.block_size)
            assert self._blocks[slot] == expect, (
                f"slot {slot}: mirror has {len(self._blocks[slot])} blocks, record {len(expect)}"
            )
            for h in expect:
                refs[h] = refs.get(h, 0) + 1
        assert refs == self._refs, "refcounts disagree with the slots' blocks"

    def _sync(self, slot: int, keep: int | None) -> list[KVEvent]:
        """Bring slot's blocks up to date; the first `keep` (None: all that still fit) are valid."""
        old = self._blocks[slot]
        n = self._pool.slot_len(slot)
        nfull = n // self.block_size
        valid = min(len(old), nfull) if keep is None else min(keep, len(old), nfull)
        if valid == len(old) == nfull:
            return []
        new = old[:valid]
        if nfull > valid:
            rec = np.asarray(self._pool.record(slot))
            new += chain_hashes(
                rec[valid * self.block_size : nfull * self.block_size],
                self.block_size,
                new[-1] if new else None,
            )
        return self._replace(slot, new)

    def _replace(self, slot: int, new: list[int]) -> list[KVEvent]:
        """Make `new` slot's block list; returns the events for hashes entering/leaving the union."""
        old = self._blocks[slot]
        self._blocks[slot] = new
        stored_idx: list[int] = []
        for i, h in enumerate(new):  # incref first so a block kept by this slot never flickers
            c = self._refs.get(h, 0)
            self._refs[h] = c + 1
            if c == 0:
                stored_idx.append(i)
        removed: list[int] = []
        for h in old:
            c = self._refs[h] - 1
            if c == 0:
                del self._refs[h]
                removed.append(h)
            else:
                self._refs[h] = c
        events: list[KVEvent] = []
        if removed:
            events.append(BlockRemoved(block_hashes=removed, medium=self.medium))
        if stored_idx:
            rec = np.asarray(self._pool.record(slot))
            bs = self.block_size
            run_start = stored_idx[0]
            for k, i in enumerate(stored_idx):  # one BlockStored per run of consecutive blocks
                last = k + 1 == len(stored_idx) or stored_idx[k + 1] != i + 1
                if last:
                    events.append(
                        BlockStored(
                            block_hashes=new[run_start : i + 1],
                            parent_block_hash=new[run_start - 1] if run_start > 0 else None,
                            token_ids=rec[run_start * bs : (i + 1) * bs].tolist(),
                            block_size=bs,
                            lora_id=None,
                            medium=self.medium,
                        )
                    )
                    if k + 1 < len(stored_idx):
                        run_start = stored_idx[k + 1]
        return events

    def full_state(self) -> list[KVEvent]:
        """AllBlocksCleared, then every live block once (one BlockStored per slot's new suffix)."""
        events: list[KVEvent] = [AllBlocksCleared()]
        seen: set[int] = set()
        bs = self.block_size
        for slot, blocks in enumerate(self._blocks):
            # chains share prefixes: the blocks not yet sent form a suffix of this slot's chain
            first = next((i for i, h in enumerate(blocks) if h not in seen), len(blocks))
            if first == len(blocks):
                continue
            rec = np.asarray(self._pool.record(slot))
            events.append(
                BlockStored(
                    block_hashes=blocks[first:],
                    parent_block_hash=blocks[first - 1] if first > 0 else None,
                    token_ids=rec[first * bs : len(blocks) * bs].tolist(),
                    block_size=bs,
                    lora_id=None,
                    medium=self.medium,
                )
            )
            seen.update(blocks[first:])
        return events

    def _maybe_resync(self) -> None:
        if self._resync is not None and self._resync.is_set():
            self._resync.clear()
            self._publish(self.full_state())

    def _emit(self, events: list[KVEvent]) -> None:
        if events:
            self._publish(events)


def wrap_pool(pool: Any, config: KVEventsConfig) -> tuple[KVEventPool, ZmqPublisher]:
    """Production wiring: a started publisher and the pool that feeds it. Close the publisher
    after the scheduler stops."""
    publisher = ZmqPublisher(config)
    publisher.start()
    wrapped = KVEventPool(
        pool,
        publisher.publish,
        block_size=config.block_size,
        medium=config.medium,
        resync=publisher.resync_requested,
    )
    return wrapped, publisher
