"""The HTTP/1.1 connection: uvicorn's h11 protocol plus a header deadline and a connection cap.

Design: uvicorn bounds idle keep-alive connections (`timeout_keep_alive`) and the size of a
request head (`h11_max_incomplete_event_size`) but not the time a head may take: a socket that
sends nothing, or half a head, would hold its file descriptor forever (slowloris). `protocol_class`
returns a subclass of uvicorn's `H11Protocol` that

- arms a timer of --header-timeout-s when a connection opens, and again at the first byte of
  each later request on a kept-alive connection; the timer is cancelled as soon as h11 has
  parsed the whole head. If it fires first, the connection gets a 408 in OpenAI's error shape
  and is closed. (The body has its own deadline, in `http_guard.py`: by then the request is an
  ASGI call that can answer properly.)
- refuses a connection past --max-connections at once: a canned 503 with `Retry-After`, then
  close. The file descriptor is freed immediately, so N slow sockets hold at most N descriptors
  and never starve the listener of the process's descriptor limit.

Neither case reaches the app, so neither is a request in `slotserve_requests_total`; refusals
are logged (at most one line per 10 s).

NOTE: slotserve always uses this h11 protocol, also when httptools is installed (uvicorn's
"auto" would switch to it and lose these guards). Generation, not HTTP parsing, is the cost.
"""

from __future__ import annotations

import asyncio
import logging
import time

import h11
import msgspec
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import APIError

log = logging.getLogger("slotserve.gateway")

_REFUSAL_LOG_INTERVAL_S = 10.0


def _canned(status: int, reason: str, err: APIError, extra: str = "") -> bytes:
    """A complete HTTP/1.1 response that closes the connection, written without h11 (no request
    head was parsed, so h11 would refuse to send a response)."""
    body = msgspec.json.encode(err.body())
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n{extra}connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


HEADER_TIMEOUT_RESPONSE = _canned(
    408,
    "Request Timeout",
    APIError(408, "The request head did not arrive in time", code="request_timeout"),
)
TOO_MANY_CONNECTIONS_RESPONSE = _canned(
    503,
    "Service Unavailable",
    APIError(
        503,
        "Too many open connections; retry later",
        type="service_unavailable_error",
        code="too_many_connections",
    ),
    "retry-after: 1\r\n",
)


class GuardedH11Protocol(H11Protocol):
    """H11Protocol with a header deadline and a connection cap (module docstring). Use
    `protocol_class(...)`, which sets the two limits as class attributes."""

    header_timeout_s: float = 10.0
    max_connections: int = 256
    _refusals: list[float] = [0.0, 0.0]  # [refused since the last log line, time of that line]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self._refuse()
            return
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and self.conn.their_state is h11.IDLE:
            self._arm_header_timer()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the head is parsed (or the connection failed)
            self._cancel_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._on_header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        log.debug("closing a connection that sent no complete request head in %.0fs", self.header_timeout_s)
        self.transport.write(HEADER_TIMEOUT_RESPONSE)
        self.transport.close()

    def _refuse(self) -> None:
        self.transport.write(TOO_MANY_CONNECTIONS_RESPONSE)
        self.transport.close()
        counts = type(self)._refusals
        counts[0] += 1
        now = time.monotonic()
        if now - counts[1] >= _REFUSAL_LOG_INTERVAL_S:
            log.warning(
                "refused %d connection(s): %d open, --max-connections %d",
                counts[0],
                len(self.connections) - 1,
                self.max_connections,
            )
            counts[0], counts[1] = 0, now


def protocol_class(*, header_timeout_s: float, max_connections: int) -> type[GuardedH11Protocol]:
    """A `GuardedH11Protocol` subclass with these limits, for `uvicorn.Config(http=...)`. Each
    call makes a new class, so servers in one process (tests) keep their own limits and counts."""
    return type(
        "GuardedH11Protocol",
        (GuardedH11Protocol,),
        {"header_timeout_s": header_timeout_s, "max_connections": max_connections, "_refusals": [0.0, 0.0]},
    )
