"""A client that leaves: its request is cancelled, and the handler returns only after the
scheduler acknowledged, with the slot released and serving the next request correctly.

The app is called as ASGI directly (as uvicorn would, spec 2.3) with a receive() that reports
`http.disconnect` when the test says so.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from gateway_support import (
    ASGIDriver,
    body_of,
    chat_body,
    make_runtime,
    running_app,
    serve_config,
    sse_events,
    wait_until,
)
from slotserve.gateway.app import create_app
from slotserve.scheduler.request import FinishReason

USER = {"role": "user", "content": "Count to a thousand, slowly."}


class CancelSpy:
    """Wraps Scheduler.submit to record every handle and whether its cancel() was acknowledged."""

    def __init__(self, scheduler: Any):
        self.handles: list[Any] = []
        self.acked: list[bool] = []
        original = scheduler.submit

        def submit(req: Any) -> Any:
            handle = original(req)
            real_cancel = handle.cancel

            async def cancel() -> bool:
                result = await real_cancel()
                self.acked.append(result)
                return result

            handle.cancel = cancel
            self.handles.append(handle)
            return handle

        scheduler.submit = submit


def setup(num_slots: int = 1, max_queue: int = 4) -> tuple[Any, Any, Any, CancelSpy]:
    runtime, pool = make_runtime(num_slots=num_slots, max_queue=max_queue)
    spy = CancelSpy(runtime.scheduler)
    app = create_app(runtime, serve_config(max_tokens_limit=4096, default_max_tokens=16))
    return app, runtime, pool, spy


def assert_slots_free(runtime: Any) -> None:
    for view in runtime.scheduler.slots():
        assert view.request_id is None, view
        assert view.state in ("idle", "empty"), view


async def reference_text(messages: list[dict[str, str]], max_tokens: int) -> str:
    """The greedy answer from a fresh server (cold): what a healthy slot must produce."""
    runtime, _ = make_runtime(num_slots=1, reuse=False)
    app = create_app(runtime, serve_config(max_tokens_limit=4096))
    async with running_app(app) as client:
        r = await client.post("/v1/chat/completions", json=chat_body(messages, max_tokens=max_tokens))
    return r.json()["choices"][0]["message"]["content"]


async def test_disconnect_mid_stream_cancels_before_the_handler_returns() -> None:
    app, runtime, pool, spy = setup()
    driver = ASGIDriver(app)
    gone = asyncio.Event()
    body = json.dumps(chat_body([USER], max_tokens=2000, ignore_eos=True, stream=True)).encode()
    async with running_app(app) as client:
        sent, task = await driver.request("POST", "/v1/chat/completions", body, gone)
        # wait for real tokens on the wire: the request is decoding
        await wait_until(lambda: body_of(sent).count("data: ") >= 4)
        assert not task.done()
        gone.set()
        await asyncio.wait_for(task, 10)
        # the handler has returned: the cancel was sent and acknowledged already
        assert spy.acked == [True]
        assert spy.handles[0].finish.reason is FinishReason.CANCELLED
        assert_slots_free(runtime)
        assert "[DONE]" not in body_of(sent)
        # the slot serves the next request exactly like a fresh server
        other = [{"role": "user", "content": "Something else entirely."}]
        r = await client.post("/v1/chat/completions", json=chat_body(other, max_tokens=12))
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == await reference_text(other, 12)


async def test_disconnect_while_queued_cancels_the_queued_request() -> None:
    app, runtime, pool, spy = setup(num_slots=1)
    gate_in, gate_open = threading.Event(), threading.Event()

    def hook(batch: Any) -> None:
        gate_in.set()
        gate_open.wait(timeout=30)

    pool.forward_hook = hook
    driver = ASGIDriver(app)
    async with running_app(app) as client:
        holder = asyncio.create_task(
            client.post("/v1/chat/completions", json=chat_body([USER], max_tokens=4))
        )
        await wait_until(gate_in.is_set)
        gone = asyncio.Event()
        body = json.dumps(chat_body([USER], max_tokens=4, stream=True)).encode()
        sent, task = await driver.request("POST", "/v1/chat/completions", body, gone)
        await wait_until(lambda: runtime.scheduler.stats().queue_depth == 1)
        gone.set()
        await asyncio.wait_for(task, 10)
        assert spy.acked == [True]  # the queued request, cancelled before it got a slot
        assert spy.handles[1].finish.reason is FinishReason.CANCELLED
        assert spy.handles[1].finish.reuse is None
        assert runtime.scheduler.stats().queue_depth == 0
        pool.forward_hook = None
        gate_open.set()
        assert (await holder).status_code == 200


async def test_disconnect_during_a_non_streaming_request() -> None:
    app, runtime, pool, spy = setup()
    driver = ASGIDriver(app)
    gone = asyncio.Event()
    body = json.dumps(chat_body([USER], max_tokens=2000, ignore_eos=True)).encode()
    async with running_app(app):
        sent, task = await driver.request("POST", "/v1/chat/completions", body, gone)
        await wait_until(lambda: any(v.state == "decode" for v in runtime.scheduler.slots()))
        gone.set()
        await asyncio.wait_for(task, 10)
        assert spy.acked == [True]
        assert_slots_free(runtime)
    start = next(m for m in sent if m["type"] == "http.response.start")
    assert start["status"] == 499


async def test_finished_stream_sends_no_cancel() -> None:
    app, runtime, pool, spy = setup()
    driver = ASGIDriver(app)
    gone = asyncio.Event()
    body = json.dumps(chat_body([USER], max_tokens=6, stream=True)).encode()
    async with running_app(app):
        sent, task = await driver.request("POST", "/v1/chat/completions", body, gone)
        await wait_until(lambda: "[DONE]" in body_of(sent))
        gone.set()  # the client closes after [DONE], as clients do
        await asyncio.wait_for(task, 10)
    assert spy.acked == []  # nothing to cancel: the request had finished
    assert sse_events(body_of(sent))[-1] == "[DONE]"


async def test_disconnect_during_prefill_cancels_between_segments() -> None:
    app, runtime, pool, spy = setup(num_slots=1)
    pool.forward_hook = lambda batch: threading.Event().wait(0.02)  # each 64-token segment takes a while
    driver = ASGIDriver(app)
    gone = asyncio.Event()
    long_prompt = [{"role": "user", "content": "word " * 80}]  # ~420 tokens: several prefill segments
    body = json.dumps(chat_body(long_prompt, max_tokens=4, stream=True)).encode()
    async with running_app(app) as client:
        sent, task = await driver.request("POST", "/v1/chat/completions", body, gone)
        await wait_until(lambda: any(v.state == "prefill" for v in runtime.scheduler.slots()))
        gone.set()
        await asyncio.wait_for(task, 10)
        assert spy.acked == [True]
        finish = spy.handles[0].finish
        assert finish.reason is FinishReason.CANCELLED
        assert finish.completion_tokens == 0
        assert_slots_free(runtime)
        pool.forward_hook = None
        other = [{"role": "user", "content": "Something else entirely."}]
        r = await client.post("/v1/chat/completions", json=chat_body(other, max_tokens=12))
    assert r.json()["choices"][0]["message"]["content"] == await reference_text(other, 12)


# greedy: a sampled reply could reach eos before the hook holds the engine (it did, 1 run in 10)
AGENT_BODIES = {
    "/v1/messages": {
        "model": "fake-model",
        "max_tokens": 2000,
        "messages": [USER],
        "stream": True,
        "temperature": 0,
    },
    "/v1/responses": {
        "model": "fake-model",
        "max_output_tokens": 2000,
        "input": USER["content"],
        "stream": True,
        "temperature": 0,
    },
}


@pytest.mark.parametrize("path", sorted(AGENT_BODIES))
async def test_agent_api_streams_cancel_on_disconnect(path: str) -> None:
    """/v1/messages and /v1/responses stream through the same cancel path: a client that leaves
    mid-stream is cancelled and acknowledged before the handler returns."""
    app, runtime, pool, spy = setup()
    held, release = threading.Event(), threading.Event()
    num_forwards = 0

    def hook(batch: Any) -> None:  # hold the engine after a few decode steps: the stream is open
        nonlocal num_forwards
        num_forwards += 1
        if num_forwards >= 6:
            held.set()
            release.wait(timeout=30)

    pool.forward_hook = hook
    driver = ASGIDriver(app)
    gone = asyncio.Event()
    async with running_app(app) as client:
        sent, task = await driver.request("POST", path, json.dumps(AGENT_BODIES[path]).encode(), gone)
        await wait_until(held.is_set)
        assert body_of(sent).count("event: ") >= 3 and not task.done()
        gone.set()
        await asyncio.sleep(0.05)
        pool.forward_hook = None
        release.set()
        await asyncio.wait_for(task, 10)
        assert spy.acked == [True]
        assert spy.handles[0].finish.reason is FinishReason.CANCELLED
        assert_slots_free(runtime)
        assert "message_stop" not in body_of(sent) and "response.completed" not in body_of(sent)
        r = await client.post("/v1/chat/completions", json=chat_body([USER], max_tokens=4))
    assert r.status_code == 200


@pytest.mark.parametrize("stream", [True, False])
async def test_disconnect_cancels_every_choice_of_n(stream: bool) -> None:
    app, runtime, pool, spy = setup(num_slots=2)
    driver = ASGIDriver(app)
    gone = asyncio.Event()
    body = json.dumps(chat_body([USER], max_tokens=2000, ignore_eos=True, stream=stream, n=2)).encode()
    async with running_app(app):
        sent, task = await driver.request("POST", "/v1/chat/completions", body, gone)
        await wait_until(
            lambda: len(spy.handles) == 2 and all(v.state == "decode" for v in runtime.scheduler.slots())
        )
        gone.set()
        await asyncio.wait_for(task, 10)
        assert spy.acked == [True, True]  # both choices cancelled and acknowledged
        assert [h.finish.reason for h in spy.handles] == [FinishReason.CANCELLED] * 2
        assert_slots_free(runtime)
