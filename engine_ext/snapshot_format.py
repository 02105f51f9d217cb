"""The KV snapshot format of SlotPool (pool.py): what `snapshot` writes and `restore` accepts.

Snapshot layout (little-endian):

    +-------------------- header (HEADER: struct, then the fingerprint) --------------------+
    | magic b"SSKVSNAP" | layout u32 | kv dtype u32 (1 f16, 2 f32, 3 q8_0) | n_layers |      |
    | n_kv_heads |
    | head_dim | n_vocab | n tokens | fingerprint length (all u32) | fingerprint utf-8      |
    |  (the fingerprint names the KV dtype too: /kv=q8_0 snapshots never restore elsewhere)  |
    +---------------------------------------------------------------------------------------+
    | token ids int32 [n]                                                                   |
    | KV per layer: n_kv_heads k planes (blocked keys), n_kv_heads v planes (rows); engine.h |
    |  (q8_0: the same planes of 34-byte blocks, half the f16 bytes + 1/16; kv_q8.h)          |
    | recurrent state (qwen35, granitehybrid): engine_state_bytes, the state at n; engine.h |
    | crc32 u32 of everything before it                                                     |
    +---------------------------------------------------------------------------------------+

A snapshot restores only into a pool of the same shape (`SnapshotFormat`: the same fingerprint,
KV dtype and dimensions, room for its tokens); everything else is refused with a ValueError
before any slot changes.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

LAYOUT_VERSION = 3  # bump whenever the KV layout or the snapshot format changes (3: q8_0 keys in quads)
SNAP_MAGIC = b"SSKVSNAP"
HEADER = struct.Struct("<8s8I")
KV_DTYPE_CODES = {"f16": 1, "f32": 2, "q8_0": 3}


@dataclass(frozen=True)
class SnapshotFormat:
    """One pool's snapshots: its fingerprint (utf-8), KV dtype, dimensions and context length,
    one slot's recurrent state bytes (0 without), and `kv_bytes(n)`, the engine's KV bytes of a
    snapshot of n tokens."""

    fingerprint: bytes
    kv_dtype: str
    n_layers: int
    n_kv_heads: int
    head_dim: int
    n_vocab: int
    ctx_len: int
    state_bytes: int
    kv_bytes: Callable[[int], int]

    def nbytes(self, n: int) -> int:
        """The bytes of a snapshot of n tokens."""
        return HEADER.size + len(self.fingerprint) + 4 * n + int(self.kv_bytes(n)) + self.state_bytes + 4

    def header(self, n: int) -> bytes:
        """The header of a snapshot of n tokens, the fingerprint included (the token ids follow)."""
        return (
            HEADER.pack(
                SNAP_MAGIC,
                LAYOUT_VERSION,
                KV_DTYPE_CODES[self.kv_dtype],
                self.n_layers,
                self.n_kv_heads,
                self.head_dim,
                self.n_vocab,
                n,
                len(self.fingerprint),
            )
            + self.fingerprint
        )

    @staticmethod
    def sealed(body: bytes) -> bytes:
        """`body` (header, token ids, KV, state) with its crc32 appended: the snapshot."""
        return body + struct.pack("<I", zlib.crc32(body))

    def parse(self, view: memoryview) -> tuple[int, np.ndarray, memoryview, memoryview]:
        """A snapshot's token count, token ids, KV bytes and recurrent state bytes (views into
        `view`), checked against this shape: ValueError (the fix named) for anything else."""

        def refuse(why: str) -> ValueError:
            return ValueError(
                f"restore: {why}; take snapshots from a pool of the same model, KV dtype "
                "and slotserve version"
            )

        if len(view) < HEADER.size + 4:
            raise refuse("not a slotserve snapshot (too short)")
        magic, layout, kv_code, n_layers, n_kv, head_dim, n_vocab, n, fp_len = HEADER.unpack_from(view)
        if magic != SNAP_MAGIC:
            raise refuse("not a slotserve snapshot (bad magic)")
        if layout != LAYOUT_VERSION:
            raise refuse(f"snapshot layout version {layout}, this pool uses {LAYOUT_VERSION}")
        (crc,) = struct.unpack_from("<I", view, len(view) - 4)
        if zlib.crc32(view[:-4]) != crc:
            raise refuse("the snapshot is damaged (checksum mismatch)")
        fp_end = HEADER.size + fp_len
        if fp_end > len(view) - 4 or bytes(view[HEADER.size : fp_end]) != self.fingerprint:
            raise refuse("the snapshot is of another model or KV layout (fingerprint mismatch)")
        if (kv_code, n_layers, n_kv, head_dim, n_vocab) != (
            KV_DTYPE_CODES[self.kv_dtype],
            self.n_layers,
            self.n_kv_heads,
            self.head_dim,
            self.n_vocab,
        ):
            raise refuse("the snapshot's KV dtype or dimensions differ from this pool's")
        if n > self.ctx_len:
            raise ValueError(
                f"restore: the snapshot holds {n} tokens > ctx_len {self.ctx_len}; "
                "use a pool with a larger ctx_len"
            )
        tok_end = fp_end + 4 * n
        kv_end = tok_end + int(self.kv_bytes(n))
        if kv_end + self.state_bytes + 4 != len(view):
            raise refuse("the snapshot has the wrong size for its token count")
        tokens = np.frombuffer(view[fp_end:tok_end], dtype="<i4")
        if n and (int(tokens.min()) < 0 or int(tokens.max()) >= self.n_vocab):
            raise refuse("the snapshot holds token ids outside the vocabulary")
        return n, tokens, view[tok_end:kv_end], view[kv_end : kv_end + self.state_bytes]
