"""Server-sent events and the cancel path: a request whose client leaves is cancelled, and the
handler returns only after the scheduler acknowledged the cancel.

Design: `SSEResponse` runs two tasks in one task group: one iterates the body (an `EventStream`)
and sends each chunk, one waits for `http.disconnect`. Whichever ends first cancels the other (Starlette's
StreamingResponse does the same under ASGI spec < 2.4; this class does it always, so a client that
leaves while its request is still queued or prefilling, when nothing is being sent, is noticed
at once). The body's generator sends the cancel from its `finally:`; the response closes
the body explicitly (`aclose`), so that `finally:` runs before the response returns, never later
from the garbage collector (and a body never started is cancelled by `aclose` itself).

NOTE: the cancel in `finally:` runs inside a cancelled anyio scope, where every await is
cancelled at once; `cancel_quietly` shields it so that it waits for the acknowledgement.

Non-streaming requests use `collect`, the same race between the events and the disconnect.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..scheduler.request import FinishEvent, TokenEvent

log = logging.getLogger("slotserve.gateway")

DONE = b"data: [DONE]\n\n"


def sse_data(payload: bytes) -> bytes:
    """One SSE event carrying one JSON document (which never contains a raw newline)."""
    return b"data: " + payload + b"\n\n"


def sse_event(name: str, payload: bytes) -> bytes:
    """One named SSE event (`event: NAME`) carrying one JSON document: the framing of the
    Anthropic and OpenAI Responses streams, whose clients dispatch on the event name."""
    return b"event: " + name.encode() + b"\ndata: " + payload + b"\n\n"


async def cancel_quietly(handle: Any) -> bool:
    """Cancel `handle` and wait for the scheduler's acknowledgement, even inside a cancelled scope.

    Returns what `handle.cancel()` returns (True when this call stopped the request).
    """
    with anyio.CancelScope(shield=True):
        return bool(await handle.cancel())


async def wait_for_disconnect(receive: Receive) -> None:
    """Return when the client has gone (the request body must already have been read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


@dataclass(frozen=True, slots=True)
class Collected:
    """What a non-streaming request produced: all text and the finish event."""

    text: str
    finish: FinishEvent


async def collect(handle: Any, receive: Receive) -> Collected | None:
    """Gather a request's events; None if the client left first (then the request was cancelled
    and the scheduler acknowledged before this returns)."""
    parts: list[str] = []
    result: Collected | None = None

    async def gather() -> None:
        nonlocal result
        finished = False
        try:
            async for event in handle:
                if isinstance(event, TokenEvent):
                    parts.append(event.text)
                else:
                    assert isinstance(event, FinishEvent)
                    finished = True
                    parts.append(event.text)
                    result = Collected("".join(parts), event)
        finally:
            if not finished:
                await cancel_quietly(handle)

    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            await wait_for_disconnect(receive)
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        await gather()
        tg.cancel_scope.cancel()
    return result


class StreamFormat:
    """How one endpoint spells its SSE chunks; `EventStream` drives it."""

    # the last chunk of a stream: OpenAI's chat and completion streams end with `data: [DONE]`;
    # the Anthropic and Responses streams end with their own closing event (b"": nothing more)
    terminator: bytes = DONE

    def opening(self) -> list[bytes]:
        """Chunks sent before any token (e.g. the chat role delta)."""
        return []

    def delta(self, text: str) -> bytes:
        raise NotImplementedError

    def closing(self, finish: FinishEvent, text: str) -> list[bytes]:
        """Chunks for the finish event (its own released `text` first), up to but not [DONE]."""
        raise NotImplementedError


class EventStream:
    """The SSE body of one request: opening chunks, one chunk per non-empty text delta, the
    closing chunks, the format's terminator (`data: [DONE]`).

    If the consumer stops early (client gone, task cancelled), the generator's `finally:` cancels
    the request and awaits the acknowledgement. `aclose()` also covers a body that was never
    started (the client left before the first chunk was asked for).
    """

    def __init__(self, handle: Any, fmt: StreamFormat):
        self.handle = handle
        self.fmt = fmt
        self.is_started = False
        self.is_finished = False  # the FinishEvent was seen: nothing to cancel
        self._gen = self._events()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._gen

    async def _events(self) -> AsyncIterator[bytes]:
        self.is_started = True
        try:
            for chunk in self.fmt.opening():
                yield chunk
            async for event in self.handle:
                if isinstance(event, TokenEvent):
                    if event.text:
                        yield self.fmt.delta(event.text)
                else:
                    self.is_finished = True
                    for chunk in self.fmt.closing(event, event.text):
                        yield chunk
            if self.fmt.terminator:
                yield self.fmt.terminator
        finally:
            if not self.is_finished:
                await cancel_quietly(self.handle)

    async def aclose(self) -> None:
        """Close the body; cancel the request (acknowledged) unless it finished."""
        await self._gen.aclose()
        if not self.is_started:
            await cancel_quietly(self.handle)


class SSEResponse(Response):
    """A `text/event-stream` response over an async byte iterator that notices disconnects.

    The iterator is closed (its `finally:` run) before `__call__` returns, on every path.
    """

    media_type = "text/event-stream"

    def __init__(self, body: EventStream, headers: dict[str, str] | None = None):
        self.body_iterator = body
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def stream() -> None:
                    try:
                        await self._stream(send)
                    except OSError:  # ASGI spec 2.4 servers report a gone client from send()
                        log.debug("client disconnected during send")
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await wait_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()

    async def _stream(self, send: Send) -> None:
        async with aclosing(self.body_iterator) as body:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            async for chunk in body:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
