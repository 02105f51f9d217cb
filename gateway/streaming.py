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

A request with n choices is n scheduler requests held by one `ChoiceGroup`: its events arrive
tagged with the choice index, and a cancel cancels every choice.

A stream writes in batches: each time its task runs, the chunks of every event that has queued
up (`ChoiceGroup.batches`) go out as one `http.response.body` message, so a stream that fell
behind the engine (a busy loop, a slow client) catches up with one write instead of one per
token. Each SSE event inside a write is framed as before; a client sees the same events.

Keep-alive: a third task in `SSEResponse`'s group wakes when nothing was written for
`keepalive_s` (while the request waits for a slot or prefills a long prompt, nothing else is) and
writes the format's keep-alive (an SSE comment, or Anthropic's `ping` event), so clients and
proxies with read timeouts do not give up. With `progress` (the request's `return_progress`),
until the first token it writes the prompt's prefill progress instead, at least every PROGRESS_S. Writes
of both tasks take one lock; the token path pays one uncontended acquire per write.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..scheduler.api import HandleAPI
from ..scheduler.request import FinishEvent, PrefillProgress, TokenEvent, TokenLogprob

log = logging.getLogger("slotserve.gateway")

DONE = b"data: [DONE]\n\n"
KEEPALIVE_COMMENT = b": keep-alive\n\n"
PROGRESS_S = 1.0  # interval of prefill progress events, when a request asks for them


def sse_data(payload: bytes) -> bytes:
    """One SSE event carrying one JSON document (which never contains a raw newline)."""
    return b"data: " + payload + b"\n\n"


def sse_event(name: str, payload: bytes) -> bytes:
    """One named SSE event (`event: NAME`) carrying one JSON document: the framing of the
    Anthropic and OpenAI Responses streams, whose clients dispatch on the event name."""
    return b"event: " + name.encode() + b"\ndata: " + payload + b"\n\n"


async def cancel_quietly(handle: HandleAPI | ChoiceGroup) -> bool:
    """Cancel `handle` and wait for the scheduler's acknowledgement, even inside a cancelled scope.

    Returns what `handle.cancel()` returns (True when this call stopped the request).
    """
    with anyio.CancelScope(shield=True):
        stopped = bool(await handle.cancel())
    return stopped


async def wait_for_disconnect(receive: Receive) -> None:
    """Return when the client has gone (the request body must already have been read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class ChoiceGroup:
    """The n scheduler requests of one API request, as one handle.

    `async for index, event in group` yields every choice's events as they come (each choice's
    in order; TokenEvents then one FinishEvent each) until all have finished. `cancel()` cancels
    every choice and returns True if any was stopped by it."""

    def __init__(self, handles: Sequence[HandleAPI]) -> None:
        self.handles = list(handles)

    def __len__(self) -> int:
        return len(self.handles)

    async def __aiter__(self) -> AsyncIterator[tuple[int, TokenEvent | FinishEvent]]:
        if len(self.handles) == 1:  # the common case: no pump tasks
            async for event in self.handles[0]:
                yield 0, event
            return
        queue: asyncio.Queue[tuple[int, TokenEvent | FinishEvent]] = asyncio.Queue()

        async def pump(i: int, handle: HandleAPI) -> None:
            async for event in handle:
                queue.put_nowait((i, event))

        tasks = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(self.handles)]
        try:
            left = len(self.handles)
            while left:
                i, event = await queue.get()
                if isinstance(event, FinishEvent):
                    left -= 1
                yield i, event
        finally:
            for t in tasks:
                t.cancel()

    async def batches(self) -> AsyncIterator[list[tuple[int, TokenEvent | FinishEvent]]]:
        """The events of iterating the group, as lists: the next event plus every event already
        queued behind it (each choice's in order), until every choice has finished."""
        if len(self.handles) == 1:
            async for batch in self.handles[0].batches():
                yield [(0, event) for event in batch]
            return
        queue: asyncio.Queue[tuple[int, TokenEvent | FinishEvent]] = asyncio.Queue()

        async def pump(i: int, handle: HandleAPI) -> None:
            async for batch in handle.batches():
                for event in batch:
                    queue.put_nowait((i, event))

        tasks = [asyncio.ensure_future(pump(i, h)) for i, h in enumerate(self.handles)]
        try:
            left = len(self.handles)
            while left:
                out = [await queue.get()]
                while not queue.empty():
                    out.append(queue.get_nowait())
                left -= sum(isinstance(e, FinishEvent) for _, e in out)
                yield out
        finally:
            for t in tasks:
                t.cancel()

    async def cancel(self) -> bool:
        stopped = [bool(await h.cancel()) for h in self.handles]
        return any(stopped)

    def progress(self) -> PrefillProgress:
        """The prefill progress of the first choice (every choice has the same prompt)."""
        return self.handles[0].progress()


def as_group(handle: HandleAPI | ChoiceGroup) -> ChoiceGroup:
    return handle if isinstance(handle, ChoiceGroup) else ChoiceGroup([handle])


@dataclass(frozen=True, slots=True)
class Collected:
    """What one choice of a non-streaming request produced: all text, the finish event, and the
    logprobs of its tokens (empty unless requested)."""

    text: str
    finish: FinishEvent
    logprobs: tuple[TokenLogprob, ...] = ()  # one per emitted token (empty unless requested)


async def collect_choices(handle: HandleAPI | ChoiceGroup, receive: Receive) -> list[Collected] | None:
    """Gather every choice's events (a handle or a ChoiceGroup); None if the client left first
    (then every choice was cancelled and acknowledged before this returns)."""
    group = as_group(handle)
    parts: list[list[str]] = [[] for _ in range(len(group))]
    lps: list[list[TokenLogprob]] = [[] for _ in range(len(group))]
    results: list[Collected | None] = [None] * len(group)

    async def gather() -> None:
        finished = False
        try:
            async for i, event in group:
                if isinstance(event, TokenEvent):
                    parts[i].append(event.text)
                    lps[i].extend(event.logprobs)
                else:
                    assert isinstance(event, FinishEvent)
                    parts[i].append(event.text)
                    results[i] = Collected("".join(parts[i]), event, tuple(lps[i]))
            finished = True
        finally:
            if not finished:
                await cancel_quietly(group)

    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            await wait_for_disconnect(receive)
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        await gather()
        tg.cancel_scope.cancel()
    if any(r is None for r in results):
        return None
    return results  # type: ignore[return-value]


async def collect(handle: HandleAPI | ChoiceGroup, receive: Receive) -> Collected | None:
    """Gather a one-choice request's events; None if the client left first (then the request was
    cancelled and the scheduler acknowledged before this returns)."""
    got = await collect_choices(handle, receive)
    return got[0] if got is not None else None


class StreamFormat:
    """How one endpoint spells its SSE chunks; `EventStream` drives it.

    A one-choice format implements `opening`, `delta` and `closing`. A format for n choices (or
    one that needs the whole event: logprobs, tool calls) overrides `on_token`, `on_finish` and
    `ending`, whose defaults call the one-choice methods."""

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

    def on_token(self, index: int, event: TokenEvent) -> list[bytes]:
        """Chunks for one TokenEvent of choice `index`."""
        return [self.delta(event.text)] if event.text else []

    def on_finish(self, index: int, finish: FinishEvent) -> list[bytes]:
        """Chunks for the FinishEvent of choice `index`."""
        return self.closing(finish, finish.text)

    def ending(self) -> list[bytes]:
        """Chunks after every choice finished (e.g. the usage chunk of n choices), before [DONE]."""
        return []

    def keepalive(self) -> bytes:
        """What an idle stream writes to stay open (default: an SSE comment, which every SSE
        client ignores)."""
        return KEEPALIVE_COMMENT

    def progress(self, progress: PrefillProgress, time_ms: int) -> bytes:
        """The prefill progress event (the request's `return_progress`); default: an SSE comment
        carrying llama.cpp's `prompt_progress` object."""
        return b": prompt_progress " + progress_json(progress, time_ms) + b"\n\n"


def progress_object(progress: PrefillProgress, time_ms: int) -> dict[str, int]:
    """llama.cpp's `prompt_progress` fields: prompt tokens in all, reused from the cache,
    processed so far (reused included), and milliseconds since the request was accepted."""
    return {
        "total": progress.total,
        "cache": progress.cached,
        "processed": progress.processed,
        "time_ms": time_ms,
    }


def progress_json(progress: PrefillProgress, time_ms: int) -> bytes:
    return json.dumps(progress_object(progress, time_ms), separators=(",", ":")).encode()


class EventStream:
    """The SSE body of one request: opening chunks, one chunk per non-empty text delta, the
    closing chunks, the format's terminator (`data: [DONE]`). Each item it yields is the chunks
    of one batch of events (module docstring) joined; the last one carries the terminator.

    If the consumer stops early (client gone, task cancelled), the generator's `finally:` cancels
    the request and awaits the acknowledgement. `aclose()` also covers a body that was never
    started (the client left before the first chunk was asked for).
    """

    def __init__(
        self,
        handle: HandleAPI | ChoiceGroup,
        fmt: StreamFormat,
        *,
        progress: bool = False,
        on_first_finish: Callable[[FinishEvent], None] | None = None,
    ):
        self.handle = as_group(handle)
        self.fmt = fmt
        self.progress = progress  # prefill progress while idle before the first token
        self.on_first_finish = on_first_finish  # called with choice 0's FinishEvent
        self.is_started = False
        self.is_finished = False  # the FinishEvent was seen: nothing to cancel
        self.has_output = False  # a batch of events arrived (the first token, or the finish)
        self.started_at = time.monotonic()
        self._gen = self._events()

    @property
    def wants_progress(self) -> bool:
        return self.progress and not self.has_output

    def idle_chunk(self) -> bytes:
        """What to write when the stream has been idle: the prefill progress (asked for, and no
        token yet), else the format's keep-alive."""
        if self.wants_progress:
            ms = int((time.monotonic() - self.started_at) * 1000)
            return self.fmt.progress(self.handle.progress(), ms)
        return self.fmt.keepalive()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._gen

    async def _events(self) -> AsyncGenerator[bytes, None]:
        self.is_started = True
        fmt = self.fmt
        try:
            opening = fmt.opening()
            if opening:
                yield b"".join(opening)
            num_finished = 0
            async for batch in self.handle.batches():
                out: list[bytes] = []
                if self.wants_progress:  # the prompt is done: say so once, before the tokens
                    out.append(self.idle_chunk())
                self.has_output = True
                for i, event in batch:
                    if isinstance(event, TokenEvent):
                        out += fmt.on_token(i, event)
                    else:
                        num_finished += 1
                        out += fmt.on_finish(i, event)
                        if i == 0 and self.on_first_finish is not None:
                            self.on_first_finish(event)
                if num_finished == len(self.handle):
                    self.is_finished = True
                    out += fmt.ending()
                    if fmt.terminator:
                        out.append(fmt.terminator)
                if out:
                    yield b"".join(out)
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

    def __init__(self, body: EventStream, headers: dict[str, str] | None = None, *, keepalive_s: float = 0.0):
        self.body_iterator = body
        self.status_code = 200
        self.background = None
        self.keepalive_s = keepalive_s  # 0: no keep-alive (module docstring)
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
        self._write_lock = asyncio.Lock()
        self._last_write = time.monotonic()
        self._state = "new"  # "open" between the response start and the last body message, then "closed"

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
                if self.keepalive_s > 0 or self.body_iterator.progress:
                    tg.start_soon(self._keep_alive, send)
                await wait_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()

    async def _write(self, send: Send, chunk: bytes, more: bool = True) -> None:
        async with self._write_lock:
            if self._state != "open":
                return
            if not more:
                self._state = "closed"
            await send({"type": "http.response.body", "body": chunk, "more_body": more})
            self._last_write = time.monotonic()

    async def _stream(self, send: Send) -> None:
        async with aclosing(self.body_iterator) as body:
            async with self._write_lock:
                await send(
                    {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
                )
                self._state = "open"
                self._last_write = time.monotonic()
            async for chunk in body:
                await self._write(send, chunk)
            await self._write(send, b"", more=False)

    async def _keep_alive(self, send: Send) -> None:
        """Write the body's idle chunk whenever nothing was written for the interval (at most
        PROGRESS_S while prefill progress is wanted)."""
        body = self.body_iterator
        while True:
            interval = self.keepalive_s
            if body.wants_progress:
                interval = min(interval, PROGRESS_S) if interval > 0 else PROGRESS_S
            if interval <= 0 or self._state == "closed":  # progress only and a token came; or done
                return
            now = time.monotonic()
            due = self._last_write + interval
            if self._state == "new" or now < due:
                await anyio.sleep(max(due - now, 0.01))
                continue
            try:
                async with self._write_lock:  # idle still? (the token path may have just written)
                    if self._state == "open" and time.monotonic() - self._last_write >= interval:
                        await send(
                            {"type": "http.response.body", "body": body.idle_chunk(), "more_body": True}
                        )
                        self._last_write = time.monotonic()
            except OSError:
                return
