"""The load harness end to end against a mock OpenAI-compatible server with a prefix cache.

The mock (Starlette on a free loopback port, in a thread) tokenises GPT-2 style, renders chat
messages ChatML style, and reports `cached_tokens` = the longest common prefix of the prompt
with anything it has seen (prompts at arrival; prompt + generated tokens when a stream ends),
capped at len(prompt) - 1 like real servers. That is the oracle's definition minus the cap, so
the harness's report can be checked exactly: cached <= oracle on every request.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import re
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from rich.console import Console
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from slotserve.bench.loadtest import report, results
from slotserve.bench.loadtest.plots import PLOT_FILES
from slotserve.bench.loadtest.trace import write_trace
from slotserve.bench.loadtest.workloads import (
    SYNTHETIC_WORKLOADS, RequestSpec, WorkloadConfig, num_planned_requests)
from slotserve.cli import main as slotserve_main

_PIECES = re.compile(r"<\|im_start\|>|<\|im_end\|>| ?\w+| ?[^\w\s]+|\s+(?!\S)|\s+")
_REPLY_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "zeta")
MAX_TOKENS_LIMIT = 1000


class MockLLM:
    """Tokeniser, template, prefix 'cache' and a fake generator. One event loop uses it."""

    def __init__(self, reuse: bool, token_delay_s: float) -> None:
        self.reuse, self.token_delay_s = reuse, token_delay_s
        self.vocab: dict[str, int] = {}
        self.seen: list[list[int]] = []  # every sequence the 'server' computed
        self.num_disconnects = 0
        self.num_requests = 0

    def encode(self, text: str) -> list[int]:
        return [self.vocab.setdefault(p, len(self.vocab)) for p in _PIECES.findall(text)]

    @staticmethod
    def render(messages: list[dict], add_generation_prompt: bool = True) -> str:
        text = "".join(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n"
                       for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def cached_len(self, ids: list[int]) -> int:
        if not self.reuse:
            return 0
        best = 0
        for s in self.seen:
            n = 0
            for a, b in zip(ids, s):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return min(best, len(ids) - 1)

    def reply_pieces(self, ids: list[int], n: int) -> list[str]:
        h = hashlib.sha256(str(ids).encode()).digest()
        words = [_REPLY_WORDS[h[i % len(h)] % len(_REPLY_WORDS)] for i in range(n)]
        # A line break as the third token: an agent that normalises whitespace re-renders it.
        return [w if i in (0, 3) else "\n" if i == 2 else " " + w for i, w in enumerate(words)]


def build_app(llm: MockLLM, has_tokenize: bool) -> Starlette:
    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}},
                            status_code=status)

    async def completions(request: Request) -> StreamingResponse | JSONResponse:
        body = await request.json()
        is_chat = request.url.path.endswith("/chat/completions")
        max_tokens = body.get("max_tokens", 16)
        if max_tokens > MAX_TOKENS_LIMIT:
            return error(400, f"max_tokens must be <= {MAX_TOKENS_LIMIT}")
        prompt = llm.render(body["messages"]) if is_chat else body["prompt"]
        ids = llm.encode(prompt)
        cached = llm.cached_len(ids)
        llm.seen.append(ids)
        llm.num_requests += 1
        pieces = llm.reply_pieces(ids, max_tokens)
        include_usage = body.get("stream_options", {}).get("include_usage", False)

        async def events():
            generated: list[int] = []
            is_seen = False
            try:
                await asyncio.sleep(20e-6 * (len(ids) - cached))  # 'prefill' the uncached tail
                yield f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'role': 'assistant'}}]})}\n\n"
                for piece in pieces:
                    await asyncio.sleep(llm.token_delay_s)
                    generated += llm.encode(piece)
                    choice = {"index": 0, "delta": {"content": piece}} if is_chat else {
                        "index": 0, "text": piece}
                    yield f"data: {json.dumps({'choices': [choice]})}\n\n"
                llm.seen.append(ids + generated)  # before the client can send its next turn
                is_seen = True
                last = {"index": 0, "finish_reason": "length"}
                last |= {"delta": {}} if is_chat else {"text": ""}
                yield f"data: {json.dumps({'choices': [last]})}\n\n"
                if include_usage:
                    usage = {"prompt_tokens": len(ids), "completion_tokens": len(pieces),
                             "total_tokens": len(ids) + len(pieces),
                             "prompt_tokens_details": {"cached_tokens": cached}}
                    yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                if not is_seen:  # the client went away mid-stream
                    llm.seen.append(ids + generated)
                    llm.num_disconnects += 1

        return StreamingResponse(events(), media_type="text/event-stream")

    async def tokenize(request: Request) -> JSONResponse:
        if not has_tokenize:
            return error(404, "not found")
        body = await request.json()
        if "messages" in body:
            text = llm.render(body["messages"], body.get("add_generation_prompt", True))
        else:
            text = body["prompt"]
        ids = llm.encode(text)
        return JSONResponse({"tokens": ids, "count": len(ids)})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "mock-model", "object": "model"}]})

    return Starlette(routes=[
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
    ])


class MockServer:
    """The mock app under uvicorn in a thread, on a socket bound to 127.0.0.1:0."""

    def __init__(self, reuse: bool = True, has_tokenize: bool = True,
                 token_delay_s: float = 0.0005) -> None:
        self.llm = MockLLM(reuse, token_delay_s)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(build_app(self.llm, has_tokenize), log_level="warning",
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> MockServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "mock server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


# Function scope: the oracle assumes the server saw nothing before the run.
@pytest.fixture
def reuse_server():
    with MockServer(reuse=True) as server:
        yield server


@pytest.fixture
def no_reuse_server():
    with MockServer(reuse=False) as server:
        yield server


SMALL = ["--system-len", "60", "--turn-len", "10", "--reply-len", "6", "--tool-result-len", "12",
         "--quiet"]


def run_loadtest(url: str, workload: str, out: Path, *extra: str) -> results.Results:
    rc = slotserve_main(["loadtest", "run", "--url", url, "--workload", workload,
                         "--json", str(out), *SMALL, *extra])
    assert rc == 0
    return results.load(out)


def assert_consistent(res: results.Results) -> None:
    """What every report must satisfy, whatever the server."""
    s = res.summary
    assert s.num_requests == len(res.requests)
    assert s.num_ok + s.num_aborted + s.num_errors == s.num_requests
    assert [r.index for r in res.requests] == list(range(len(res.requests)))
    counted = [r for r in res.requests if r.prompt_tokens is not None and r.cached_tokens is not None]
    assert s.prompt_tokens == sum(r.prompt_tokens for r in counted)
    assert s.cached_tokens == sum(r.cached_tokens for r in counted)
    assert s.oracle_cached_tokens == sum(r.oracle_cached_tokens for r in counted)
    for r in counted:  # the oracle maximum is never exceeded (the usage estimate may be)
        assert 0 <= r.oracle_cached_tokens <= r.prompt_tokens, r
        if s.oracle_source == "tokenize":
            assert r.cached_tokens <= r.oracle_cached_tokens, r
    if s.prompt_tokens:
        assert s.reuse_ratio == pytest.approx(s.cached_tokens / s.prompt_tokens)
        assert s.oracle_reuse_ratio <= 1.0
        if s.oracle_source == "tokenize":
            assert s.reuse_ratio <= s.oracle_reuse_ratio
    for r in res.requests:
        if r.status == "ok":
            assert r.ttft_s is not None and 0 < r.ttft_s <= r.e2e_s
            assert len(r.itl_s) == r.completion_tokens - 1  # one text chunk per token here
    assert sum(p.n for p in s.ttft_by_turn.values()) == sum(
        r.ttft_s is not None for r in res.requests)
    assert s.ttft_p50 <= s.ttft_p90 <= s.ttft_p99
    assert s.requests_per_s == pytest.approx(s.num_ok / s.duration_s)


@pytest.mark.parametrize("workload", SYNTHETIC_WORKLOADS)
def test_workload_reuses_with_cache(reuse_server: MockServer, workload: str, tmp_path: Path):
    res = run_loadtest(reuse_server.url, workload, tmp_path / "r.json", "--concurrency", "2")
    assert_consistent(res)
    cfg = WorkloadConfig(num_conversations=res.config.sizes["num_conversations"],
                         num_turns=res.config.sizes["num_turns"])
    assert len(res.requests) == num_planned_requests(workload, cfg)
    assert res.summary.num_errors == 0
    assert res.summary.oracle_source == "tokenize"
    later = [r for r in res.requests if r.status == "ok" and (r.turn_index >= 1 or r.attempt == 1)]
    if workload != "shared-prefix":
        assert later, "the workload has second turns or resends"
    for r in later:  # turn >= 2 (or a resend) reuses, exactly up to the mock's cap
        assert r.cached_tokens > 0
        assert r.cached_tokens == min(r.oracle_cached_tokens, r.prompt_tokens - 1)
    if workload == "shared-prefix":  # after the first users, every one reuses the system prompt
        firsts = sorted(res.requests, key=lambda r: r.start_s)[2:]
        assert all(r.cached_tokens > 60 for r in firsts)
    if workload == "abort-resend":
        aborted = [r for r in res.requests if r.status == "aborted"]
        assert len(aborted) == res.summary.num_aborted == len(res.requests) // 2
        assert all(r.attempt == 0 and r.completion_tokens == 4 for r in aborted)
        resends = [r for r in res.requests if r.attempt == 1]
        assert all(r.cached_tokens == r.prompt_tokens - 1 for r in resends)
    if workload == "agent":  # the re-rendered reply matches up to the mock's line break
        prev = {(r.conversation_id, r.turn_index): r for r in res.requests}
        for r in later:
            p = prev[(r.conversation_id, r.turn_index - 1)]
            assert r.oracle_cached_tokens == p.prompt_tokens + 2 < p.prompt_tokens + p.completion_tokens


def test_abort_disconnects_the_server(tmp_path: Path):
    with MockServer(reuse=True, token_delay_s=0.02) as server:  # aborts come mid-stream
        res = run_loadtest(server.url, "abort-resend", tmp_path / "a.json", "--concurrency", "2",
                           "--conversations", "2", "--turns", "2")
        assert server.llm.num_disconnects == res.summary.num_aborted == 4


def test_no_reuse_reports_zero_cached_but_oracle_positive(no_reuse_server: MockServer,
                                                          tmp_path: Path):
    res = run_loadtest(no_reuse_server.url, "multi-turn", tmp_path / "n.json", "--concurrency", "2")
    assert_consistent(res)
    assert res.summary.cached_tokens == 0 and res.summary.reuse_ratio == 0.0
    later = [r for r in res.requests if r.turn_index >= 1]
    assert later and all(r.cached_tokens == 0 and r.oracle_cached_tokens > 0 for r in later)
    # The oracle does not depend on the server's cache: same workload, same oracle.
    assert res.summary.oracle_reuse_ratio > 0.5


def test_json_round_trips_and_plots_are_written(reuse_server: MockServer, tmp_path: Path):
    out = tmp_path / "m.json"
    res = run_loadtest(reuse_server.url, "multi-turn", out, "--concurrency", "2",
                       "--plots", str(tmp_path / "plots"))
    again = tmp_path / "again.json"
    results.save(res, again)
    assert results.load(again) == res
    raw = json.loads(out.read_text())
    for key in ("ttft_p50", "ttft_p90", "ttft_p99", "itl_p50", "e2e_p50", "requests_per_s",
                "output_tokens_per_s", "reuse_ratio", "oracle_reuse_ratio"):
        assert key in raw["summary"]
    assert len(raw["requests"]) == raw["summary"]["num_requests"] == 8
    for name in PLOT_FILES:
        png = (tmp_path / "plots" / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000


def test_oracle_falls_back_to_usage_without_tokenize(tmp_path: Path):
    with MockServer(reuse=True, has_tokenize=False) as server:
        res = run_loadtest(server.url, "multi-turn", tmp_path / "u.json", "--concurrency", "2")
    assert res.summary.oracle_source == "usage"
    assert_consistent(res)
    # Replies appended verbatim: the estimate credits the previous prompt + reply, which is
    # exactly what the mock reuses; it misses what is shared inside a message (the first turns
    # of different conversations share a few template tokens), which the mock reuses.
    for r in res.requests:
        if r.turn_index:
            assert r.oracle_cached_tokens == r.cached_tokens > 0
        else:
            assert r.oracle_cached_tokens == 0


def test_request_budget_and_open_loop(reuse_server: MockServer, tmp_path: Path):
    res = run_loadtest(reuse_server.url, "oversubscribed", tmp_path / "o.json", "--rate", "200",
                       "--requests", "10")
    assert_consistent(res)
    assert res.config.mode == "open" and res.summary.num_requests == 10
    # 32 conversations round-robin: the first 10 requests are 10 different first turns.
    assert len({r.conversation_id for r in res.requests}) == 10


def test_duration_stops_dispatch(tmp_path: Path):
    with MockServer(reuse=True, token_delay_s=0.05) as server:  # 6 tokens: >= 0.3 s a request
        res = run_loadtest(server.url, "multi-turn", tmp_path / "d.json", "--concurrency", "2",
                           "--duration", "0.1")
    assert res.summary.num_requests == 2  # one per worker, then the deadline passed
    assert all(r.status == "ok" for r in res.requests)  # in-flight requests finished


def test_trace_replay_at_offsets(reuse_server: MockServer, tmp_path: Path):
    system = {"role": "system", "content": "You are terse. " * 20}
    specs = []
    for i in range(3):
        msgs = (system, {"role": "user", "content": f"question {i}"})
        specs.append(RequestSpec(conversation_id="c0", turn_index=i, max_tokens=4,
                                 messages=msgs, offset_s=0.05 * i))
    specs.append(RequestSpec(conversation_id="c1", turn_index=0, max_tokens=3,
                             prompt="plain text prompt", offset_s=0.2))
    trace = tmp_path / "t.jsonl"
    write_trace(trace, specs)
    res = run_loadtest(reuse_server.url, "trace", tmp_path / "t.json", "--trace", str(trace))
    assert_consistent(res)
    assert res.config.mode == "offsets" and res.summary.num_ok == 4
    for r, spec in zip(res.requests, specs):
        assert r.start_s >= spec.offset_s  # never early
        assert r.completion_tokens == spec.max_tokens
    assert [r.turn_index for r in res.requests] == [0, 1, 2, 0]
    assert all(r.cached_tokens > 40 for r in res.requests[1:3])  # the shared system prompt


def test_http_errors_are_recorded(reuse_server: MockServer, tmp_path: Path):
    out = tmp_path / "e.json"
    rc = slotserve_main(["loadtest", "run", "--url", reuse_server.url, "--workload",
                         "shared-prefix", "--json", str(out), *SMALL, "--reply-len",
                         str(MAX_TOKENS_LIMIT + 1), "--conversations", "3"])
    assert rc == 1  # nothing succeeded
    res = results.load(out)
    assert res.summary.num_errors == 3 and res.summary.num_ok == 0
    assert all(r.http_status == 400 for r in res.requests)
    assert res.summary.errors == {f"HTTP 400: max_tokens must be <= {MAX_TOKENS_LIMIT}": 3}


def test_unreachable_url_exits_2(tmp_path: Path, capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = slotserve_main(["loadtest", "run", "--url", f"http://127.0.0.1:{port}", "--workload",
                         "multi-turn", "--json", str(tmp_path / "x.json"), "--quiet"])
    assert rc == 2 and "cannot reach" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_compare_prints_ratios(reuse_server: MockServer, no_reuse_server: MockServer,
                               tmp_path: Path, capsys):
    a = run_loadtest(no_reuse_server.url, "shared-prefix", tmp_path / "a.json")
    b = run_loadtest(reuse_server.url, "shared-prefix", tmp_path / "b.json")
    capsys.readouterr()
    assert slotserve_main(["loadtest", "compare", str(tmp_path / "a.json"),
                           str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    rows = {label: (va, vb) for label, _, va, vb in report.compare_rows(a.summary, b.summary)}
    va, vb = rows["output tokens/s"]
    assert f"{vb / va:.2f}x" in out
    assert "reuse ratio" in out and "0.0%" in out  # A reused nothing
    console = Console(file=io.StringIO(), width=120)
    report.print_tables(report.summary_tables(b), console)
    assert "oracle maximum (tokenize)" in console.file.getvalue()
