"""Server-sent events: turn a stream of lines into the `data` payloads of its events.

Follows the SSE wire format: events end at a blank line; `data:` lines of one event are joined
with newlines; lines starting with `:` are comments (keep-alives); a single space after the
colon is dropped. OpenAI-style streams end with the payload `[DONE]`, which ends iteration.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator

DONE = "[DONE]"


class SSEDecoder:
    """Feed lines (without their terminators); get an event's data when its blank line comes."""

    def __init__(self) -> None:
        self._data: list[str] = []  # data lines of the event being read

    def feed(self, line: str) -> str | None:
        """Consume one line; return the completed event's data, or None if no event ended."""
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        return None  # event:, id:, retry: carry nothing the harness uses

    def flush(self) -> str | None:
        """End the current event (at a blank line or end of stream)."""
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        return data


def iter_sse(lines: Iterable[str]) -> Iterator[str]:
    """Event payloads of `lines`, stopping at `[DONE]`."""
    decoder = SSEDecoder()
    for line in lines:
        data = decoder.feed(line)
        if data == DONE:
            return
        if data is not None:
            yield data
    data = decoder.flush()
    if data is not None and data != DONE:
        yield data


async def aiter_sse(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """Async twin of `iter_sse` (for `httpx.Response.aiter_lines()`)."""
    decoder = SSEDecoder()
    async for line in lines:
        data = decoder.feed(line)
        if data == DONE:
            return
        if data is not None:
            yield data
    data = decoder.flush()
    if data is not None and data != DONE:
        yield data
