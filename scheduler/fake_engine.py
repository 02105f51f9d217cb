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

Window (optional, `window=W`): the fake then also models sliding-window layers kept in a ring
of W + `step_tokens` rows per slot, like the C engine's. A windowed row wrow[p] is kept only
while p is among the last W + step_tokens positions the slot computed (`_lo` is the lowest one
still held), and the logits at p also mix the window rows wrow[p-W+1 .. p]. So a truncate deeper
than `min_truncate_len` is refused exactly where the real ring must refuse it, and a restore or
copy that dropped ring rows would change the sampled tokens. A snapshot carries the full-layer
rows of every position but only the W - 1 window rows before its end.

Recurrent (optional, `recurrent=True`): the fake also models a recurrent layer's state (a Gated
DeltaNet matrix, a convolution tail): one value per slot, srow[p] = mix'(srow[p-1], token[p], p),
a second chain the logits at p also mix in, held only for the current length, so the slot can
only be extended (`min_truncate_len == slot_len`; interface.py). `rollback=k` keeps the states
of the last k lengths as well, so a cut of at most k tokens is exact. States the pool no longer
holds are scrambled, so a restore, copy or rewind that used one would change the sampled tokens
(and trips an assert first). A snapshot carries the state at its end, padded to `state_bytes`
(a real one is tens of MiB: tests that size budgets set it); a restored or copied slot starts
with no rollback history. Copies and snapshots accept the lengths truncate does.
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
_VERSION = 2
_LAYOUT = 1
# magic, version, layout, n_tokens, row_bytes, window (0: none), first window row, fingerprint length
_HEADER = struct.Struct("<8sIIIIIII")
_DIGEST_LEN = 16
_STATE_SALT = 0xD3C0DE5EEDF00D  # makes the recurrent chain differ from the KV chain


def _window_seed(h: int, wrows: np.ndarray) -> int:
    """Mix a position's chain row with the window rows it attends to (uint64 [k])."""
    acc = 0
    for r in wrows.tolist():
        acc = _mix(acc, int(r) & 0x7FFFFFFF, int(r) >> 33)
    return _mix(h, acc & 0x7FFFFFFF, acc >> 33)


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
        window: int | None = None,
        step_tokens: int = 64,
        recurrent: bool = False,
        rollback: int = 0,
        state_bytes: int = 256,
        copy_bias: float = 0.0,
    ) -> None:
        if num_slots < 1 or ctx_len < 2 or n_vocab < 4:
            raise ValueError("FakeSlotPool needs num_slots >= 1, ctx_len >= 2, n_vocab >= 4")
        if row_bytes < 12:
            raise ValueError("row_bytes must be >= 12 (4 for the token id, 8 for the row)")
        if window is not None and (window < 2 or step_tokens < 1):
            raise ValueError("FakeSlotPool needs window >= 2 and step_tokens >= 1 (or window=None)")
        if rollback < 0 or (rollback > 0 and not recurrent) or state_bytes < 8:
            raise ValueError(
                "FakeSlotPool needs rollback >= 0 (only with recurrent=True) and state_bytes >= 8"
            )
        self.num_slots = num_slots
        self.ctx_len = ctx_len
        self.n_vocab = n_vocab
        # > 0: an "induction head" (for speculative decoding tests): at most positions the token
        # that followed the latest earlier occurrence of the current token gets this much extra
        # logit, so generated text copies the prompt the way agent output does
        self.copy_bias = copy_bias
        self.row_bytes = row_bytes
        self.kv_window = window
        self.ring_len = 0 if window is None else min(ctx_len, window + step_tokens)  # rows per ring
        self.recurrent = recurrent
        self.rollback = rollback
        self.state_bytes = state_bytes if recurrent else 0  # one state's bytes in a snapshot
        self.kv_bytes = num_slots * (
            (ctx_len + self.ring_len) * row_bytes + (1 + rollback) * self.state_bytes
        )
        self.fingerprint = (
            f"{model_id}/fake-kv-v{_LAYOUT}/vocab={n_vocab}/row={row_bytes}"
            + (f"/window={window}" if window is not None else "")
            + (f"/recurrent={state_bytes}" if recurrent else "")
        )
        # NOTE: can_truncate=False models a pool that can never cut a slot back (min_truncate_len
        # is always slot_len); it is not part of the protocol any more.
        self._can_truncate = can_truncate
        self.can_copy = can_copy
        self.can_snapshot = can_snapshot
        self._tokens = np.zeros((num_slots, ctx_len), dtype=np.int32)  # [slot, pos]
        self._rows = np.zeros((num_slots, ctx_len), dtype=np.uint64)  # [slot, pos] hash chain
        self._wrows = np.zeros((num_slots, ctx_len), dtype=np.uint64)  # [slot, pos] window rows
        self._lo = [0] * num_slots  # lowest position whose window row the ring still holds
        self._srows = np.zeros((num_slots, ctx_len), dtype=np.uint64)  # [slot, pos] state after pos
        self._sfloor = [0] * num_slots  # shortest length whose recurrent state the slot holds
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

    @property
    def _reach(self) -> int:
        """Window rows a position attends to before itself."""
        return 0 if self.kv_window is None else self.kv_window - 1

    def _logits_at(self, slot: int, pos: int) -> np.ndarray:
        seed = int(self._rows[slot, pos])
        if self.kv_window is not None:
            first = max(0, pos - self._reach)
            assert first >= self._lo[slot], f"slot {slot}: ring lost row {first} (holds {self._lo[slot]}..)"
            seed = _window_seed(seed, self._wrows[slot, first : pos + 1])
        if self.recurrent:
            assert pos + 1 >= self._sfloor[slot], f"slot {slot}: no state at length {pos + 1}"
            seed = _mix(seed, int(self._srows[slot, pos]) & 0x7FFFFFFF, int(self._srows[slot, pos]) >> 33)
        rng = np.random.default_rng(seed)
        logits: np.ndarray = rng.standard_normal(self.n_vocab, dtype=np.float32) * np.float32(3.0)
        if self.copy_bias:
            self._add_copy_bias(logits, self._tokens[slot, : pos + 1], seed)
        return logits

    def _add_copy_bias(self, logits: np.ndarray, tokens: np.ndarray, seed: int) -> None:
        """Favour what followed the latest earlier occurrence of tokens[-1] (a pure function of
        the record, so reuse stays exact); one position in five (by its row's hash) is left alone."""
        if seed % 5 == 0 or tokens.shape[0] < 2:
            return
        hits = np.flatnonzero(tokens[:-1] == tokens[-1])
        if hits.size:
            logits[int(tokens[int(hits[-1]) + 1])] += np.float32(self.copy_bias)

    def _drop_ring_rows(self, slot: int, lo: int) -> None:
        """The ring overwrote every window row below `lo`: forget them (scrambled, not kept)."""
        if lo > self._lo[slot]:
            self._wrows[slot, self._lo[slot] : lo] = np.uint64(0x5EED)
            self._lo[slot] = lo

    def _drop_states(self, slot: int, floor: int) -> None:
        """The slot no longer holds the recurrent state of any length below `floor` (nor above
        its length): scramble them, so a use of one changes the logits."""
        if not self.recurrent:
            return
        self._srows[slot, : max(0, floor - 1)] = np.uint64(0x5EED)
        self._srows[slot, self._len[slot] :] = np.uint64(0x5EED)
        self._sfloor[slot] = floor

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
        out: np.ndarray = self._tokens[slot, : self._len[slot]].copy()
        out.flags.writeable = False
        return out

    def min_truncate_len(self, slot: int) -> int:
        self._check_slot(slot)
        if not self._can_truncate:
            return self._len[slot]
        ring = 0 if self.kv_window is None or self._lo[slot] == 0 else self._lo[slot] + self._reach
        return max(ring, self._sfloor[slot]) if self.recurrent else ring

    def restored_min_truncate_len(self, n: int) -> int:
        if not self._can_truncate or self.recurrent:
            return n
        return 0 if self.kv_window is None or n <= self._reach else n

    def snapshot_nbytes(self, n: int) -> int:
        window_rows = 0 if self.kv_window is None else min(n, self._reach)
        return (
            _HEADER.size
            + len(self.fingerprint.encode())
            + _DIGEST_LEN
            + (n + window_rows) * self.row_bytes
            + self.state_bytes
        )

    def _check_cut(self, slot: int, n: int, what: str) -> None:
        """ValueError unless n is a length `slot` can be cut back to (see interface.py)."""
        if not isinstance(n, (int, np.integer)) or not 0 <= n <= self._len[slot]:
            raise ValueError(f"{what} slot {slot} to {n}: must be 0..{self._len[slot]}")
        floor = self.min_truncate_len(slot)
        if n < floor:
            if not self._can_truncate:
                why = "can_truncate=False"
            elif self.recurrent and floor == self._sfloor[slot]:
                why = f"recurrent state, rollback {self.rollback}: it holds no state that short"
            else:
                why = f"window {self.kv_window}: the ring has overwritten the rows a deeper cut needs"
            raise ValueError(
                f"{what} slot {slot} to {n}: the slot can only be cut back to {floor} ({why}); "
                "restore a checkpoint instead"
            )

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
            if not 0 <= int(item.want_logits) <= toks.shape[0]:
                raise ValueError(
                    f"slot {item.slot}: want_logits={item.want_logits} rows of an item of {toks.shape[0]} tokens"
                )
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
                self._lo[slot] = 0
                self._drop_states(slot, 0)
            raise FakeEngineError(f"injected fault in slot(s) {faulted}")
        rows: list[np.ndarray] = []
        for item in batch:
            slot, pos = item.slot, item.start_pos
            assert self._lo[slot] == 0 or pos - self._reach >= self._lo[slot], "ring state broken"
            h = int(self._rows[slot, pos - 1]) if pos > 0 else 0
            assert not self.recurrent or self._sfloor[slot] <= pos, "recurrent state broken"
            st = int(self._srows[slot, pos - 1]) if pos > 0 else 0
            for tok in np.asarray(item.tokens, dtype=np.int64).tolist():
                h = _mix(h, tok, pos)
                self._tokens[slot, pos] = tok
                self._rows[slot, pos] = h
                self._wrows[slot, pos] = h
                if self.recurrent:
                    st = _mix(st ^ _STATE_SALT, tok, pos)
                    self._srows[slot, pos] = st
                pos += 1
            n = pos - item.start_pos
            self._len[slot] = pos
            if self.kv_window is not None:  # the ring holds the last ring_len positions
                self._drop_ring_rows(slot, max(0, pos - self.ring_len))
            if self.recurrent:  # the current state, and the last `rollback` ones
                self._drop_states(slot, max(self._sfloor[slot], pos - self.rollback))
            self.computed_tokens[slot] += n
            self.num_computed_tokens += n
            want = int(item.want_logits)
            rows.extend(self._logits_at(slot, p) for p in range(pos - want, pos))
        if not rows:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        return np.stack(rows)

    def truncate(self, slot: int, n: int) -> None:
        self._enter()
        try:
            self._check_slot(slot)
            if n != 0:
                self._check_cut(slot, n, "truncate")
            self._len[slot] = n
            if n == 0:
                self._lo[slot] = 0
            self._drop_states(slot, 0 if n == 0 else self._sfloor[slot])
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
            if n != 0:
                self._check_cut(src, n, "copy_prefix from")
            lo = self._lo[src] if n else 0
            self._tokens[dst, :n] = self._tokens[src, :n]
            self._rows[dst, :n] = self._rows[src, :n]
            self._wrows[dst, :n] = self._wrows[src, :n]
            self._srows[dst, :n] = self._srows[src, :n]
            self._lo[dst] = 0
            self._drop_ring_rows(dst, lo)
            self._len[dst] = n
            self._drop_states(dst, n)
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
            self._check_cut(slot, n, "snapshot")
            fp = self.fingerprint.encode()
            wlo = n if self.kv_window is None else max(0, n - self._reach)
            pad = np.zeros(n * (self.row_bytes - 12) + (n - wlo) * (self.row_bytes - 8), dtype=np.uint8)
            state = b""
            if self.recurrent:
                state = self._srows[slot, n - 1 : n].tobytes() + bytes(self.state_bytes - 8)
            payload = (
                self._tokens[slot, :n].tobytes()
                + self._rows[slot, :n].tobytes()
                + self._wrows[slot, wlo:n].tobytes()
                + pad.tobytes()
                + state
            )
            digest = hashlib.blake2b(payload, digest_size=_DIGEST_LEN).digest()
            header = _HEADER.pack(
                _MAGIC, _VERSION, _LAYOUT, n, self.row_bytes, self.kv_window or 0, wlo, len(fp)
            )
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
            magic, version, layout, n, row_bytes, window, wlo, fp_len = _HEADER.unpack_from(buf)
            if magic != _MAGIC or version != _VERSION:
                raise ValueError("not a snapshot of this engine (bad magic or version)")
            off = _HEADER.size
            fp = buf[off : off + fp_len].decode(errors="replace")
            if fp != self.fingerprint or layout != _LAYOUT or row_bytes != self.row_bytes:
                raise ValueError(f"snapshot of another model/layout ({fp!r})")
            if window != (self.kv_window or 0):
                raise ValueError(f"snapshot of another KV layout (window {window}, pool {self.kv_window})")
            off += fp_len
            digest = buf[off : off + _DIGEST_LEN]
            off += _DIGEST_LEN
            payload = buf[off:]
            want_wlo = n if self.kv_window is None else max(0, n - self._reach)
            if not 0 < n <= self.ctx_len or wlo != want_wlo or len(payload) != self.snapshot_nbytes(n) - off:
                raise ValueError("damaged snapshot (length mismatch)")
            if hashlib.blake2b(payload, digest_size=_DIGEST_LEN).digest() != digest:
                raise ValueError("damaged snapshot (checksum mismatch)")
            self._tokens[slot, :n] = np.frombuffer(payload, dtype=np.int32, count=n)
            self._rows[slot, :n] = np.frombuffer(payload, dtype=np.uint64, count=n, offset=4 * n)
            self._wrows[slot, wlo:n] = np.frombuffer(payload, dtype=np.uint64, count=n - wlo, offset=12 * n)
            if self.recurrent:
                at = len(payload) - self.state_bytes
                self._srows[slot, n - 1] = np.frombuffer(payload, dtype=np.uint64, count=1, offset=at)[0]
            self._lo[slot] = 0
            if self.kv_window is not None:
                self._drop_ring_rows(slot, wlo)
            self._len[slot] = n
            self._drop_states(slot, n)
            self.num_restores += 1
            return int(n)
        finally:
            self._exit()

    # -- reference -------------------------------------------------------------------------
    def reference_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits after feeding `tokens` into an empty slot, computed without touching state."""
        h, chain = 0, []
        for pos, tok in enumerate(tokens):
            h = _mix(h, int(tok), pos)
            chain.append(h)
        if self.kv_window is not None:
            p = len(chain) - 1
            h = _window_seed(h, np.array(chain[max(0, p - self._reach) : p + 1], dtype=np.uint64))
        if self.recurrent:
            st = 0
            for pos, tok in enumerate(tokens):
                st = _mix(st ^ _STATE_SALT, int(tok), pos)
            h = _mix(h, st & 0x7FFFFFFF, st >> 33)
        rng = np.random.default_rng(h)
        logits: np.ndarray = rng.standard_normal(self.n_vocab, dtype=np.float32) * np.float32(3.0)
        if self.copy_bias:
            self._add_copy_bias(logits, np.asarray(tokens, dtype=np.int32), h)
        return logits
