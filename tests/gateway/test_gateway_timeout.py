"""--request-timeout over HTTP: a request cut short keeps its tokens (finish_reason "length"); one
that produced no token is a 503 `timeout` error, streamed or not.

The scheduler runs on a manual clock that the fake engine advances past the deadline inside a
chosen forward, so the timeout lands at an exact step with no wall-clock waiting.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from gateway_support import MODEL, chat_body, make_runtime, running_app, serve_config, sse_events
from slotserve.gateway.app import create_app
from slotserve.gateway.config import ServeConfig
from slotserve.gateway.runtime import scheduler_config

TIMEOUT_S = 5.0
USER = {"role": "user", "content": "hello"}
LONG_USER = {"role": "user", "content": "x" * 150}  # > 2 prefill segments of 64 tokens


class ManualClock:
    """The scheduler's clock; `expire_at(pool, k)` jumps it past any deadline inside forward k."""

    def __init__(self) -> None:
        self.now = time.monotonic()
        self.num_forwards = 0

    def __call__(self) -> float:
        return self.now

    def expire_at(self, pool: Any, k: int) -> None:
        def hook(batch: Any) -> None:
            self.num_forwards += 1
            if self.num_forwards == k:
                self.now += TIMEOUT_S + 1.0

        pool.forward_hook = hook


def make_app(expire_at_forward: int) -> tuple[Any, ManualClock]:
    clock = ManualClock()
    runtime, pool = make_runtime(timeout_s=TIMEOUT_S, clock=clock)
    clock.expire_at(pool, expire_at_forward)
    return create_app(runtime, serve_config(max_tokens_limit=64)), clock


def test_request_timeout_maps_to_the_scheduler_default() -> None:
    assert scheduler_config(ServeConfig(request_timeout_s=2.5)).default_timeout_s == 2.5
    assert scheduler_config(ServeConfig()).default_timeout_s is None  # 0 = no limit
    with pytest.raises(ValueError, match="--request-timeout"):
        ServeConfig(request_timeout_s=-1)


async def test_timeout_after_tokens_returns_the_partial_text_as_length() -> None:
    app, clock = make_app(expire_at_forward=3)  # prefill (token 1), decode (2), decode (3), then late
    async with running_app(app) as client:
        r = await client.post("/v1/chat/completions", json=chat_body([USER], max_tokens=60, ignore_eos=True))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == MODEL
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3  # the tokens of the 3 forwards, not max_tokens
    assert body["choices"][0]["message"]["content"] != ""
    assert clock.num_forwards == 3  # nothing ran after the deadline


async def test_streamed_timeout_after_tokens_ends_with_length() -> None:
    app, clock = make_app(expire_at_forward=3)
    body = chat_body(
        [USER], max_tokens=60, ignore_eos=True, stream=True, stream_options={"include_usage": True}
    )
    async with running_app(app) as client:
        r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    finishes = [c["choices"][0]["finish_reason"] for c in events[:-1] if c["choices"]]
    assert finishes[-1] == "length" and finishes[:-1] == [None] * (len(finishes) - 1)
    assert events[-2]["usage"]["completion_tokens"] == 3
    assert clock.num_forwards == 3


async def test_timeout_before_the_first_token_is_a_503() -> None:
    app, clock = make_app(expire_at_forward=1)  # deadline passes during the first prefill segment
    async with running_app(app) as client:
        r = await client.post("/v1/chat/completions", json=chat_body([LONG_USER], max_tokens=8))
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert (err["code"], err["type"]) == ("timeout", "service_unavailable_error")
    assert "--request-timeout" in err["message"]
    assert clock.num_forwards == 1  # the remaining segments were never computed


async def test_streamed_timeout_before_the_first_token_sends_an_error_event() -> None:
    app, clock = make_app(expire_at_forward=1)
    async with running_app(app) as client:
        r = await client.post("/v1/chat/completions", json=chat_body([LONG_USER], max_tokens=8, stream=True))
    assert r.status_code == 200  # headers went out before the deadline
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "timeout"
    assert all("error" not in e for e in events[:-2])
    assert clock.num_forwards == 1


async def test_no_timeout_by_default() -> None:
    clock = ManualClock()
    runtime, pool = make_runtime(clock=clock)  # the scheduler's default: no limit
    clock.expire_at(pool, 1)
    async with running_app(create_app(runtime, serve_config())) as client:
        r = await client.post("/v1/chat/completions", json=chat_body([USER], max_tokens=6, ignore_eos=True))
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 6
