"""The raw streaming client of `slotserve bench serve` (--client raw): `raw_stream`, an
asyncio-stream HTTP/1.1 client that reads the chunked body, splits it into SSE events and parses
JSON only for the events that decide the result (those up to the first chunk carrying text, and
the last few, kept raw in a small ring until the stream ends), and `StreamResult`, one streamed
request as the benchmark checks it (the httpx client's results are folded into it too)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

TAIL_EVENTS = 4  # raw client: events kept unparsed until the stream ends (the final ones decide)


@dataclass(slots=True)
class StreamResult:
    """One streamed chat request as the benchmark checks it. Times are time.perf_counter()."""

    t_send: float
    t_first: float = 0.0  # arrival of the first chunk carrying text (0.0: none came)
    t_last: float = 0.0  # arrival of the last chunk carrying text
    events: int = 0  # data events before `[DONE]`
    completion_tokens: int | None = None  # from the final usage chunk
    finish_reason: str | None = None
    error: str | None = None


def _fold(out: StreamResult, payload: bytes, now: float) -> bool:
    """Parse one event's JSON into `out`; True if it carried text. ValueError for an error
    chunk or a chunk that is not an object."""
    chunk = json.loads(payload)
    if not isinstance(chunk, dict):
        raise ValueError(f"malformed stream chunk: {payload[:200]!r}")
    if "error" in chunk:
        err = chunk["error"]
        raise ValueError(err.get("message", str(err)) if isinstance(err, dict) else str(err))
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        out.completion_tokens = usage.get("completion_tokens")
    text = False
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta")
        if (delta.get("content") if isinstance(delta, dict) else choice.get("text")) or None:
            text = True
        if choice.get("finish_reason"):
            out.finish_reason = choice["finish_reason"]
    if text:
        out.t_first = out.t_first or now
        out.t_last = now
    return text


async def _read_raw(host: str, port: int, path: str, payload: bytes, out: StreamResult) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
            f"accept: text/event-stream\r\ncontent-length: {len(payload)}\r\nconnection: close\r\n\r\n".encode()
            + payload
        )
        status_line = await reader.readline()
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        parts = status_line.split(None, 2)
        if len(parts) < 2 or parts[1] != b"200":
            out.error = f"HTTP {status_line.decode('latin-1').strip()!r}: {(await reader.read())[:300]!r}"
            return
        if headers.get("transfer-encoding") != "chunked":
            raise ValueError(f"expected a chunked event stream, got headers {headers}")
        buf = b""
        head = True  # no text yet: every event is parsed
        tail: deque[tuple[float, bytes]] = deque(maxlen=TAIL_EVENTS)
        done = False
        while not done:
            size_line = await reader.readline()
            if not size_line:
                raise ValueError(f"connection closed after {out.events} events, before [DONE]")
            size = int(size_line.split(b";", 1)[0], 16)
            if size == 0:
                raise ValueError(f"body ended after {out.events} events, before [DONE]")
            chunk = await reader.readexactly(size + 2)  # the chunk and its CRLF
            now = time.perf_counter()
            buf += chunk[:-2]
            while (i := buf.find(b"\n\n")) >= 0:
                event, buf = buf[:i], buf[i + 2 :]
                if event.startswith(b":"):
                    continue  # a comment (keep-alive)
                if not event.startswith(b"data: ") or b"\n" in event:
                    raise ValueError(f"unexpected event {event[:200]!r}")
                if event == b"data: [DONE]":
                    done = True
                    break
                out.events += 1
                if head:
                    head = not _fold(out, event[6:], now)
                else:
                    tail.append((now, event[6:]))
        for now, data in tail:
            _fold(out, data, now)
    finally:
        writer.close()


async def raw_stream(url: str, path: str, body: dict[str, Any], timeout_s: float) -> StreamResult:
    """POST `body` to `url` + `path` and read its event stream (module docstring: the raw
    client); never raises for server or network failures (`error` is set). The events between
    the first text chunk and the last TAIL_EVENTS are counted, not parsed: the result's token
    count is the final usage chunk's, its first and last text times are exact."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    out = StreamResult(t_send=time.perf_counter())
    try:
        await asyncio.wait_for(_read_raw(host, int(port), path, json.dumps(body).encode(), out), timeout_s)
    except asyncio.TimeoutError:
        out.error = f"no complete reply within {timeout_s} s"
    except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    return out
