"""`slotserve bench serve` end to end on the tiny fixture model, with tiny sizes: the report has
every field, the token counts are the ones asked for and every ratio is finite and positive.
No timing is asserted (speed is a benchmark's business, not a test's)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
from slotserve.bench import serve


@pytest.mark.parametrize("client", serve.CLIENTS)
def test_bench_serve_report(
    tiny_model_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, client: str
):
    for key in list(os.environ):
        if key.startswith("SLOTSERVE_") and key != "SLOTSERVE_HOME":
            monkeypatch.delenv(key)
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    args = parser.parse_args(
        ["--model", str(tiny_model_path), "--tokens", "5", "--streams", "1", "--streams", "2"]
        + ["--parallel", "2", "--ctx-size", "2048", "--bandwidth-mib", "4", "--rounds", "2", "--json"]
        + ["--client", client]
    )
    assert serve.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == 5 and report["parallel"] == 2 and report["rounds"] == 2
    assert report["client"] == client
    assert set(report["streams"]) == {"1", "2"}
    for n, row in report["streams"].items():
        assert row["completion_tokens"] == [5] * int(n)  # every stream ran to max_tokens (ignore_eos)
        assert len(row["served_over_engine_rounds"]) == 2  # one ratio per served + engine pair
        assert (
            min(row["served_over_engine_rounds"])
            <= row["served_over_engine"]
            <= max(row["served_over_engine_rounds"])
        )
        for key in ("served_tokens_per_s", "engine_tokens_per_s", "served_over_engine"):
            assert math.isfinite(row[key]) and row[key] > 0, (n, key, row[key])
        # CPU over the served rounds (server_cpu_seconds is tested below)
        assert row["cpu"]["wall_s"] > 0, row["cpu"]
        assert row["cpu"]["server_cpu_s"] >= 0 and row["cpu"]["client_cpu_s"] >= 0  # 10 ms ticks
    assert report["bandwidth_threads"] >= 1
    for key in (
        "ttft_s",
        "bandwidth_gb_s",
        "one_slot_bound_tokens_per_s",
        "engine_one_slot_over_bound",
        "read_bandwidth_gb_s",
        "one_slot_read_bound_tokens_per_s",
        "engine_one_slot_over_read_bound",
    ):
        assert math.isfinite(report[key]) and report[key] > 0, (key, report[key])
    assert report["decode_weight_bytes"] > 0


def test_decode_weight_bytes_leaves_out_an_untied_embedding(tiny_model_path: Path):
    from slotserve.engine_ext.loader import read_model

    model, _ = read_model(tiny_model_path)
    total = sum(t.data.nbytes for t in model.tensors.values())
    embd = model.tensors["token_embd.weight"].data.nbytes
    expected = total if model.config.tied_output else total - embd
    assert serve.decode_weight_bytes(model) == expected
    assert 0 < expected <= total


@pytest.mark.parametrize("threads", [1, 3])
def test_triad_counts_three_arrays(monkeypatch: pytest.MonkeyPatch, threads: int):
    clock = iter(np.arange(0.0, 100.0, 0.5))  # every timed pass takes 0.5 s
    monkeypatch.setattr(serve.time, "perf_counter", lambda: float(next(clock)))
    # 1 MiB is not a multiple of 3 threads x the chunk: the shares' tails are covered too
    # (triad_bandwidth checks every element of the result)
    assert serve.triad_bandwidth(1, reps=2, threads=threads) == 3 * 1024 * 1024 / 0.5


@pytest.mark.parametrize("threads", [1, 3])
def test_read_pass_counts_one_array(monkeypatch: pytest.MonkeyPatch, threads: int):
    clock = iter(np.arange(0.0, 100.0, 0.25))  # every timed pass takes 0.25 s
    monkeypatch.setattr(serve.time, "perf_counter", lambda: float(next(clock)))
    # read_bandwidth checks that the pass summed every element once
    assert serve.read_bandwidth(1, reps=2, threads=threads) == 1024 * 1024 / 0.25


# --- the raw streaming client against a canned server: it must report what went wrong ---


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


async def _raw(reply: bytes, *, last_chunk: bool = True) -> serve.StreamResult:
    server, url = await _serve_canned(reply, last_chunk=last_chunk)
    async with server:
        return await serve.raw_stream(url, "/v1/chat/completions", {"stream": True}, 10.0)


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


def test_served_round_rejects_a_short_stream():
    """A stream that stopped before `tokens` (usage count or finish_reason) ends the benchmark."""

    def results(count: int, finish: str) -> list[serve.StreamResult]:
        return [
            serve.StreamResult(1.0, 2.0, 3.0, 10, 5, "length"),
            serve.StreamResult(1.0, 2.0, 3.0, 10, count, finish),
        ]

    async def run_round(count: int, finish: str) -> tuple[float, list[int]]:
        async def round_of(specs: list[object]) -> list[serve.StreamResult]:
            assert len(specs) == 2
            return results(count, finish)

        return await serve.served_round(round_of, 5, 2, 0)

    assert asyncio.run(run_round(5, "length")) == (8.0, [5, 5])  # (4 + 4) tokens after the first / 1 s
    for count, finish in ((4, "length"), (5, "stop")):
        with pytest.raises(SystemExit, match="ended after"):
            asyncio.run(run_round(count, finish))


def test_server_cpu_seconds_reads_this_process():
    before = serve.server_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # burn CPU until the process clock moved
        pass
    assert serve.server_cpu_seconds(os.getpid()) > before


def test_read_sum_reads_every_byte_once() -> None:
    from slotserve.engine_ext import _engine

    rng = np.random.default_rng(7)
    # lengths around the AVX2 loop's 128-byte steps and the 8-byte words, and offsets off alignment
    for n in (0, 1, 7, 8, 127, 128, 129, 1000, 4096 + 13):
        raw = rng.integers(0, 256, n + 3, dtype=np.uint8)[3:]
        words = n // 8
        want = int(raw[: 8 * words].view("<u8").sum(dtype=np.uint64)) + int(raw[8 * words :].sum())
        assert _engine.read_sum(raw) == want % (1 << 64)
