"""Where events go: `--kv-events-*` settings and the XPUB publisher thread that owns the socket."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from .wire import DEFAULT_BLOCK_SIZE, AllBlocksCleared, KVEvent, KVEventBatch, encode_batch

log = logging.getLogger("slotserve.kv_events")


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
        self._queue: queue.SimpleQueue[KVEventBatch | object] = queue.SimpleQueue()  # or _STOP
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
                if not isinstance(item, KVEventBatch):  # _STOP
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
