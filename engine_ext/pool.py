"""SlotPool: the engine as the scheduler sees it (scheduler/interface.py), on the C engine.

Design: `_engine.Engine` owns the C memory (KV for every slot, step buffers, threads) and runs
the forward pass with the GIL released; this class owns the contracts: argument validation
(ValueError before anything changes), the per-slot record of token ids, the taint rule on a
failed step, the snapshots (their format: header, token ids, KV, recurrent state, crc32, is
snapshot_format.py's) and the test fault hook. One lock serialises calls.

Rings (models with sliding-window layers, unless swa_full): those layers keep a ring of
ring_len rows per slot (engine_kv.c), so a slot remembers, per window layer, only the positions
[ring_lo, slot_len). `_ring_lo[slot]` tracks it: every forward raises it to (new length -
ring_len), a truncate never lowers it (the rows a cut discards overwrote older ones), a restore
sets it to n - (window - 1), emptying resets it. A slot can be cut back to n when the ring still
holds the window - 1 positions before n: min_truncate_len = ring_lo + window - 1 (0 while ring_lo
is 0). A ring snapshot carries exactly those window - 1 rows per ring layer; the fingerprint
names the ring, so ring and full-KV snapshots never cross.

Short convolutions (lfm2): such a layer keeps, instead of keys and values, its conv input (b * x,
dim values in the KV dtype; f16 when the KV is q8_0) per position, in the KV's place in the snapshot (engine.h), so it is
rewound, copied and snapshotted exactly like full KV (min_truncate_len stays 0); the fingerprint
names the conv length, so snapshots never cross into a layout without it.

Recurrent state (qwen35's Gated DeltaNet, granitehybrid's Mamba2 layers): a slot holds one state,
the one at its length, so it can only be extended (scheduler/interface.py). `_rs_lo[slot]` is the shortest length whose
state the slot still holds: its length, or with a rollback ring of k states (SlotPool(rollback=k),
engine.h) down to length - k while the slot went through those lengths since it was last emptied,
restored or copied into. Every forward from L0 to L1 sets it to max(_rs_lo, L1 - k) (0 when L0 is
0: a slot starts at the zero state); a truncate to n >= it leaves it and moves no bytes (the
engine keeps length m's state in entry m % (k + 1): `_state_at`); a restore or a copy into a
slot sets it to n. min_truncate_len is that (0 for
an empty slot). A snapshot of n carries the state at n (live or from the ring) after the KV; the
fingerprint names the recurrent layout, so such snapshots never cross into another pool's layout.
An injected fault fires before any state changes (engine.c), so it empties the faulted slot only,
like on KV; any other failure empties every slot of the batch.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import _engine
from .gguf_file import ModelFile, load_model_file
from .snapshot_format import KV_DTYPE_CODES, LAYOUT_VERSION, SnapshotFormat

KERNELS_ENV = "SLOTSERVE_KERNELS"  # auto | scalar | avx2 | avx512vnni: which kernel variant pools use
# Variants whose results are bit-identical share one name in the fingerprint (avx512vnni is
# avx2 with the same integer sums on other instructions; tests/engine/test_kernels.py holds
# them to ==), so snapshots move between them.
NUMERICS = {"avx512vnni": "avx2"}
MAX_ROLLBACK = 64  # states a rollback ring may keep per slot (each is engine_state_bytes)
MAX_DIM = 1 << 30  # bound on num_slots, ctx_len, max_batch_tokens: positions stay C ints with room

_ENGINE_FAULT = -3  # engine.h ENGINE_EFAULT


class ComputeError(RuntimeError):
    """A forward step failed inside the engine. `tainted` names the slots that were emptied;
    every other slot of the batch is back to its length before the step (a step only writes KV
    rows past each slot's length, so the rows it holds were never touched)."""

    def __init__(self, message: str, tainted: tuple[int, ...]):
        super().__init__(message)
        self.tainted = tainted


def kernel_variant(kernels: str | None = None) -> str:
    """The kernel variant pools use: `kernels` if given, else $SLOTSERVE_KERNELS, else "auto",
    resolved against this CPU ("avx512vnni", "avx2" or "scalar"). ValueError for an unknown or unsupported
    name (the message lists the valid ones)."""
    name = kernels if kernels is not None else os.environ.get(KERNELS_ENV, "auto") or "auto"
    try:
        return _engine.resolve_variant(name.strip().lower())
    except ValueError as exc:
        source = "kernels=" if kernels is not None else f"${KERNELS_ENV}="
        raise ValueError(f"{source}{name!r}: {exc}") from None


def _default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _weights_digest(model: ModelFile) -> str:
    """A cheap digest of the weight bytes (start, middle and end of every tensor), so two models
    with identical metadata and shapes but different weights get different fingerprints."""
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(model.tensors):
        data = model.tensors[name].data
        n = data.shape[0]
        for start in (0, max(0, n // 2 - 2048), max(0, n - 4096)):
            h.update(data[start : start + 4096].tobytes())
    return h.hexdigest()


class SlotPool:
    """num_slots KV slots of ctx_len tokens on one model (see scheduler/interface.py).

    Arguments: model (a ModelFile or a GGUF path), num_slots >= 1, ctx_len >= 1; threads
    (default: the CPUs this process may use), kv_dtype "f16" (default), "f32" or
    "q8_0" (8-bit keys and values with an f16 scale per 32 values: 53% of f16's bytes;
    head_dim a multiple of 32),
    max_batch_tokens (rows of one internal step; longer forwards run in several steps; the
    results are identical), kernels (None: $SLOTSERVE_KERNELS or auto), swa_full (keep every
    row of sliding-window layers too: every length rewindable, more memory; default: rings),
    rollback (recurrent models: keep the states of the last k lengths per slot so a slot can be
    cut back by up to k tokens exactly; 0, the default, keeps none). All KV and recurrent state
    memory is allocated here and reported as kv_bytes (the state part also as state_bytes, per
    slot and state).
    """

    can_copy = True
    can_snapshot = True

    def __init__(
        self,
        model: ModelFile | str | os.PathLike[str],
        num_slots: int,
        ctx_len: int,
        *,
        threads: int | None = None,
        kv_dtype: str = "f16",
        max_batch_tokens: int = 512,
        kernels: str | None = None,
        swa_full: bool = False,
        rollback: int = 0,
    ) -> None:
        if not isinstance(model, ModelFile):
            model = load_model_file(Path(model))
        for name, value in (
            ("num_slots", num_slots),
            ("ctx_len", ctx_len),
            ("max_batch_tokens", max_batch_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIM:
                raise ValueError(f"{name} must be an integer in 1..{MAX_DIM}, got {value!r}")
        if threads is None:
            threads = _default_threads()
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 256:
            raise ValueError(f"threads must be an integer in 1..256, got {threads!r}")
        if kv_dtype not in KV_DTYPE_CODES:
            raise ValueError(f"kv_dtype must be one of {sorted(KV_DTYPE_CODES)}, got {kv_dtype!r}")
        recurrent = model.config.has_recurrent_state
        if isinstance(rollback, bool) or not isinstance(rollback, int) or not 0 <= rollback <= MAX_ROLLBACK:
            raise ValueError(f"rollback must be an integer in 0..{MAX_ROLLBACK}, got {rollback!r}")
        if rollback and not recurrent:
            raise ValueError(
                "rollback keeps recurrent states; this model has none (every length is rewindable)"
            )
        variant = kernel_variant(kernels)
        weights_digest = _weights_digest(model)  # before the engine: packing gives these pages back
        self._model = model
        self._cfg = model.config
        self._engine = _engine.Engine(
            model, num_slots, ctx_len, threads, kv_dtype, max_batch_tokens, variant, not swa_full, rollback
        )
        self.ring_len = int(self._engine.ring_len)  # rows of a ring layer's planes; 0: no rings
        # widest window of the ring layers; None: every layer keeps every row (any cut is exact)
        self.kv_window: int | None = max(self._cfg.layer_windows) if self.ring_len else None
        self._reach = self.kv_window - 1 if self.kv_window is not None else 0
        self.num_slots = num_slots
        self.ctx_len = ctx_len
        self.n_vocab = self._cfg.n_vocab
        self.kv_dtype = kv_dtype
        self.recurrent = recurrent
        self.rollback = rollback
        self.state_bytes = int(self._engine.state_bytes)  # one slot's recurrent state; 0 without
        self.kv_bytes = int(self._engine.kv_bytes) + num_slots * (1 + rollback) * self.state_bytes
        self.kernel_variant = self._engine.kernel_variant
        self.n_threads = int(self._engine.n_threads)
        self.max_batch_tokens = max_batch_tokens
        # NOTE: the kernel variant is part of the identity: scalar and AVX2 kernels sum in other
        # orders, so KV from one continued by the other would not match a cold run bit for bit.
        numerics = NUMERICS.get(self.kernel_variant, self.kernel_variant)
        self.fingerprint = (
            f"{model.fingerprint}-{weights_digest}"
            f"/kv={kv_dtype}/layout={LAYOUT_VERSION}/kernels={numerics}"
            + (f"/ring={self.kv_window}" if self.kv_window is not None else "")
            + (f"/conv_rows={self._cfg.conv_len}" if self._cfg.conv_len else "")
            + (f"/recurrent=f32x{self.state_bytes}" if recurrent else "")
        )
        self._snap = SnapshotFormat(
            fingerprint=self.fingerprint.encode(),
            kv_dtype=kv_dtype,
            n_layers=self._cfg.n_layers,
            n_kv_heads=self._cfg.n_kv_heads,
            head_dim=self._cfg.head_dim,
            n_vocab=self.n_vocab,
            ctx_len=ctx_len,
            state_bytes=self.state_bytes,
            kv_bytes=self._engine.kv_snapshot_bytes,  # the engine's, not the pool's: no cycle
        )
        self._records = np.zeros((num_slots, ctx_len), np.int32)  # [slot][pos] token ids
        self._lens = [0] * num_slots  # tokens held per slot
        self._ring_lo = [0] * num_slots  # lowest position every ring of the slot still holds
        self._rs_lo = [0] * num_slots  # shortest length whose recurrent state the slot holds
        self._faults: set[int] = set()  # slots whose next forward fails (test hook)
        self._lock = threading.Lock()

    # -- inspection ------------------------------------------------------------------------

    def slot_len(self, slot: int) -> int:
        return self._lens[self._slot(slot)]

    def record(self, slot: int) -> np.ndarray:
        slot = self._slot(slot)
        out = self._records[slot, : self._lens[slot]].copy()
        out.setflags(write=False)
        return out

    def min_truncate_len(self, slot: int) -> int:
        """See the module docstring: 0 for full KV or a ring that has not wrapped; for recurrent
        state the shortest length whose state the slot holds."""
        slot = self._slot(slot)
        if self.recurrent:
            return self._rs_lo[slot] if self._lens[slot] else 0
        lo = self._ring_lo[slot]
        return 0 if lo == 0 else lo + self._reach

    def restored_min_truncate_len(self, n: int) -> int:
        if self.recurrent:
            return n
        return 0 if self.kv_window is None or n <= self._reach else n

    def snapshot_nbytes(self, n: int) -> int:
        return self._snap.nbytes(n)

    def check_integrity(self) -> None:
        """Assert the pool's invariants (for tests)."""
        assert len(self._lens) == self.num_slots
        assert all(0 <= n <= self.ctx_len for n in self._lens)
        assert all(self.min_truncate_len(s) <= self._lens[s] for s in range(self.num_slots))
        assert all(lo == 0 for lo, n in zip(self._ring_lo, self._lens) if n == 0)
        assert all(
            lo <= n and (not self.recurrent or n - lo <= self.rollback)
            for lo, n in zip(self._rs_lo, self._lens)
        )
        assert all(0 <= s < self.num_slots for s in self._faults)

    # -- compute ---------------------------------------------------------------------------

    def forward(self, batch: Sequence[Any]) -> np.ndarray:
        """See scheduler.interface.SlotPool.forward. Items are BatchItem-like objects (slot,
        tokens, start_pos, want_logits) or 4-tuples in that order."""
        with self._lock:
            items = self._parse_batch(batch)
            meta = np.array([(s, p, len(t), w) for s, t, p, w in items], dtype=np.int32).reshape(-1, 4)
            tokens = np.concatenate([t for _, t, _, _ in items])
            logits = np.empty((sum(w for *_, w in items), self.n_vocab), np.float32)
            slots = [s for s, _, _, _ in items]
            faulted = tuple(s for s in slots if s in self._faults)
            self._faults.difference_update(slots)
            try:
                status = self._engine.forward(meta, tokens, logits, 0 if faulted else -1)
                if status == _ENGINE_FAULT:
                    # NOTE: the failure is attributable (the injected slot), so only it is emptied.
                    raise ComputeError(
                        f"injected fault in slot(s) {list(faulted)} of a step over slots {slots}", faulted
                    )
                if status != 0:
                    raise ComputeError(
                        f"engine status {status} in a forward step over slots {slots}", tuple(slots)
                    )
            except ComputeError as exc:
                for s in exc.tainted:  # their KV rows may be half written; the record says "empty"
                    self._empty(s)
                self._after_failed_rings(items, exc.tainted)
                raise
            except BaseException:
                for s in slots:  # not attributable: none of the batch's slots can be vouched for
                    self._empty(s)
                raise
            for s, t, p, _ in items:
                self._records[s, p : p + len(t)] = t
                self._lens[s] = p + len(t)
                if self.recurrent:
                    self._rs_lo[s] = max(self._rs_lo[s] if p else 0, p + len(t) - self.rollback)
                if self.ring_len:
                    self._ring_lo[s] = max(self._ring_lo[s], p + len(t) - self.ring_len)
        return logits

    def _empty(self, slot: int) -> None:
        self._lens[slot] = 0
        self._ring_lo[slot] = 0
        self._rs_lo[slot] = 0

    def _state_at(self, n: int) -> int:
        """The engine state entry of a slot's state at length n (held when _check_cut allows n):
        the engine keeps length m's state in entry m % (rollback + 1), engine.h."""
        return n % (self.rollback + 1)

    def _after_failed_rings(
        self, items: list[tuple[int, np.ndarray, int, int]], tainted: tuple[int, ...]
    ) -> None:
        """A failed step may have written ring rows of the items' new positions, overwriting old
        ones: assume it wrote them all. A slot whose ring then lacks rows its next position needs
        is emptied (only possible for an item longer than one internal step)."""
        if not self.ring_len:
            return
        for s, t, p, _ in items:
            if s in tainted:
                continue
            self._ring_lo[s] = max(self._ring_lo[s], p + len(t) - self.ring_len)
            if self.min_truncate_len(s) > self._lens[s]:
                self._empty(s)

    def _parse_batch(self, batch: Sequence[Any]) -> list[tuple[int, np.ndarray, int, int]]:
        if batch is None or len(batch) == 0:
            raise ValueError("forward: empty batch; pass at least one item")
        items, seen = [], set()
        for i, item in enumerate(batch):
            if isinstance(item, tuple) and len(item) == 4:
                slot, tokens, start_pos, want = item
            else:
                try:
                    slot, tokens, start_pos, want = item.slot, item.tokens, item.start_pos, item.want_logits
                except AttributeError:
                    raise ValueError(
                        f"forward: item {i} is neither a BatchItem nor a 4-tuple "
                        "(slot, tokens, start_pos, want_logits)"
                    ) from None
            slot = self._slot(slot)
            if slot in seen:
                raise ValueError(
                    f"forward: slot {slot} appears twice in one batch; merge its tokens into one item"
                )
            seen.add(slot)
            arr = np.asarray(tokens)
            if arr.ndim != 1 or arr.size == 0:
                raise ValueError(f"forward: item {i} (slot {slot}) needs a non-empty 1-D array of token ids")
            if arr.dtype.kind not in "iu":
                raise ValueError(
                    f"forward: item {i} (slot {slot}) token ids must be integers, got {arr.dtype}"
                )
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= self.n_vocab:
                bad = lo if lo < 0 else hi
                raise ValueError(
                    f"forward: item {i} (slot {slot}) token id {bad} is outside the vocabulary "
                    f"[0, {self.n_vocab})"
                )
            if isinstance(start_pos, bool) or not isinstance(start_pos, (int, np.integer)):
                raise ValueError(f"forward: item {i} start_pos must be an integer, got {start_pos!r}")
            start_pos = int(start_pos)
            if start_pos != self._lens[slot]:
                raise ValueError(
                    f"forward: item {i} starts at position {start_pos} but slot {slot} holds "
                    f"{self._lens[slot]} tokens; truncate the slot first or feed from its end"
                )
            if start_pos + arr.size > self.ctx_len:
                raise ValueError(
                    f"forward: slot {slot} would reach position {start_pos + arr.size} > ctx_len "
                    f"{self.ctx_len}; shorten the prompt or use a larger ctx_len"
                )
            if isinstance(want, (bool, np.bool_)):
                want = int(want)
            if not isinstance(want, (int, np.integer)) or not 0 <= want <= arr.size:
                raise ValueError(
                    f"forward: item {i} (slot {slot}) want_logits={want!r}: give a number of its last "
                    f"rows in 0..{arr.size} (True = 1, the last row)"
                )
            items.append((slot, arr.astype(np.int32, copy=False), start_pos, int(want)))
        return items

    # -- slot surgery -----------------------------------------------------------------------

    def truncate(self, slot: int, n: int) -> None:
        slot = self._slot(slot)
        with self._lock:
            self._check_len(n, self._lens[slot], f"truncate: slot {slot}")
            if n == 0:
                self._empty(slot)
                return
            self._check_cut(slot, n, "truncate")
            self._lens[slot] = n  # a recurrent state at n stays in its entry (_state_at): no copy

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        src, dst = self._slot(src), self._slot(dst)
        with self._lock:
            self._check_len(n, self._lens[src], f"copy_prefix: source slot {src}")
            if n == 0:
                self._empty(dst)
                return
            self._check_cut(src, n, "copy_prefix")
            if self.recurrent and src != dst:
                self._engine.state_copy(src, self._state_at(n), dst)
            if src != dst:
                self._engine.kv_copy(src, dst, n)
                self._records[dst, :n] = self._records[src, :n]
                self._rs_lo[dst] = n
            self._lens[dst] = n
            self._ring_lo[dst] = self._ring_lo[src]

    def snapshot(self, slot: int, n: int) -> bytes:
        slot = self._slot(slot)
        with self._lock:
            self._check_len(n, self._lens[slot], f"snapshot: slot {slot}")
            self._check_cut(slot, n, "snapshot")
            head = self._snap.header(n)
            body = self._engine.kv_snapshot(slot, n, head + self._records[slot, :n].tobytes())
            if self.recurrent:
                body += self._engine.state_read(slot, self._state_at(n))
        return self._snap.sealed(body)

    def restore(self, slot: int, snap: bytes) -> int:
        slot = self._slot(slot)
        view = memoryview(snap).cast("B")
        n, tokens, kv, state = self._snap.parse(view)
        with self._lock:
            self._engine.kv_restore(slot, n, kv)
            if self.recurrent:
                self._engine.state_write(slot, self._state_at(n), state)
            self._records[slot, :n] = tokens
            self._lens[slot] = n
            self._ring_lo[slot] = max(0, n - self._reach) if self.ring_len else 0
            self._rs_lo[slot] = n
        return n

    # -- test hook ---------------------------------------------------------------------------

    def _inject_fault(self, slot: int) -> None:
        """Make the next forward that touches `slot` fail inside the engine (after the first
        layer has written KV rows), as a compute error would: it raises ComputeError and empties
        that slot only; the other slots of the batch keep what they held before the step.
        For tests of the taint rule."""
        self._faults.add(self._slot(slot))

    # -- helpers ---------------------------------------------------------------------------

    def _slot(self, slot: Any) -> int:
        if (
            isinstance(slot, bool)
            or not isinstance(slot, (int, np.integer))
            or not 0 <= slot < self.num_slots
        ):
            raise ValueError(f"unknown slot {slot!r}: slots are 0..{self.num_slots - 1}")
        return int(slot)

    def _check_cut(self, slot: int, n: int, what: str) -> None:
        floor = self.min_truncate_len(slot)
        if n < floor and self.recurrent:
            raise ValueError(
                f"{what}: slot {slot} can only be cut back to {floor} tokens (its recurrent state "
                f"summarises all {self._lens[slot]}; the rollback ring holds {self.rollback} earlier states); "
                "restore a checkpoint instead"
            )
        if n < floor:
            raise ValueError(
                f"{what}: slot {slot} can only be cut back to {floor} tokens (its sliding-window "
                f"ring of {self.ring_len} rows has overwritten the rows a cut to {n} needs); restore "
                "a checkpoint instead, or run with swa_full"
            )

    @staticmethod
    def _check_len(n: Any, have: int, what: str) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= have:
            raise ValueError(f"{what} holds {have} tokens; n must be an integer in 0..{have}, got {n!r}")
