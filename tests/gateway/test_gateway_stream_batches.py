"""Batched SSE writes: a stream that fell behind sends every queued event in one body message,
and still delivers every token in order, stops exactly at a stop string, and has its cancel
acknowledged when the client leaves."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from gateway_support import MODEL, ASGIDriver, chat_body, make_runtime, serve_config, sse_events, wait_until
from slotserve.gateway.app import create_app
from slotserve.gateway.openai_stream import ChatStream
from slotserve.gateway.streaming import EventStream
from slotserve.scheduler.request import FinishReason, GenerationRequest, SamplingParams, TokenEvent

PROMPT = [5, 17, 99, 3, 42, 8]


def greedy(max_tokens: int, **params: Any) -> GenerationRequest:
    sampling = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **params)
    return GenerationRequest(prompt_ids=list(PROMPT), params=sampling)


def content_of(events: list[Any]) -> str:
    return "".join(c["delta"].get("content") or "" for e in events if e != "[DONE]" for c in e["choices"])


async def one_at_a_time(sched: Any, req: GenerationRequest) -> tuple[list[str], FinishReason]:
    """The request's texts, read one event per step (the unbatched reference)."""
    texts, reason = [], None
    async for ev in sched.submit(req):
        if isinstance(ev, TokenEvent):
            texts.append(ev.text)
        else:
            texts.append(ev.text)
            reason = ev.reason
    return texts, reason


async def test_a_stream_that_fell_behind_sends_every_queued_token_in_one_write_in_order():
    runtime, _ = make_runtime(num_slots=1, reuse=False)
    async with runtime.scheduler as sched:
        texts, _ = await one_at_a_time(sched, greedy(60))
        handle = sched.submit(greedy(60))
        await wait_until(lambda: handle.finish is not None)  # every event is queued, none read
        items = [x async for x in EventStream(handle, ChatStream("r1", MODEL, include_usage=True))]
    assert len(items) == 2  # the role delta, then all 60 tokens, the finish, usage and [DONE]
    events = sse_events(b"".join(items).decode())
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 60
    assert [e["choices"][0]["finish_reason"] for e in events[1:-2]][-1] == "length"
    assert sum(1 for t in texts if t) == len(events) - 4  # one chunk per non-empty text
    assert content_of(events) == "".join(texts)  # every token, in order


async def test_batched_stream_stops_exactly_at_a_stop_string():
    runtime, _ = make_runtime(num_slots=1, reuse=False)
    async with runtime.scheduler as sched:
        texts, _ = await one_at_a_time(sched, greedy(80))
        full = "".join(texts)
        stop = full[30:33]
        assert stop and full.find(stop) >= 0
        handle = sched.submit(greedy(80, stop=(stop,)))
        await wait_until(lambda: handle.finish is not None)
        items = [x async for x in EventStream(handle, ChatStream("r2", MODEL, include_usage=False))]
    events = sse_events(b"".join(items).decode())
    assert content_of(events) == full[: full.find(stop)]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


async def test_a_slow_client_gets_batched_body_messages_and_the_whole_answer():
    runtime, _ = make_runtime(num_slots=1, reuse=False)
    app = create_app(runtime, serve_config(max_tokens_limit=4096))
    messages = [{"role": "user", "content": "Tell me everything."}]
    body = json.dumps(chat_body(messages, max_tokens=50, stream=True, ignore_eos=True)).encode()
    release, done = asyncio.Event(), asyncio.Event()
    async with app.router.lifespan_context(app):
        sched = runtime.scheduler
        sent, task = await ASGIDriver(app).request(
            "POST", "/v1/chat/completions", body, done, hold_body=release
        )
        # the response started (so the request was submitted), and it has run to its end
        await wait_until(
            lambda: len(sent) == 1 and sched.stats().num_running == sched.stats().queue_depth == 0
        )
        release.set()
        await asyncio.wait_for(task, 30)
        done.set()
        ref, _ = await one_at_a_time(
            sched,
            GenerationRequest(
                prompt_ids=runtime.tokenizer.encode(runtime.chat.render(messages)),
                params=SamplingParams(temperature=0, max_tokens=50, ignore_eos=True),
            ),
        )
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body" and m["body"]]
    events = sse_events(b"".join(bodies).decode())
    assert len(bodies) == 2 and len(events) > 10  # the opening, then everything queued in one write
    assert content_of(events) == "".join(ref)
    assert events[-1] == "[DONE]"


async def test_a_client_leaving_mid_stream_cancels_with_an_acknowledgement():
    runtime, pool = make_runtime(num_slots=1, reuse=False)
    pool.forward_hook = lambda batch: time.sleep(0.002)  # 400 steps take at least 0.8 s
    async with runtime.scheduler as sched:
        handle = sched.submit(greedy(400))
        stream = EventStream(handle, ChatStream("r3", MODEL, include_usage=False))
        it = stream.__aiter__()
        opening, tokens = await it.__anext__(), await it.__anext__()
        assert b'"role"' in opening and b'"content"' in tokens
        await stream.aclose()  # what SSEResponse does when the client leaves
        assert stream.is_finished is False
        assert handle.finish is not None and handle.finish.reason is FinishReason.CANCELLED
        assert 0 < handle.finish.completion_tokens < 400
        assert sched.stats().num_running == 0
