"""The raw streaming client of `bench serve` (bench/serve_client.py) against a canned server:
it reads a whole chunked event stream and must report what went wrong."""

from __future__ import annotations

import asyncio
import json

import pytest
from slotserve.bench import serve_client


def _sse(*payloads: object) -> bytes:
    return b"".join(b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads)


def _chunked(body: bytes, pieces: int = 3) -> bytes:
    """`body` in HTTP/1.1 chunks of uneven sizes (events split across chunks)."""
    step = max(1, len(body) // pieces + 1)
    out = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + step]), body[i : i + step]) for i in range(0, len(body), step)
    )
    return out


def _stream_body(n: int, *, finish: str | None = "length", done: bool = True) -> bytes:
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    texts = [{"choices": [{"index": 0, "delta": {"content": f"t{i}"}}]} for i in range(n)]
    end = [{"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}] if finish else []
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}
    return _sse(role, *texts, *end, usage) + (b"data: [DONE]\n\n" if done else b"")


async def _serve_canned(reply: bytes, *, last_chunk: bool = True) -> tuple[asyncio.Server, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
        )
        json.loads(await reader.readexactly(length))  # the client sent a JSON body
        writer.write(reply + (b"0\r\n\r\n" if last_chunk else b""))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


_OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def _raw(reply: bytes, *, last_chunk: bool = True) -> serve_client.StreamResult:
    server, url = await _serve_canned(reply, last_chunk=last_chunk)
    async with server:
        return await serve_client.raw_stream(url, "/v1/chat/completions", {"stream": True}, 10.0)


@pytest.mark.parametrize("n", [1, 2, 12])
def test_raw_stream_reads_a_whole_stream(n: int):
    res = asyncio.run(_raw(_OK_HEAD + _chunked(_stream_body(n))))
    assert res.error is None
    assert res.completion_tokens == n and res.finish_reason == "length"
    assert res.events == n + 3  # role, n texts, finish, usage
    assert res.t_send < res.t_first <= res.t_last


@pytest.mark.parametrize(
    ("reply", "last_chunk", "expected"),
    [
        (_OK_HEAD + _chunked(_stream_body(8, done=False)), True, "before [DONE]"),  # body ends early
        (_OK_HEAD + _chunked(_stream_body(8, done=False)), False, "before [DONE]"),  # connection drops
        (
            _OK_HEAD
            + _chunked(
                _stream_body(8, done=False) + _sse({"error": {"message": "boom"}}) + b"data: [DONE]\n\n"
            ),
            True,
            "boom",
        ),
        (_OK_HEAD + _chunked(_sse({"error": {"message": "slot lost"}})), True, "slot lost"),
        (b'HTTP/1.1 400 Bad Request\r\ncontent-length: 9\r\n\r\n{"e": 1}\n', False, "400"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", False, "chunked"),
    ],
)
def test_raw_stream_reports_failures(reply: bytes, last_chunk: bool, expected: str):
    res = asyncio.run(_raw(reply, last_chunk=last_chunk))
    assert res.error is not None and expected in res.error, res.error
