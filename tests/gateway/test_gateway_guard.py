"""HTTPGuard (gateway/http_guard.py), driven as ASGI: a client gone during its body is a quiet
cancel, a slow body is cut off with 408, and every request that ends in the gateway is counted
once in slotserve_requests_total{stage="gateway"} (the scheduler's own never twice)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from gateway_support import chat_body, make_runtime, running_app, serve_config
from slotserve.gateway.app import create_app
from slotserve.metrics import ServerMetrics

USER = {"role": "user", "content": "hello"}
JSON = {"content-type": "application/json"}


def count(m: ServerMetrics, outcome: str, stage: str) -> float:
    v = m.registry.get_sample_value("slotserve_requests_total", {"outcome": outcome, "stage": stage})
    assert v is not None, (outcome, stage)
    return v


def counts(m: ServerMetrics) -> dict[tuple[str, str], float]:
    out = {}
    for fam in m.registry.collect():
        if fam.name == "slotserve_requests":
            for s in fam.samples:
                if s.name == "slotserve_requests_total" and s.value:
                    out[(s.labels["outcome"], s.labels["stage"])] = s.value
    return out


def make(**config: Any) -> tuple[Any, Any, ServerMetrics]:
    metrics = ServerMetrics(strict=True)
    runtime, _ = make_runtime(num_slots=1, max_queue=config.pop("max_queue", 4), metrics=metrics)
    return create_app(runtime, serve_config(**config), metrics=metrics), runtime, metrics


def scope_for(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
        "state": {},
    }


async def call(app: Any, messages: list[dict[str, Any]], *, stall: bool = False) -> list[dict[str, Any]]:
    """Run one POST /v1/chat/completions whose receive() yields `messages`, then stalls forever
    (`stall`) or reports http.disconnect; returns what the app sent."""
    queue = list(messages)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if queue:
            return queue.pop(0)
        if stall:
            await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/json"), (b"content-length", b"100")]
    await asyncio.wait_for(app(scope_for("/v1/chat/completions", headers), receive, send), 10)
    return sent


async def test_a_client_gone_during_its_body_is_a_quiet_counted_cancel(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app, runtime, metrics = make()
    async with running_app(app) as client:
        with caplog.at_level(logging.DEBUG, logger="slotserve"):
            sent = await call(app, [{"type": "http.request", "body": b"{", "more_body": True}])
        errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert errors == []  # no "unhandled error" log
        assert sent[0]["status"] == 499  # uvicorn drops it: the client is gone
        assert counts(metrics) == {("cancelled", "gateway"): 1}
        # nothing else disturbed: no slot held, the next request is served
        assert all(v.request_id is None for v in runtime.scheduler.slots())
        r = await client.post("/v1/chat/completions", json=chat_body([USER], max_tokens=2))
        assert r.status_code == 200
    assert counts(metrics) == {("cancelled", "gateway"): 1, ("ok", "scheduler"): 1}


async def test_a_body_that_stalls_past_the_deadline_gets_408_and_a_close() -> None:
    app, runtime, metrics = make(body_timeout_s=0.2)
    async with running_app(app):
        loop = asyncio.get_running_loop()
        start = loop.time()
        sent = await call(app, [{"type": "http.request", "body": b'{"mess', "more_body": True}], stall=True)
        elapsed = loop.time() - start
    assert 0.15 < elapsed < 5
    start_msg = sent[0]
    assert start_msg["status"] == 408
    headers = dict(start_msg["headers"])
    assert headers[b"connection"] == b"close"
    assert b'"code":"request_timeout"' in b"".join(m.get("body", b"") for m in sent)
    assert counts(metrics) == {("timeout", "gateway"): 1}
    assert runtime.extra["pool"].num_forward_calls == 0


async def test_a_body_that_arrives_in_time_in_many_chunks_is_served() -> None:
    app, _, metrics = make(body_timeout_s=5)
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    chunks = [
        {"type": "http.request", "body": body[i : i + 7], "more_body": True} for i in range(0, len(body), 7)
    ]
    chunks.append({"type": "http.request", "body": b"", "more_body": False})
    async with running_app(app):
        sent = await call(app, chunks, stall=True)  # stays connected while it is answered
    assert sent[0]["status"] == 200
    assert counts(metrics) == {("ok", "scheduler"): 1}


async def test_every_refusal_before_the_scheduler_is_counted_once() -> None:
    app, runtime, metrics = make(api_key="k", max_body_bytes=2048)
    key = {"authorization": "Bearer k"}
    async with running_app(app) as client:
        assert (await client.get("/nope", headers=key)).status_code == 404
        assert (await client.put("/v1/chat/completions", headers=key)).status_code == 405
        assert (await client.post("/v1/chat/completions", json=chat_body([USER]))).status_code == 401
        big = chat_body([{"role": "user", "content": "z" * 4000}])
        assert (await client.post("/v1/chat/completions", json=big, headers=key)).status_code == 413
        r = await client.post(
            "/v1/chat/completions", content=b"{}", headers={**key, "content-type": "text/plain"}
        )
        assert r.status_code == 415
        r = await client.post("/v1/chat/completions", content=b"{no", headers={**key, **JSON})
        assert r.status_code == 400
        # successful answers the scheduler never sees are not requests of the API
        for path in ("/health", "/ready", "/metrics", "/v1/models"):
            assert (await client.get(path, headers=key)).status_code == 200
        assert counts(metrics) == {("rejected", "gateway"): 6}
        # the scheduler's own: counted once, by the scheduler (stage="scheduler")
        ok = await client.post("/v1/chat/completions", json=chat_body([USER], max_tokens=2), headers=key)
        too_long = await client.post(
            "/v1/chat/completions", json=chat_body([{"role": "user", "content": "y" * 1200}]), headers=key
        )
        assert ok.status_code == 200 and too_long.status_code == 400
        assert counts(metrics) == {
            ("rejected", "gateway"): 6,
            ("ok", "scheduler"): 1,
            ("rejected", "scheduler"): 1,
        }
        # refused while draining: the scheduler never counted it, so the gateway does; a /ready
        # 503 answers a probe and is not counted
        await runtime.scheduler.drain(0.0)
        drained = await client.post("/v1/chat/completions", json=chat_body([USER], max_tokens=2), headers=key)
        ready = await client.get("/ready")
        assert drained.status_code == 503 and ready.status_code == 503
    assert counts(metrics) == {
        ("rejected", "gateway"): 7,
        ("ok", "scheduler"): 1,
        ("rejected", "scheduler"): 1,
    }


@pytest.mark.parametrize(
    "status, outcome",
    [(499, "cancelled"), (408, "timeout"), (400, "rejected"), (404, "rejected"), (415, "rejected"),
     (503, "rejected"), (529, "rejected"), (500, "error"), (502, "error")],
)  # fmt: skip
def test_the_outcome_of_a_gateway_status(status: int, outcome: str) -> None:
    from slotserve.gateway.http_guard import gateway_outcome

    assert gateway_outcome(status).value == outcome
