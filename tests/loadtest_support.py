"""Load-harness test support: a mock OpenAI-compatible server with a prefix cache, the CLI
runner, and the consistency checks every report must pass (tests/bench/test_loadtest_*.py).

The mock (Starlette on a free loopback port, in a thread) tokenises GPT-2 style, renders chat
messages ChatML style, and reports `cached_tokens` = the longest common prefix of the prompt
with anything it has seen (prompts at arrival; prompt + generated tokens when a stream ends),
capped at len(prompt) - 1 like real servers. That is the oracle's definition minus the cap, so
the harness's report can be checked exactly: cached <= oracle on every request.

`llama_cpp=True` makes it answer as llama.cpp's server does: POST /tokenize reads only
`content` (anything else gets `{"tokens": []}`), chat prompts are rendered by POST
/apply-template, and the cached count comes as `timings.cache_n` beside a `usage` without
`prompt_tokens_details` (as llama.cpp reported it before it had that field).

`empty_replies=True` makes every generated token print nothing (a model sampling UNUSED
tokens): the mock then sends a chunk per token only when the request asked for logprobs (as
slotserve does), or, with `llama_cpp`, as llama.cpp's server does: no chunk for such a token
except the first, whose role chunk carries its logprobs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from slotserve.bench.loadtest import results
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from slotserve.cli import main as slotserve_main

_PIECES = re.compile(r"<\|im_start\|>|<\|im_end\|>| ?\w+| ?[^\w\s]+|\s+(?!\S)|\s+")
_REPLY_WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "zeta")
MAX_TOKENS_LIMIT = 1000


class MockLLM:
    """Tokeniser, template, prefix 'cache' and a fake generator. One event loop uses it."""

    def __init__(self, reuse: bool, token_delay_s: float, empty_replies: bool = False) -> None:
        self.reuse, self.token_delay_s, self.empty_replies = reuse, token_delay_s, empty_replies
        self.vocab: dict[str, int] = {}
        self.seen: list[list[int]] = []  # every sequence the 'server' computed
        self.num_disconnects = 0
        self.generated_at_disconnect: list[int] = []  # tokens generated before each disconnect
        self.num_requests = 0
        self.num_apply_template = 0  # POST /apply-template calls (llama.cpp dialect)

    def encode(self, text: str) -> list[int]:
        return [self.vocab.setdefault(p, len(self.vocab)) for p in _PIECES.findall(text)]

    @staticmethod
    def render(messages: list[dict], add_generation_prompt: bool = True) -> str:
        text = "".join(f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages)
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
        if self.empty_replies:
            return [""] * n
        h = hashlib.sha256(str(ids).encode()).digest()
        words = [_REPLY_WORDS[h[i % len(h)] % len(_REPLY_WORDS)] for i in range(n)]
        # A line break as the third token: an agent that normalises whitespace re-renders it.
        return [w if i in (0, 3) else "\n" if i == 2 else " " + w for i, w in enumerate(words)]


def build_app(
    llm: MockLLM, has_tokenize: bool, api_key: str | None = None, llama_cpp: bool = False
) -> Starlette:
    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse(
            {"error": {"message": message, "type": "invalid_request_error"}}, status_code=status
        )

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

        want_lp = bool(body.get("logprobs"))
        lazy_role = llama_cpp and llm.empty_replies  # llama.cpp: the role chunk comes with token 1

        async def events():
            generated: list[int] = []
            is_seen = False
            try:
                await asyncio.sleep(20e-6 * (len(ids) - cached))  # 'prefill' the uncached tail
                if not lazy_role:
                    yield f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'role': 'assistant'}}]})}\n\n"
                for i, piece in enumerate(pieces):
                    await asyncio.sleep(llm.token_delay_s)
                    # a token without text is still a token: one of its own, never in a prompt
                    generated += llm.encode(piece) or [llm.vocab.setdefault(f"<unused {i}>", len(llm.vocab))]
                    choice: dict = (
                        {"index": 0, "delta": {"content": piece}} if is_chat else {"index": 0, "text": piece}
                    )
                    if lazy_role:
                        if i > 0:
                            continue
                        choice = {"index": 0, "delta": {"role": "assistant", "content": None}}
                    elif not piece and not want_lp:
                        continue
                    if want_lp:
                        choice["logprobs"] = {
                            "content": [{"token": piece, "logprob": -1.0, "top_logprobs": []}]
                        }
                    yield f"data: {json.dumps({'choices': [choice]})}\n\n"
                llm.seen.append(ids + generated)  # before the client can send its next turn
                is_seen = True
                last = {"index": 0, "finish_reason": "length"}
                last |= {"delta": {}} if is_chat else {"text": ""}
                yield f"data: {json.dumps({'choices': [last]})}\n\n"
                if include_usage:
                    usage = {
                        "prompt_tokens": len(ids),
                        "completion_tokens": len(pieces),
                        "total_tokens": len(ids) + len(pieces),
                    }
                    final: dict = {"choices": [], "usage": usage}
                    if llama_cpp:
                        final["timings"] = {"cache_n": cached, "prompt_n": len(ids) - cached}
                    else:
                        usage["prompt_tokens_details"] = {"cached_tokens": cached}
                    yield f"data: {json.dumps(final)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                if not is_seen:  # the client went away mid-stream
                    llm.seen.append(ids + generated)
                    llm.num_disconnects += 1
                    llm.generated_at_disconnect.append(len(generated))

        return StreamingResponse(events(), media_type="text/event-stream")

    async def anthropic_messages(request: Request) -> StreamingResponse | JSONResponse:
        """Anthropic's /v1/messages, streamed: blocks joined by newlines into ChatML messages,
        usage in message_start and (cumulative, with cache_read_input_tokens) message_delta."""
        body = await request.json()
        if body.get("max_tokens", 16) > MAX_TOKENS_LIMIT:
            return error(400, f"max_tokens must be <= {MAX_TOKENS_LIMIT}")
        messages = [{"role": "system", "content": "\n".join(b["text"] for b in body["system"])}]
        messages += [
            {"role": m["role"], "content": "\n".join(b["text"] for b in m["content"])}
            for m in body["messages"]
        ]
        ids = llm.encode(llm.render(messages))
        cached = llm.cached_len(ids)
        llm.seen.append(ids)
        llm.num_requests += 1
        pieces = llm.reply_pieces(ids, body["max_tokens"])

        def event(kind: str, data: dict) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

        async def events():
            start = {"usage": {"input_tokens": len(ids), "output_tokens": 0}}
            yield event("message_start", {"message": start})
            generated: list[int] = []
            for piece in pieces:
                await asyncio.sleep(llm.token_delay_s)
                generated += llm.encode(piece)
                yield event(
                    "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}}
                )
            llm.seen.append(ids + generated)
            usage = {
                "input_tokens": len(ids) - cached,
                "output_tokens": len(pieces),
                "cache_read_input_tokens": cached,
                "cache_creation_input_tokens": 0,
            }
            yield event("message_delta", {"delta": {"stop_reason": "max_tokens"}, "usage": usage})
            yield event("message_stop", {})

        return StreamingResponse(events(), media_type="text/event-stream")

    async def responses(request: Request) -> StreamingResponse | JSONResponse:
        """OpenAI's /v1/responses, streamed: instructions then input message items as ChatML;
        usage (input_tokens_details.cached_tokens) in response.completed."""
        body = await request.json()
        if body.get("max_output_tokens", 16) > MAX_TOKENS_LIMIT:
            return error(400, f"max_output_tokens must be <= {MAX_TOKENS_LIMIT}")
        messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
        messages += [
            {"role": it["role"], "content": "".join(c["text"] for c in it["content"])} for it in body["input"]
        ]
        ids = llm.encode(llm.render(messages))
        cached = llm.cached_len(ids)
        llm.seen.append(ids)
        llm.num_requests += 1
        pieces = llm.reply_pieces(ids, body["max_output_tokens"])

        def event(kind: str, data: dict) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

        async def events():
            yield event("response.created", {"response": {"status": "in_progress"}})
            generated: list[int] = []
            for piece in pieces:
                await asyncio.sleep(llm.token_delay_s)
                generated += llm.encode(piece)
                yield event("response.output_text.delta", {"delta": piece})
            llm.seen.append(ids + generated)
            usage = {
                "input_tokens": len(ids),
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": len(pieces),
            }
            yield event("response.incomplete", {"response": {"status": "incomplete", "usage": usage}})

        return StreamingResponse(events(), media_type="text/event-stream")

    async def tokenize(request: Request) -> JSONResponse:
        if not has_tokenize:
            return error(404, "not found")
        body = await request.json()
        if llama_cpp:
            return JSONResponse({"tokens": llm.encode(body["content"]) if "content" in body else []})
        if "messages" in body:
            text = llm.render(body["messages"], body.get("add_generation_prompt", True))
        else:
            text = body["prompt"]
        ids = llm.encode(text)
        return JSONResponse({"tokens": ids, "count": len(ids)})

    async def apply_template(request: Request) -> JSONResponse:
        if not llama_cpp:
            return error(404, "not found")
        llm.num_apply_template += 1
        return JSONResponse({"prompt": llm.render((await request.json())["messages"])})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "mock-model", "object": "model"}]})

    async def check_key(request: Request, call_next):
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            return error(401, "missing or wrong API key")
        return await call_next(request)

    return Starlette(
        middleware=[Middleware(BaseHTTPMiddleware, dispatch=check_key)],
        routes=[
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/messages", anthropic_messages, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/apply-template", apply_template, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ],
    )


class MockServer:
    """The mock app under uvicorn in a thread, on a socket bound to 127.0.0.1:0."""

    def __init__(
        self,
        reuse: bool = True,
        has_tokenize: bool = True,
        api_key: str | None = None,
        token_delay_s: float = 0.0005,
        llama_cpp: bool = False,
        empty_replies: bool = False,
    ) -> None:
        self.llm = MockLLM(reuse, token_delay_s, empty_replies)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(
            build_app(self.llm, has_tokenize, api_key, llama_cpp), log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

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


SMALL = ["--system-len", "60", "--turn-len", "10", "--reply-len", "6", "--tool-result-len", "12", "--quiet"]


def run_loadtest(url: str, workload: str, out: Path, *extra: str) -> results.Results:
    rc = slotserve_main(
        ["loadtest", "run", "--url", url, "--workload", workload, "--json", str(out), *SMALL, *extra]
    )
    assert rc == 0
    return results.load(out)


def assert_consistent(res: results.Results, one_chunk_per_token: bool = False) -> None:
    """What every report must satisfy, whatever the server (`one_chunk_per_token`: the mock's
    streams carry exactly one token per text chunk)."""
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
            if one_chunk_per_token:
                assert len(r.itl_s) == r.completion_tokens - 1
            else:  # a chunk carries at least one token
                assert len(r.itl_s) <= r.completion_tokens - 1
    assert sum(p.n for p in s.ttft_by_turn.values()) == sum(r.ttft_s is not None for r in res.requests)
    num_returning = sum(p.n for t, p in s.ttft_by_turn.items() if t >= 1)
    assert (s.ttft_returning.n if s.ttft_returning else 0) == num_returning
    assert s.ttft_p50 <= s.ttft_p90 <= s.ttft_p99
    assert s.requests_per_s == pytest.approx(s.num_ok / s.duration_s)
