"""The wire format: vLLM's KV event structs (msgpack, array-like), batches, chained block hashes."""

from __future__ import annotations

import hashlib

import msgspec
import numpy as np

DEFAULT_BLOCK_SIZE = 16  # tokens per virtual block (vLLM's and llm-d's default)
_ROOT = b"\x00" * 8  # parent of a slot's first block


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
