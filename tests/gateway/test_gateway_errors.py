"""Every error path over HTTP: status, OpenAI error shape, and the fields that name the cause."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest
from gateway_support import MODEL, chat_body, make_runtime, running_app, serve_config, wait_until
from slotserve.gateway.app import create_app

USER = {"role": "user", "content": "hello"}
JSON = {"content-type": "application/json"}


def assert_error(
    r: httpx.Response, status: int, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if code is not None:
        assert err["code"] == code
    if param is not None:
        assert err["param"] == param
    return err


def make_app(**config: Any) -> tuple[Any, Any, Any]:
    rt_kw = {k: config.pop(k) for k in list(config) if k in ("num_slots", "ctx_len", "max_queue")}
    runtime, pool = make_runtime(**rt_kw)
    return create_app(runtime, serve_config(**config)), runtime, pool


@pytest.mark.parametrize(
    "body, param",
    [
        (b"{not json", None),
        (b"", None),
        (b"[1, 2]", None),
        (b'{"model": "fake-model"}', None),  # messages missing
        (b'{"messages": []}', "messages"),
        (b'{"messages": [{"role": 7, "content": "x"}]}', "messages[0].role"),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}', "temperature"),
        (b'{"messages": [{"role": "user", "content": "x"}], "temperature": 9}', "temperature"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}', "max_tokens"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 100000}',
            "max_completion_tokens",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream"),
        (b'{"messages": [{"role": "user", "content": "x"}], "n": 99}', "n"),  # more than the slots
        (b'{"messages": [{"role": "user", "content": "x"}], "n": 0}', "n"),
        (b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}', "top_logprobs"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}',
            "top_logprobs",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}}', "logit_bias"),
        (b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"99999": 1}}', "logit_bias"),
        (b'{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 101}}', "logit_bias"),
        (b'{"messages": [{"role": "user", "content": "x"}], "functions": [{"name": "f"}]}', "functions"),
        (b'{"messages": [{"role": "user", "content": "x"}], "function_call": "auto"}', "function_call"),
        (b'{"messages": [{"role": "user", "content": "x"}], "store": true}', "store"),
        (b'{"messages": [{"role": "user", "content": "x"}], "audio": {"voice": "x"}}', "audio"),
        (b'{"messages": [{"role": "user", "content": "x"}], "modalities": ["text", "audio"]}', "modalities"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "prediction": {"type": "content"}}',
            "prediction",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "high"}', "reasoning_effort"),
        (b'{"messages": [{"role": "user", "content": "x"}], "service_tier": "flex"}', "service_tier"),
        (b'{"messages": [{"role": "user", "content": "x"}], "web_search_options": {}}', "web_search_options"),
        (b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}', "tool_choice"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": '
            b'{"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}',
            "tool_choice",
        ),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}',
            "response_format",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}], "stop": [""]}', "stop"),
        (b'{"messages": [{"role": "wizard", "content": "x"}]}', "messages[0].role"),
        (b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "messages[0].content[0]"),
        (b'{"messages": [{"role": "user", "content": [{"type": "text"}]}]}', "messages[0].content[0].text"),
        (
            b'{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}',
            "response_format",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}], "stop_token_ids": [99999]}', "stop_token_ids"),
    ],
)
async def test_bad_chat_bodies_are_400(body: bytes, param: str | None) -> None:
    app, _, _ = make_app()
    async with running_app(app) as client:
        r = await client.post("/v1/chat/completions", content=body, headers=JSON)
    err = assert_error(r, 400)
    assert err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": [1, 99999]}, "prompt"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "best_of": 3}, "best_of"),
        ({"prompt": 5}, "prompt"),
    ],
)
async def test_bad_completion_bodies_are_400(body: dict[str, Any], param: str) -> None:
    app, _, _ = make_app()
    async with running_app(app) as client:
        r = await client.post("/v1/completions", json=body)
    assert_error(r, 400, param=param)


async def test_unknown_fields_are_ignored() -> None:
    app, _, _ = make_app()
    body = chat_body([USER], max_tokens=2, frobnicate={"a": 1}, parallel_tool_calls=True, metadata=None)
    async with running_app(app) as client:
        r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text


async def test_prompt_longer_than_the_context_is_400() -> None:
    app, _, _ = make_app(ctx_len=64)
    async with running_app(app) as client:
        chat = await client.post(
            "/v1/chat/completions", json=chat_body([{"role": "user", "content": "x" * 200}])
        )
        comp = await client.post("/v1/completions", json={"prompt": "y" * 200})
    assert_error(chat, 400, code="context_length_exceeded", param="messages")
    assert_error(comp, 400, code="context_length_exceeded", param="prompt")


async def test_unknown_model_is_404() -> None:
    app, _, _ = make_app()
    async with running_app(app) as client:
        r = await client.post("/v1/chat/completions", json={**chat_body([USER]), "model": "gpt-9"})
        t = await client.post("/tokenize", json={"model": "gpt-9", "content": "x"})
    err = assert_error(r, 404, code="model_not_found", param="model")
    assert MODEL in err["message"]
    assert_error(t, 404, code="model_not_found")


async def test_api_key_is_required_when_set() -> None:
    app, _, _ = make_app(api_key="s3cret")
    body = chat_body([USER], max_tokens=2)
    async with running_app(app) as client:
        missing = await client.post("/v1/chat/completions", json=body)
        wrong = await client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": "Bearer s3cre"}
        )
        basic = await client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": "Basic s3cret"}
        )
        models = await client.get("/v1/models")
        wrong_x = await client.post("/v1/chat/completions", json=body, headers={"x-api-key": "s3cre"})
        # a Bearer header decides even when x-api-key is also sent
        both = await client.post(
            "/v1/chat/completions", json=body, headers={"Authorization": "Bearer no", "x-api-key": "s3cret"}
        )
        ok = await client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer s3cret"})
        ok_x = await client.post("/v1/chat/completions", json=body, headers={"x-api-key": "s3cret"})
        health = await client.get("/health")
        metrics = await client.get("/metrics")
    for r in (missing, wrong, basic, models, wrong_x, both):
        err = assert_error(r, 401, code="invalid_api_key")
        assert err["type"] == "authentication_error"
    assert missing.headers["www-authenticate"] == "Bearer"
    assert ok.status_code == 200 and ok_x.status_code == 200
    assert health.status_code == 200 and metrics.status_code == 200  # probes stay open


async def test_body_past_the_limit_is_413() -> None:
    app, _, _ = make_app(max_body_bytes=2048)
    big = chat_body([{"role": "user", "content": "z" * 4000}])

    async def chunked() -> Any:  # no content-length: the limit is enforced while reading
        data = httpx.Request("POST", "http://t", json=big).read()
        for i in range(0, len(data), 500):
            yield data[i : i + 500]

    async with running_app(app) as client:
        declared = await client.post("/v1/chat/completions", json=big)
        streamed = await client.post("/v1/chat/completions", content=chunked(), headers=JSON)
    assert_error(declared, 413, code="request_too_large")
    assert_error(streamed, 413, code="request_too_large")


async def test_deeply_nested_body_is_400_not_500() -> None:
    # 20 kB of brackets in a free-form field: msgspec raises RecursionError, not DecodeError
    depth = 10_000
    nested = b"[" * depth + b"]" * depth
    chat = b'{"messages": [{"role": "user", "content": "x"}], "tool_choice": ' + nested + b"}"
    comp = b'{"prompt": "x", "prediction": ' + nested + b"}"
    app, _, _ = make_app()
    async with running_app(app) as client:
        r_chat = await client.post("/v1/chat/completions", content=chat, headers=JSON)
        r_comp = await client.post("/v1/completions", content=comp, headers=JSON)
    assert_error(r_chat, 400, code="invalid_json")
    assert_error(r_comp, 400, code="invalid_json")


async def test_unknown_route_and_wrong_method_use_the_error_shape() -> None:
    app, _, _ = make_app()
    async with running_app(app) as client:
        nf = await client.get("/v1/nothing")
        na = await client.get("/v1/chat/completions")
    assert_error(nf, 404, code="not_found")
    assert_error(na, 405, code="method_not_allowed")


class Gate:
    """Holds the fake engine inside forward() until opened, so a slot stays busy."""

    def __init__(self, pool: Any):
        self.entered = threading.Event()
        self.release = threading.Event()
        pool.forward_hook = self._hook

    def _hook(self, batch: Any) -> None:
        self.entered.set()
        self.release.wait(timeout=30)


async def test_full_queue_is_429_with_retry_after() -> None:
    app, runtime, pool = make_app(num_slots=1, max_queue=1)
    gate = Gate(pool)
    body = chat_body([USER], max_tokens=4)
    async with running_app(app) as client:
        running = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await wait_until(gate.entered.is_set)  # request 1 holds the only slot
        queued = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await wait_until(lambda: runtime.scheduler.stats().queue_depth == 1)  # request 2 waits
        rejected = await client.post("/v1/chat/completions", json=body)
        gate.release.set()
        first, second = await running, await queued
    err = assert_error(rejected, 429, code="queue_full")
    assert err["type"] == "rate_limit_error"
    assert int(rejected.headers["retry-after"]) >= 1
    assert first.status_code == 200 and second.status_code == 200


async def test_draining_server_answers_503() -> None:
    app, runtime, _ = make_app()
    async with running_app(app) as client:
        await runtime.scheduler.drain(1.0)
        r = await client.post("/v1/chat/completions", json=chat_body([USER]))
        ready = await client.get("/ready")
    assert_error(r, 503, code="draining")
    assert_error(ready, 503, code="draining")
