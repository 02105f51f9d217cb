"""One streamed request to an OpenAI-compatible endpoint (or, for a spec with `api` "messages",
Anthropic's /v1/messages: `messages_body`, `_apply_event`; "responses": OpenAI's /v1/responses,
`responses_body`, `_apply_response_event`), timed as its user feels it.

Design: `send` posts a `RequestSpec` with `stream: true` and `stream_options.include_usage`,
reads the server-sent events and stamps the arrival of every chunk that carries text, or with
`SendParams.logprobs` a token's logprob (a random-weight model's tokens often print nothing).
TTFT is send -> first such chunk, inter-token latencies are the gaps between them (a server
that packs several tokens in one chunk shows one gap for them), end-to-end is send -> end of
stream.
Token counts come from the final `usage` chunk; `prompt_tokens_details.cached_tokens` is the
server's own count of prompt tokens it did not compute (or, from a server that reports no
`prompt_tokens_details`, llama.cpp's `timings.cache_n`: the same count).

An abort closes the response after `abort_after_tokens` generated tokens, which drops the
connection: the server sees a disconnect. Tokens are counted whether or not they carry text (a
model may sample tokens that print nothing: UNUSED padding, control tokens): a request that will
be aborted asks for logprobs (`logprobs`, `top_logprobs` 1), and a chunk counts one token per
logprobs entry, else one per text piece. A server that sends no chunk for a token without text
(llama.cpp's server after the first token; its first chunk carries the first token's logprobs)
can be aborted at its first token only: `--abort-after 1`.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from .sse import aiter_sse
from .workloads import Outcome, RequestSpec


@dataclass(frozen=True, slots=True)
class SendParams:
    """What every request of a run shares."""

    model: str
    temperature: float = 0.0
    seed: int | None = None  # sent only when temperature > 0
    ignore_eos: bool = False  # sent as the non-standard `ignore_eos` only when True
    logprobs: bool = False  # ask for each token's logprob, so tokens that print nothing still time TTFT
    timeout_s: float = 120.0  # per request, send -> end of stream
    api_key: str | None = field(default=None, repr=False)  # sent as a Bearer token


@dataclass(slots=True)
class Exchange:
    """A request and what came back. Times are `time.perf_counter()` seconds."""

    spec: RequestSpec
    index: int  # dispatch order within the run
    t_send: float
    outcome: Outcome = Outcome.ERROR
    t_end: float = 0.0
    token_times: list[float] = field(default_factory=list)  # chunks with text (or a token's logprob)
    text_parts: list[str] = field(default_factory=list)  # [num_text_chunks]
    tokens_streamed: int = 0  # generated tokens the stream showed, with or without text
    time_logprobs: bool = False  # a chunk carrying only a token's logprob times it (SendParams.logprobs)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    http_status: int | None = None
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


def request_body(spec: RequestSpec, params: SendParams) -> dict[str, Any]:
    """The JSON body for `spec` (chat when it has messages, text completion otherwise)."""
    body: dict[str, Any] = {
        "model": params.model,
        "max_tokens": spec.max_tokens,
        "temperature": params.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if spec.messages is not None:
        body["messages"] = list(spec.messages)
    else:
        body["prompt"] = spec.prompt
    if params.temperature > 0 and params.seed is not None:
        body["seed"] = params.seed
    if params.ignore_eos:
        body["ignore_eos"] = True
    if (
        params.logprobs or spec.abort_after_tokens is not None
    ):  # a token without text still shows as a logprob
        body.update({"logprobs": True, "top_logprobs": 1} if spec.messages is not None else {"logprobs": 1})
    body.update(spec.extra_body)
    return body


def endpoint(spec: RequestSpec) -> str:
    if spec.api in ("messages", "responses"):
        return f"/v1/{spec.api}"
    return "/v1/chat/completions" if spec.messages is not None else "/v1/completions"


_BILLING = "x-anthropic-billing-header:"
_REMINDER = "\n<system-reminder>"


def messages_body(spec: RequestSpec, params: SendParams) -> dict[str, Any]:
    """The Anthropic Messages body of a chat-shaped spec, as Claude Code sends it: a system
    prompt opening with the billing header becomes two system blocks, a user turn ending in a
    `<system-reminder>` two text blocks, and the last block carries cache_control. Joined by
    newlines (the server's rendering), the blocks are the chat messages again."""
    assert spec.messages is not None
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for m in spec.messages:
        text = str(m["content"])
        if m["role"] == "system":
            head, sep, rest = text.partition("\n")
            parts = [head, rest] if text.startswith(_BILLING) and sep else [text]
            system += [{"type": "text", "text": t} for t in parts]
            continue
        cut = text.find(_REMINDER) if m["role"] == "user" else -1
        parts = [text[:cut], text[cut + 1 :]] if cut > 0 else [text]
        messages.append({"role": m["role"], "content": [{"type": "text", "text": t} for t in parts]})
    if messages:
        messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    body: dict[str, Any] = {
        "model": params.model,
        "max_tokens": spec.max_tokens,
        "temperature": params.temperature,
        "stream": True,
        "messages": messages,
    }
    if system:
        body["system"] = system
    body.update(spec.extra_body)
    return body


def responses_body(spec: RequestSpec, params: SendParams) -> dict[str, Any]:
    """The OpenAI Responses body of a chat-shaped spec, as Codex CLI sends it: the system message
    as `instructions`, every turn replayed as input message items, `store: false`."""
    assert spec.messages is not None
    items: list[dict[str, Any]] = []
    instructions = None
    for m in spec.messages:
        if m["role"] == "system":
            instructions = str(m["content"])
            continue
        kind = "output_text" if m["role"] == "assistant" else "input_text"
        items.append(
            {"type": "message", "role": m["role"], "content": [{"type": kind, "text": m["content"]}]}
        )
    body: dict[str, Any] = {
        "model": params.model,
        "input": items,
        "store": False,
        "stream": True,
        "max_output_tokens": spec.max_tokens,
        "temperature": params.temperature,
    }
    if instructions is not None:
        body["instructions"] = instructions
    body.update(spec.extra_body)
    return body


def _apply_response_event(ex: Exchange, event: Any, now: float) -> None:
    """Fold one Responses stream event into `ex` (usage from the terminal response object)."""
    if not isinstance(event, dict):
        raise _StreamError(f"malformed stream event: {json.dumps(event)[:200]}")
    kind = event.get("type")
    if kind in ("error", "response.failed"):
        err = event.get("error") or (event.get("response") or {}).get("error")
        raise _StreamError(err.get("message", str(err)) if isinstance(err, dict) else str(err))
    if kind in ("response.output_text.delta", "response.reasoning_text.delta") and event.get("delta"):
        ex.tokens_streamed += 1
        ex.token_times.append(now)
        ex.text_parts.append(str(event["delta"]))
    response = event.get("response")
    if kind in ("response.completed", "response.incomplete") and isinstance(response, dict):
        ex.finish_reason = response.get("status")
        usage = response.get("usage")
        if isinstance(usage, dict):
            ex.prompt_tokens = usage.get("input_tokens")
            ex.completion_tokens = usage.get("output_tokens")
            details = usage.get("input_tokens_details")
            if isinstance(details, dict):
                ex.cached_tokens = details.get("cached_tokens")


def _apply_event(ex: Exchange, event: Any, now: float) -> None:
    """Fold one Anthropic stream event into `ex` (usage: message_start's, then message_delta's
    cumulative counts; prompt tokens = input + cache read + cache creation)."""
    if not isinstance(event, dict):
        raise _StreamError(f"malformed stream event: {json.dumps(event)[:200]}")
    kind = event.get("type")
    if kind == "error":
        err = event.get("error")
        raise _StreamError(err.get("message", str(err)) if isinstance(err, dict) else str(err))
    usage = event.get("usage") if kind == "message_delta" else (event.get("message") or {}).get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("input_tokens"), int):
        cached = usage.get("cache_read_input_tokens") or 0
        ex.prompt_tokens = usage["input_tokens"] + cached + (usage.get("cache_creation_input_tokens") or 0)
        ex.cached_tokens = cached
    if isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
        # NOTE: llama.cpp's server sends only output_tokens in message_delta: the prompt counts
        # stay message_start's (it knows its cache when it sends it)
        ex.completion_tokens = usage["output_tokens"]
    delta = event.get("delta")
    if kind == "content_block_delta" and isinstance(delta, dict):
        piece = delta.get("text") or delta.get("thinking")
        if piece:
            ex.tokens_streamed += 1
            ex.token_times.append(now)
            ex.text_parts.append(piece)
    if kind == "message_delta" and isinstance(delta, dict) and delta.get("stop_reason"):
        ex.finish_reason = delta["stop_reason"]


def _error_message(raw: bytes) -> str:
    try:
        obj = json.loads(raw)
        err = obj.get("error", obj)
        return str(err.get("message", err) if isinstance(err, dict) else err)
    except (ValueError, AttributeError):
        return raw[:300].decode("utf-8", "replace")


def _apply_chunk(ex: Exchange, chunk: Any, now: float) -> None:
    """Fold one decoded stream chunk into `ex` (raises _StreamError for an error chunk or a
    chunk that is not an object with a list of object `choices`)."""
    choices = (chunk.get("choices") or []) if isinstance(chunk, dict) else None
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise _StreamError(f"malformed stream chunk: {json.dumps(chunk)[:200]}")
    if "error" in chunk:
        err = chunk["error"]
        raise _StreamError(err.get("message", str(err)) if isinstance(err, dict) else str(err))
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        ex.prompt_tokens = usage.get("prompt_tokens")
        ex.completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            ex.cached_tokens = details.get("cached_tokens")
    timings = chunk.get("timings")
    if ex.cached_tokens is None and isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
        # NOTE: llama.cpp's server before it reported prompt_tokens_details: its own count of
        # prompt tokens taken from the slot's cache, beside `usage` in the last chunks.
        ex.cached_tokens = timings["cache_n"]
    for choice in choices:
        delta = choice.get("delta")
        piece = (
            (delta.get("content") or delta.get("reasoning_content"))
            if isinstance(delta, dict)
            else choice.get("text")
        )
        shown = _logprob_entries(choice.get("logprobs"))
        if piece or (shown and ex.time_logprobs):  # a token: its text, or (--logprobs) its logprob
            ex.token_times.append(now)
        if piece:
            ex.text_parts.append(piece)
        ex.tokens_streamed += shown if shown else 1 if piece else 0
        if choice.get("finish_reason"):
            ex.finish_reason = choice["finish_reason"]


def _logprob_entries(logprobs: Any) -> int:
    """Tokens a choice's logprobs describe: chat's `content` list, text completion's `tokens`."""
    if not isinstance(logprobs, dict):
        return 0
    entries = logprobs.get("content", logprobs.get("tokens"))
    return len(entries) if isinstance(entries, list) else 0


class _StreamError(Exception):
    """An error object inside the event stream."""


async def _stream(client: httpx.AsyncClient, base_url: str, ex: Exchange, params: SendParams) -> None:
    spec = ex.spec
    url = base_url + endpoint(spec)
    shapes = {"messages": (messages_body, _apply_event), "responses": (responses_body, _apply_response_event)}
    make_body, apply = shapes.get(spec.api, (request_body, _apply_chunk))
    body = make_body(spec, params)
    async with client.stream("POST", url, json=body, headers=dict(spec.headers)) as resp:
        ex.http_status = resp.status_code
        if resp.status_code != 200:
            ex.error = f"HTTP {resp.status_code}: {_error_message(await resp.aread())}"
            return
        async for data in aiter_sse(resp.aiter_lines()):
            apply(ex, json.loads(data), time.perf_counter())
            if spec.abort_after_tokens is not None and ex.tokens_streamed >= spec.abort_after_tokens:
                ex.outcome = Outcome.ABORTED
                return  # leaving the context closes the connection mid-stream
    ex.outcome = Outcome.OK


async def send(
    client: httpx.AsyncClient, base_url: str, spec: RequestSpec, index: int, params: SendParams
) -> Exchange:
    """Send `spec` and return the exchange; never raises for server or network failures
    (they become Outcome.ERROR / TIMEOUT with `error` set)."""
    ex = Exchange(spec=spec, index=index, t_send=time.perf_counter(), time_logprobs=params.logprobs)
    try:
        await asyncio.wait_for(_stream(client, base_url, ex, params), params.timeout_s)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        ex.outcome, ex.error = Outcome.TIMEOUT, f"no complete reply within {params.timeout_s} s"
    except (httpx.HTTPError, _StreamError, ValueError) as exc:
        ex.outcome, ex.error = Outcome.ERROR, f"{type(exc).__name__}: {exc}"
    ex.t_end = time.perf_counter()
    if ex.outcome is Outcome.OK and ex.completion_tokens is None:
        ex.completion_tokens = len(ex.token_times)  # no usage chunk: count text chunks
    return ex
