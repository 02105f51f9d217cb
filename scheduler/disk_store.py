"""Disk checkpoint tier (opt-in): KV snapshots as files that survive a restart.

Design: files live in `<dir>/<model-id>/`, where model-id is a digest of the pool's fingerprint
(model + KV layout), one file per exact token prefix:

    magic "SSKVCKPT" | u32 version | 32B sha256(fingerprint) | u32 n_tokens | u16 rule length
    | rule | u64 data length | 32B sha256(tokens + data) | int32 tokens [n] | snapshot data

A write goes to a temporary file, is fsynced, then renamed into place (and the directory
fsynced), so a crash never leaves a half-written checkpoint under a real name. Writes run on
one background IO thread; the event loop never waits for the disk. The index (tokens and sizes,
not the data) is rebuilt by that thread after a restart by reading each file's header. LRU
within the space budget uses the files' mtimes, refreshed on every load. Like the memory tier,
the files hold distinct rows: a write that a file already holds (exactly, or as the start of a
longer file a restored slot can be cut back from) is skipped, and a written file replaces the
files that are prefixes of it. Lookups go through a PrefixIndex (prefix_index.py), as in the
memory tier: any file sharing a prefix with a prompt is found. A file with a bad
header, another fingerprint or a bad checksum is removed and never handed to the pool. An
unwritable or full directory logs one warning and serving goes on without the disk tier's help.

The sibling folders of `<dir>/<model-id>/` hold the checkpoints of other models or KV layouts
(another model file, kernel variant or context layout served from the same directory before).
They are useless to this pool but take disk: the IO thread finds them at start (only
`<16 hex digits>/*.kvc` files that start with the magic, and temporary files of a writer
that died; nothing else under the directory is touched), counts their bytes against the budget,
and removes them oldest first whenever the budget is exceeded, before any checkpoint of this
pool. Each removal logs one line naming the folders and what was freed.

    <dir>/                      --kv-disk-dir: budget = this pool's files + the foreign files
      3f2a9c0d1e5b7a64/         this pool (model-id): LRU by mtime
      b81c02d9e4f6a713/         another model or layout: removed first, oldest first
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import re
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .checkpoint_store import RestoredFloor, best_match, covers, no_floor, tokens_key
from .policy import CheckpointMatch, CheckpointTier
from .prefix_index import PrefixIndex

log = logging.getLogger("slotserve.scheduler.disk")

_MAGIC = b"SSKVCKPT"
_VERSION = 1
_FIXED = struct.Struct("<8sI32sIH")  # magic, version, fingerprint digest, n_tokens, rule length
_TAIL = struct.Struct("<Q32s")  # data length, checksum
_SUFFIX = ".kvc"

# (kind, rule, num_bytes, num_tokens): "capture" | "evict" | "drop"
EventCallback = Callable[[str, str, int, int], None]


class CorruptCheckpoint(ValueError):
    """A checkpoint file that must not be loaded."""


@dataclass(slots=True)
class DiskEntry:
    key: str
    path: Path
    tokens: np.ndarray  # int32 [n]
    rule: str
    num_bytes: int  # file size
    last_used: float  # mtime


def _read_header(f: BinaryIO, fp_digest: bytes) -> tuple[np.ndarray, str, int, bytes]:
    """Parse a file's header and tokens; return (tokens, rule, data length, checksum)."""
    raw = f.read(_FIXED.size)
    if len(raw) != _FIXED.size:
        raise CorruptCheckpoint("truncated header")
    magic, version, fp, n, rule_len = _FIXED.unpack(raw)
    if magic != _MAGIC or version != _VERSION:
        raise CorruptCheckpoint("not a slotserve checkpoint of this version")
    if fp != fp_digest:
        raise CorruptCheckpoint("checkpoint of another model or KV layout")
    rule = f.read(rule_len).decode("utf-8", errors="replace")
    tail = f.read(_TAIL.size)
    if len(tail) != _TAIL.size:
        raise CorruptCheckpoint("truncated header")
    data_len, checksum = _TAIL.unpack(tail)
    tok_raw = f.read(4 * n)
    if len(tok_raw) != 4 * n or n == 0:
        raise CorruptCheckpoint("truncated token ids")
    return np.frombuffer(tok_raw, dtype=np.int32).copy(), rule, data_len, checksum


@dataclass(frozen=True, slots=True)
class ForeignFile:
    """A checkpoint file (or a dead writer's temporary file) of another model or KV layout."""

    path: Path
    num_bytes: int
    mtime: float


_MODEL_DIR = re.compile(r"[0-9a-f]{16}")  # a model-id folder name


def _is_checkpoint_file(path: Path) -> bool:
    """Whether `path` is a file slotserve wrote: a checkpoint (by its magic) or a temp file."""
    if path.name.startswith(".") and path.name.endswith(".tmp"):
        return path.is_file()
    if path.suffix != _SUFFIX or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(_MAGIC)) == _MAGIC
    except OSError:
        return False


class DiskCheckpointStore:
    def __init__(
        self,
        root: str | os.PathLike[str],
        space_bytes: int,
        fingerprint: str,
        restored_floor: RestoredFloor = no_floor,
    ) -> None:
        self._floor = restored_floor  # which longer file can stand in for a prefix of it
        self._fp_digest = hashlib.sha256(fingerprint.encode()).digest()
        self.root = Path(root)
        self.dir = self.root / self._fp_digest.hex()[:16]
        self.space_bytes = space_bytes
        self.bytes_used = 0  # this pool's files
        self.foreign_bytes = 0  # other models' and layouts' files (IO thread writes, others read)
        self._foreign: list[ForeignFile] = []  # oldest first; owned by the IO thread
        self.on_event: EventCallback | None = None
        self._entries: dict[str, DiskEntry] = {}
        self._index = PrefixIndex()  # the entries' tokens, for prefix lookups
        self._lock = threading.Lock()  # guards the index; held briefly, never during IO
        self._jobs: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._usable = True
        self._warned = False
        self.index_ready = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the IO thread; it builds the index from the directory first."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._main, name="slotserve-kv-disk", daemon=True)
        self._thread.start()
        self._jobs.put(("index",))

    def close(self) -> None:
        """Finish pending writes and stop the IO thread (blocking)."""
        if self._thread is None:
            return
        self._jobs.put(None)
        self._thread.join()
        self._thread = None

    def flush(self) -> None:
        """Block until every queued write is done (tests)."""
        done = threading.Event()
        self._jobs.put(("barrier", done))
        done.wait()

    @property
    def is_usable(self) -> bool:
        return self._usable

    def _main(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                if job[0] == "index":
                    self._build_index()
                elif job[0] == "put":
                    self._write(*job[1:])
                elif job[0] == "unlink":
                    self._drop(*job[1:])
                elif job[0] == "barrier":
                    job[1].set()
            except Exception:  # noqa: BLE001 - the disk tier must never stop serving
                log.exception("disk checkpoint job %s failed", job[0])

    def _warn_once(self, msg: str, *args: object) -> None:
        if not self._warned:
            self._warned = True
            log.warning(msg + "; serving continues without it", *args)

    def _emit(self, kind: str, rule: str, num_bytes: int, n: int) -> None:
        if self.on_event is not None:
            try:
                self.on_event(kind, rule, num_bytes, n)
            except Exception:  # noqa: BLE001
                log.exception("disk checkpoint event callback failed")

    # -- index -----------------------------------------------------------------------------
    def _build_index(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            if not os.access(self.dir, os.W_OK):
                raise PermissionError(f"{self.dir} is not writable")
        except OSError as exc:
            self._usable = False
            self._warn_once("KV disk directory %s is unusable (%s)", self.dir, exc)
            self.index_ready.set()
            return
        for path in sorted(self.dir.glob("*" + _SUFFIX)):
            try:
                with open(path, "rb") as f:
                    tokens, rule, data_len, _ = _read_header(f, self._fp_digest)
                st = path.stat()
                if path.name != tokens_key(tokens) + _SUFFIX:
                    raise CorruptCheckpoint("file name does not match its tokens")
            except (CorruptCheckpoint, OSError) as exc:
                self._drop(path, exc)
                continue
            self._index_add(DiskEntry(tokens_key(tokens), path, tokens, rule, st.st_size, st.st_mtime))
        for tmp in self.dir.glob(".*.tmp"):
            tmp.unlink(missing_ok=True)
        self._scan_foreign()
        self._make_room(0)  # the budget may have shrunk, or foreign files exceed it
        self.index_ready.set()

    def _scan_foreign(self) -> None:
        """Find the checkpoint files of other models and layouts beside `self.dir` (IO thread)."""
        found: list[ForeignFile] = []
        try:
            folders = [d for d in self.root.iterdir() if d != self.dir and _MODEL_DIR.fullmatch(d.name)]
            for folder in folders:
                if not folder.is_dir():
                    continue
                for path in folder.iterdir():
                    if _is_checkpoint_file(path):
                        st = path.stat()
                        found.append(ForeignFile(path, st.st_size, st.st_mtime))
        except OSError as exc:
            log.warning("cannot list %s for other models' checkpoints: %s", self.root, exc)
        found.sort(key=lambda f: f.mtime)
        self._foreign = found
        self.foreign_bytes = sum(f.num_bytes for f in found)
        if found:
            log.info(
                "KV disk directory %s: %d checkpoint files (%.1f MiB) of other models or KV layouts "
                "count against --kv-disk-space-mb (%.1f MiB); they are removed first, oldest first, "
                "when it is exceeded",
                self.root,
                len(found),
                self.foreign_bytes / 2**20,
                self.space_bytes / 2**20,
            )

    def _remove_foreign(self, size: int) -> None:
        """Remove foreign files, oldest first, until `size` more bytes fit the budget (IO thread)."""
        removed: dict[str, list[int]] = {}  # folder name -> [files, bytes]
        while self._foreign and self.bytes_used + self.foreign_bytes + size > self.space_bytes:
            f = self._foreign.pop(0)
            self.foreign_bytes -= f.num_bytes
            try:
                f.path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("cannot remove %s: %s", f.path, exc)
                continue
            tally = removed.setdefault(f.path.parent.name, [0, 0])
            tally[0] += 1
            tally[1] += f.num_bytes
            self._emit("drop", "", f.num_bytes, 0)
        if not removed:
            return
        for name in removed:
            with contextlib.suppress(OSError):
                (self.root / name).rmdir()  # only if now empty
        log.info(
            "removed checkpoints of other models or KV layouts from %s, oldest first, to fit "
            "--kv-disk-space-mb: %s",
            self.root,
            ", ".join(f"{name}/ {n} files ({b / 2**20:.1f} MiB)" for name, (n, b) in removed.items()),
        )

    def _index_add(self, e: DiskEntry) -> None:
        with self._lock:
            old = self._entries.pop(e.key, None)
            if old is not None:
                self.bytes_used -= old.num_bytes
            self._entries[e.key] = e
            self._index.add(e.key, e.tokens)
            self.bytes_used += e.num_bytes

    def _index_remove(self, key: str) -> DiskEntry | None:
        with self._lock:
            e = self._entries.pop(key, None)
            if e is not None:
                self.bytes_used -= e.num_bytes
                self._index.remove(key)
            return e

    def _drop(self, path: Path, why: Exception) -> None:
        log.warning("removing unusable KV checkpoint %s: %s", path.name, why)
        try:
            size = path.stat().st_size
            path.unlink()
        except OSError:
            size = 0
        self._emit("drop", "", size, 0)

    def __len__(self) -> int:
        return len(self._entries)

    def find(
        self, prompt: np.ndarray, restored_floor: RestoredFloor = no_floor, least: int = 1
    ) -> CheckpointMatch | None:
        """The indexed file that supplies the most prompt tokens (`usable_len` under the pool's
        `restored_floor`; ties: the shorter file); None before the index is built or if none
        sharing at least `least` tokens supplies any. Compares only the files next to the
        prompt in token order (`best_match`)."""
        with self._lock:
            found = best_match(self._index, prompt, restored_floor, least)
        if found is None:
            return None
        key, n, common = found
        return CheckpointMatch(CheckpointTier.DISK, key, n, common, restored_floor(n))

    def contains(self, tokens: np.ndarray) -> bool:
        with self._lock:
            e = self._entries.get(tokens_key(tokens))
        return e is not None and np.array_equal(e.tokens, tokens)

    def drop(self, key: str, why: Exception) -> None:
        """Forget the checkpoint under `key` at once (find no longer returns it) and delete its
        file on the IO thread: for a file that verified but the pool refused to restore."""
        e = self._index_remove(key)
        if e is not None and self._thread is not None:
            self._jobs.put(("unlink", e.path, why))

    # -- writes ----------------------------------------------------------------------------
    def put(self, tokens: np.ndarray, data: bytes, rule: str) -> None:
        """Queue a checkpoint write (non-blocking). Already-present prefixes are skipped."""
        if not self._usable or self._thread is None:
            return
        self._jobs.put(("put", np.array(tokens, dtype=np.int32), data, rule))

    def _write_file(self, path: Path, parts: list[bytes]) -> None:
        """Write parts to a temp file, fsync, rename to path, fsync the directory."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                for p in parts:
                    f.write(p)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _write(self, tokens: np.ndarray, data: bytes, rule: str) -> None:
        if not self._usable:
            return
        key = tokens_key(tokens)
        if self._covering(tokens):
            return  # a file already holds these rows (exactly, or as the start of a longer one)
        tok_bytes = tokens.tobytes()
        rule_b = rule.encode()
        checksum = hashlib.sha256(tok_bytes)
        checksum.update(data)
        data_len = memoryview(data).nbytes
        header = _FIXED.pack(_MAGIC, _VERSION, self._fp_digest, tokens.shape[0], len(rule_b))
        parts = [header, rule_b, _TAIL.pack(data_len, checksum.digest()), tok_bytes, data]
        size = sum(memoryview(p).nbytes for p in parts)
        if size > self.space_bytes:
            return
        self._make_room(size)
        path = self.dir / (key + _SUFFIX)
        try:
            self._write_file(path, parts)
        except OSError as exc:
            self._warn_once("cannot write KV checkpoints to %s (%s)", self.dir, exc)
            return
        self._warned = False
        self._index_add(DiskEntry(key, path, tokens, rule, size, time.time()))
        self._emit("capture", rule, size, int(tokens.shape[0]))
        for old in self._covered_by(tokens):  # the new file holds their rows
            if self._index_remove(old.key) is not None:
                old.path.unlink(missing_ok=True)
                self._emit("evict", old.rule, old.num_bytes, int(old.tokens.shape[0]))

    def _covering(self, tokens: np.ndarray) -> bool:
        """Whether an indexed file holds `tokens` first and can be cut back to them."""
        with self._lock:
            cands = [self._entries[k] for k in self._index.starting_with(tokens)]
        return any(covers(e.tokens, self._floor(int(e.tokens.shape[0])), tokens) for e in cands)

    def _covered_by(self, tokens: np.ndarray) -> list[DiskEntry]:
        """Indexed files that are strict prefixes of `tokens` and that a slot restored from
        `tokens` can be cut back to."""
        n = int(tokens.shape[0])
        floor = self._floor(n)
        with self._lock:
            cands = [self._entries[k] for k in self._index.prefixes_of(tokens)]
        return [e for e in cands if e.tokens.shape[0] < n and covers(tokens, floor, e.tokens)]

    def _make_room(self, size: int) -> None:
        """Free room for `size` bytes: foreign files first, then this pool's LRU (IO thread)."""
        self._remove_foreign(size)
        while True:
            with self._lock:
                if self.bytes_used + self.foreign_bytes + size <= self.space_bytes or not self._entries:
                    return
                victim = min(self._entries.values(), key=lambda e: e.last_used)
            self._index_remove(victim.key)
            victim.path.unlink(missing_ok=True)
            self._emit("evict", victim.rule, victim.num_bytes, int(victim.tokens.shape[0]))

    # -- reads -----------------------------------------------------------------------------
    def load(self, key: str) -> tuple[np.ndarray, bytes] | None:
        """Read and verify a checkpoint (blocking; call off the event loop). The file stays on
        disk. A damaged or foreign file is removed and None returned."""
        with self._lock:
            e = self._entries.get(key)
        if e is None:
            return None
        try:
            with open(e.path, "rb") as f:
                tokens, _, data_len, checksum = _read_header(f, self._fp_digest)
                data = f.read()
            if len(data) != data_len:
                raise CorruptCheckpoint("truncated data")
            h = hashlib.sha256(tokens.tobytes())
            h.update(data)
            if h.digest() != checksum:
                raise CorruptCheckpoint("checksum mismatch")
            if not np.array_equal(tokens, e.tokens):
                raise CorruptCheckpoint("tokens changed since indexed")
        except FileNotFoundError:
            self._index_remove(key)
            return None
        except (CorruptCheckpoint, OSError) as exc:
            self._index_remove(key)
            self._drop(e.path, exc)
            return None
        now = time.time()
        e.last_used = now
        try:
            os.utime(e.path, (now, now))
        except OSError:
            pass
        return tokens, data
