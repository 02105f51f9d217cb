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

Only blocks a request could reuse are reported: those ending at or past the slot's
min_truncate_len (every full block on full KV; on a sliding-window or recurrent slot only the
ones it can be cut back to; KVEventPool's docstring).

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

Layout: `wire.py` (event structs, batch encoding, block hashes), `publisher.py` (KVEventsConfig,
ZmqPublisher), `pool_wrapper.py` (KVEventPool, wrap_pool).
"""

from __future__ import annotations

from .pool_wrapper import KVEventPool, wrap_pool
from .publisher import KVEventsConfig, ZmqPublisher
from .wire import (
    DEFAULT_BLOCK_SIZE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
    block_hash,
    chain_hashes,
    decode_batch,
    encode_batch,
)

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVEvent",
    "KVEventBatch",
    "KVEventPool",
    "KVEventsConfig",
    "ZmqPublisher",
    "block_hash",
    "chain_hashes",
    "decode_batch",
    "encode_batch",
    "wrap_pool",
]
