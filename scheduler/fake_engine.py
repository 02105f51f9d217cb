"""A pure-Python slot pool with the exact protocol of `interface.SlotPool`, for fast tests.

Design: each slot holds its record (token ids) and one 64-bit "KV row" per position, where
row[p] = mix(row[p-1], token[p], p): a hash chain, so a row depends on the WHOLE record up to p.
The logits for a position are a pseudo-random vector seeded by that row. A wrong rewind, copy or
restore therefore changes the sampled tokens, which is what the scheduler tests rely on.

Snapshots are self-describing like the real engine's: a header (magic, version, fingerprint,
token count, row size), the token ids, the rows padded to `row_bytes` per token, and a checksum.

Counters (`num_computed_tokens`, per-slot `computed_tokens`, `num_copied_tokens`, ...) let tests
assert how much prefill really happened. `_inject_fault(slot)` makes the next forward that
includes `slot` fail after validation, emptying that slot only (others in the batch unchanged).
`forward_hook`, if set, is called at the start of every forward (tests use it to hold a step).
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections.abc import Callable, Sequence

import numpy as np

from .interface import BatchItem

_MASK = (1 << 64) - 1
_MAGIC = b"FAKESNAP"
_VERSION = 1
_LAYOUT = 1
# magic, version, layout, n_tokens, row_bytes, fingerprint length
_HEADER = struct.Struct("<8sIIIII")
_DIGEST_LEN = 16


def _mix(h: int, token: int, pos: int) -> int:
    """splitmix64 of the previous row, the token and its position."""
    z = (h ^ (token * 0x9E3779B97F4A7C15) ^ (pos << 32)) & _MASK
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class FakeEngineError(RuntimeError):
    """Compute failure raised by an injected fault."""


class FakeSlotPool:
    def __init__(
        self,
        num_slots: int,
        ctx_len: int,
        n_vocab: int = 64,
        *,
        row_bytes: int = 64,
        model_id: str = "fake-model",
        can_truncate: bool = True,
        can_copy: bool = True,
        can_snapshot: bool = True,
    ) -> None:
        if num_slots < 1 or ctx_len < 2 or n_vocab < 4:
            raise ValueError("FakeSlotPool needs num_slots >= 1, ctx_len >= 2, n_vocab >= 4")
        if row_bytes < 12:
            raise ValueError("row_bytes must be >= 12 (4 for the token id, 8 for the row)")
        self.num_slots = num_slots
        self.ctx_len = ctx_len
        self.n_vocab = n_vocab
        self.row_bytes = row_bytes
        self.kv_bytes = num_slots * ctx_len * row_bytes
        self.fingerprint = f"{model_id}/fake-kv-v{_LAYOUT}/vocab={n_vocab}/row={row_bytes}"
        self.can_truncate = can_truncate
        self.can_copy = can_copy
        self.can_snapshot = can_snapshot
        self._tokens = np.zeros((num_slots, ctx_len), dtype=np.int32)  # [slot, pos]
        self._rows = np.zeros((num_slots, ctx_len), dtype=np.uint64)  # [slot, pos] hash chain
        self._len = [0] * num_slots
        self._faults: set[int] = set()
        self._busy = threading.Lock()
        self.forward_hook: Callable[[Sequence[BatchItem]], None] | None = None
        # Counters for tests.
        self.num_computed_tokens = 0
        self.computed_tokens = [0] * num_slots
        self.num_forward_calls = 0
        self.num_truncates = 0
        self.num_copies = 0
        self.num_copied_tokens = 0
        self.num_snapshots = 0
        self.num_restores = 0
        self.num_concurrent_calls = 0  # must stay 0: the scheduler serialises pool calls
        self.caller_threads: set[int] = set()

    # -- helpers ---------------------------------------------------------------------------
    def _enter(self) -> None:
        self.caller_threads.add(threading.get_ident())
        if not self._busy.acquire(blocking=False):
            self.num_concurrent_calls += 1
            self._busy.acquire()

    def _exit(self) -> None:
        self._busy.release()

    def _check_slot(self, slot: int) -> None:
        if not isinstance(slot, (int, np.integer)) or not 0 <= slot < self.num_slots:
            raise ValueError(f"unknown slot {slot!r}; slots are 0..{self.num_slots - 1}")

    def _logits_at(self, slot: int, pos: int) -> np.ndarray:
        rng = np.random.default_rng(int(self._rows[slot, pos]))
        return rng.standard_normal(self.n_vocab, dtype=np.float32) * np.float32(3.0)

    def _inject_fault(self, slot: int) -> None:
        """Make the next forward that includes `slot` fail (test hook)."""
        self._check_slot(slot)
        self._faults.add(int(slot))

    # -- protocol --------------------------------------------------------------------------
    def slot_len(self, slot: int) -> int:
        self._check_slot(slot)
        return self._len[slot]

    def record(self, slot: int) -> np.ndarray:
        self._check_slot(slot)
        out = self._tokens[slot, : self._len[slot]].copy()
        out.flags.writeable = False
        return out

    def forward(self, batch: Sequence[BatchItem]) -> np.ndarray:
        self._enter()
        try:
            return self._forward(batch)
        finally:
            self._exit()

    def _forward(self, batch: Sequence[BatchItem]) -> np.ndarray:
        if len(batch) == 0:
            raise ValueError("empty batch")
        seen: set[int] = set()
        for item in batch:
            self._check_slot(item.slot)
            if item.slot in seen:
                raise ValueError(f"slot {item.slot} appears twice in one batch")
            seen.add(item.slot)
            toks = np.asarray(item.tokens)
            if toks.ndim != 1 or toks.shape[0] == 0:
                raise ValueError(f"slot {item.slot}: empty item")
            if item.start_pos != self._len[item.slot]:
                raise ValueError(
                    f"slot {item.slot}: start_pos={item.start_pos} but slot_len="
                    f"{self._len[item.slot]}; truncate first"
                )
            if item.start_pos + toks.shape[0] > self.ctx_len:
                raise ValueError(f"slot {item.slot}: position past ctx_len={self.ctx_len}")
            if toks.min() < 0 or toks.max() >= self.n_vocab:
                raise ValueError(f"slot {item.slot}: token id outside vocabulary 0..{self.n_vocab - 1}")
        if self.forward_hook is not None:
            self.forward_hook(batch)
        self.num_forward_calls += 1
        faulted = [item.slot for item in batch if item.slot in self._faults]
        if faulted:
            for slot in faulted:
                self._faults.discard(slot)
                self._len[slot] = 0
            raise FakeEngineError(f"injected fault in slot(s) {faulted}")
        rows = []
        for item in batch:
            slot, pos = item.slot, item.start_pos
            h = int(self._rows[slot, pos - 1]) if pos > 0 else 0
            for tok in np.asarray(item.tokens, dtype=np.int64).tolist():
                h = _mix(h, tok, pos)
                self._tokens[slot, pos] = tok
                self._rows[slot, pos] = h
                pos += 1
            n = pos - item.start_pos
            self._len[slot] = pos
            self.computed_tokens[slot] += n
            self.num_computed_tokens += n
            if item.want_logits:
                rows.append(self._logits_at(slot, pos - 1))
        if not rows:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        return np.stack(rows)

    def truncate(self, slot: int, n: int) -> None:
        self._enter()
        try:
            self._check_slot(slot)
            if not 0 <= n <= self._len[slot]:
                raise ValueError(f"truncate slot {slot} to {n}: must be 0..{self._len[slot]}")
            if not self.can_truncate and n not in (0, self._len[slot]):
                raise ValueError("this pool cannot truncate except to 0 (can_truncate=False)")
            self._len[slot] = n
            self.num_truncates += 1
        finally:
            self._exit()

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        self._enter()
        try:
            if not self.can_copy:
                raise ValueError("this pool cannot copy slots (can_copy=False)")
            self._check_slot(src)
            self._check_slot(dst)
            if src == dst:
                raise ValueError("copy_prefix needs two different slots")
            if not 0 <= n <= self._len[src]:
                raise ValueError(f"copy {n} tokens from slot {src}: it holds {self._len[src]}")
            self._tokens[dst, :n] = self._tokens[src, :n]
            self._rows[dst, :n] = self._rows[src, :n]
            self._len[dst] = n
            self.num_copies += 1
            self.num_copied_tokens += n
        finally:
            self._exit()

    def snapshot(self, slot: int, n: int) -> bytes:
        self._enter()
        try:
            if not self.can_snapshot:
                raise ValueError("this pool cannot snapshot (can_snapshot=False)")
            self._check_slot(slot)
            if not 0 < n <= self._len[slot]:
                raise ValueError(f"snapshot {n} tokens of slot {slot}: it holds {self._len[slot]}")
            fp = self.fingerprint.encode()
            pad = np.zeros(n * (self.row_bytes - 12), dtype=np.uint8)
            payload = self._tokens[slot, :n].tobytes() + self._rows[slot, :n].tobytes() + pad.tobytes()
            digest = hashlib.blake2b(payload, digest_size=_DIGEST_LEN).digest()
            header = _HEADER.pack(_MAGIC, _VERSION, _LAYOUT, n, self.row_bytes, len(fp))
            self.num_snapshots += 1
            return header + fp + digest + payload
        finally:
            self._exit()

    def restore(self, slot: int, snap: bytes) -> int:
        self._enter()
        try:
            if not self.can_snapshot:
                raise ValueError("this pool cannot restore (can_snapshot=False)")
            self._check_slot(slot)
            buf = bytes(snap)
            if len(buf) < _HEADER.size:
                raise ValueError("snapshot too short to hold a header")
            magic, version, layout, n, row_bytes, fp_len = _HEADER.unpack_from(buf)
            if magic != _MAGIC or version != _VERSION:
                raise ValueError("not a snapshot of this engine (bad magic or version)")
            off = _HEADER.size
            fp = buf[off : off + fp_len].decode(errors="replace")
            if fp != self.fingerprint or layout != _LAYOUT or row_bytes != self.row_bytes:
                raise ValueError(f"snapshot of another model/layout ({fp!r})")
            off += fp_len
            digest = buf[off : off + _DIGEST_LEN]
            off += _DIGEST_LEN
            payload = buf[off:]
            if not 0 < n <= self.ctx_len or len(payload) != n * row_bytes:
                raise ValueError("damaged snapshot (length mismatch)")
            if hashlib.blake2b(payload, digest_size=_DIGEST_LEN).digest() != digest:
                raise ValueError("damaged snapshot (checksum mismatch)")
            self._tokens[slot, :n] = np.frombuffer(payload, dtype=np.int32, count=n)
            self._rows[slot, :n] = np.frombuffer(payload, dtype=np.uint64, count=n, offset=4 * n)
            self._len[slot] = n
            self.num_restores += 1
            return n
        finally:
            self._exit()

    # -- reference -------------------------------------------------------------------------
    def reference_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits after feeding `tokens` into an empty slot, computed without touching state."""
        h = 0
        for pos, tok in enumerate(tokens):
            h = _mix(h, int(tok), pos)
        rng = np.random.default_rng(h)
        return rng.standard_normal(self.n_vocab, dtype=np.float32) * np.float32(3.0)
