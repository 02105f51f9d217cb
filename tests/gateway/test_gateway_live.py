"""The official `openai` client against a live uvicorn server on 127.0.0.1 and a free port.

Three back ends: the FakeSlotPool runtime (fast, always), the tiny GGUF fixture model through the
real engine and `load_runtime`, and the real SmolLM2 model (marker real_model). Each checks chat
(streamed and not), completions, `cached_tokens` on a second turn equal to the reused count, and
identical greedy text warm and cold. Also: SIGTERM-style drain on a live server, and the
`slotserve serve` process exiting 0 on SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_support import LiveServer, free_port, make_runtime, serve_config
from process_support import wait_http_ready
from slotserve.gateway.app import create_app
from slotserve.gateway.config import ServeConfig
from slotserve.metrics import ServerMetrics

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
TURN1 = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]


def client_for(server: LiveServer, api_key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=120)


def exercise(client: openai.OpenAI, model: str, *, max_tokens: int) -> dict[str, Any]:
    """Chat (plain and streamed), a second turn, and a completion; returns what it saw."""
    first = client.chat.completions.create(model=model, messages=TURN1, max_tokens=max_tokens, temperature=0)
    answer = first.choices[0].message.content or ""
    assert first.usage is not None and first.usage.prompt_tokens > 0
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # cold

    stream = client.chat.completions.create(
        model=model,
        messages=TURN1,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    deltas, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            deltas.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(deltas) == answer  # streamed == non-streamed for the same greedy request
    assert usage is not None and usage.completion_tokens == first.usage.completion_tokens
    assert finish == first.choices[0].finish_reason

    turn2 = TURN1 + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And of Italy?"}]
    warm = client.chat.completions.create(model=model, messages=turn2, max_tokens=max_tokens, temperature=0)
    raw = warm.model_dump()
    cached = warm.usage.prompt_tokens_details.cached_tokens
    assert cached > 0
    assert cached == raw["slotserve"]["reused_tokens"]
    assert raw["slotserve"]["prefilled_tokens"] == warm.usage.prompt_tokens - cached

    comp = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=max_tokens, temperature=0
    )
    assert comp.usage.completion_tokens >= 1
    return {"turn2": turn2, "warm_text": warm.choices[0].message.content, "cached": cached}


def check_cold_matches(
    server: LiveServer, model: str, turn2: list[dict[str, str]], warm_text: str, max_tokens: int
) -> None:
    client = client_for(server)
    cold = client.chat.completions.create(model=model, messages=turn2, max_tokens=max_tokens, temperature=0)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert cold.choices[0].message.content == warm_text


# ------------------------------------------------------------------ fake engine


@pytest.fixture()
def fake_live() -> Iterator[tuple[LiveServer, Any]]:
    metrics = ServerMetrics()
    runtime, pool = make_runtime(num_slots=2, metrics=metrics)
    config = serve_config(port=free_port(), log_level="warning", api_key="k-123", drain_grace_s=10)
    with LiveServer(create_app(runtime, config, metrics=metrics), runtime, config) as server:
        yield server, runtime


def test_openai_client_against_the_fake_engine(fake_live: tuple[LiveServer, Any]) -> None:
    server, _ = fake_live
    seen = exercise(client_for(server, "k-123"), "fake-model", max_tokens=12)
    with pytest.raises(openai.AuthenticationError):
        client_for(server, "wrong").models.list()
    with pytest.raises(openai.NotFoundError) as exc:
        client_for(server, "k-123").chat.completions.create(model="nope", messages=TURN1)
    assert exc.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client_for(server, "k-123").chat.completions.create(model="fake-model", messages=TURN1, temperature=5)
    runtime, _ = make_runtime(num_slots=1, reuse=False)
    config = serve_config(port=free_port(), log_level="warning")
    with LiveServer(create_app(runtime, config), runtime, config) as cold_server:
        check_cold_matches(cold_server, "fake-model", seen["turn2"], seen["warm_text"], 12)


def slow_engine(pool: Any, step_s: float) -> None:
    """Make every forward of the fake engine take `step_s` (a stream stays in flight)."""
    pool.forward_hook = lambda batch: time.sleep(step_s)


def stream_in_thread(
    server: LiveServer, body: dict[str, Any]
) -> tuple[threading.Thread, dict[str, Any], threading.Event]:
    """POST a streaming chat in a thread; returns (thread, result dict with "lines", first-line event)."""
    got: dict[str, Any] = {}
    started = threading.Event()

    def run() -> None:
        with httpx.stream(
            "POST",
            server.url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": "Bearer k-123"},
            timeout=30,
        ) as r:
            lines = []
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    started.set()
            got["lines"] = lines

    t = threading.Thread(target=run)
    t.start()
    return t, got, started


def wait_draining(runtime: Any) -> None:
    deadline = time.monotonic() + 10
    while not runtime.scheduler.stats().draining:
        assert time.monotonic() < deadline, "the drain did not start"
        time.sleep(0.01)


def test_drain_finishes_running_requests_and_refuses_new_ones(fake_live: tuple[LiveServer, Any]) -> None:
    """SIGTERM's drain: /ready and new requests get 503 while the running stream goes on to
    [DONE]; then the server stops by itself."""
    server, runtime = fake_live
    slow_engine(runtime.extra["pool"], 0.03)
    body = {
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 60,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    t, got, started = stream_in_thread(server, body)
    assert started.wait(10)
    server.server.request_drain()
    wait_draining(runtime)
    ready = httpx.get(server.url + "/ready", timeout=10)
    refused = httpx.post(
        server.url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer k-123"}, timeout=10
    )
    assert t.is_alive(), "the stream must still be running while the drain refuses new work"
    t.join(30)
    server.thread.join(30)
    assert not server.thread.is_alive()  # stopped by itself once drained
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "draining"
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
    assert got["lines"][-1] == "data: [DONE]"
    finish = json.loads(got["lines"][-2][len("data: ") :])
    assert finish["choices"][0]["finish_reason"] == "length"  # it ran to max_tokens


def test_drain_past_the_grace_period_cancels(fake_live: tuple[LiveServer, Any]) -> None:
    server, runtime = fake_live
    server.server.grace_s = 0.2
    slow_engine(runtime.extra["pool"], 0.03)
    body = {
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 64,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    t, got, started = stream_in_thread(server, body)
    assert started.wait(10)
    server.server.request_drain()
    t.join(30)
    server.thread.join(30)
    assert not server.thread.is_alive()
    assert got["lines"][-1] == "data: [DONE]"
    error = json.loads(got["lines"][-2][len("data: ") :])
    assert error["error"]["code"] == "cancelled"
    held = [v for v in runtime.scheduler.slots() if v.request_id is not None]
    assert held == []


# ------------------------------------------------------------------ real engine


def live_model_server(model_path: Path, **overrides: Any) -> LiveServer:
    from slotserve.gateway.runtime import load_runtime

    config = ServeConfig(
        model=str(model_path),
        port=free_port(),
        log_level="warning",
        batched_session=2,
        ctx_size=512,
        max_tokens_limit=64,
        default_max_tokens=16,
        **overrides,
    )
    metrics = ServerMetrics()
    runtime = load_runtime(config, stats_sink=metrics.sink)
    return LiveServer(create_app(runtime, config, metrics=metrics), runtime, config)


def run_model_checks(model_path: Path, max_tokens: int) -> None:
    with live_model_server(model_path) as server:
        model = client_for(server).models.list().data[0].id
        seen = exercise(client_for(server), model, max_tokens=max_tokens)
    with live_model_server(model_path, no_reuse=True) as cold:
        check_cold_matches(cold, model, seen["turn2"], seen["warm_text"], max_tokens)


def test_openai_client_against_the_tiny_model(tiny_model_path: Path) -> None:
    run_model_checks(tiny_model_path, max_tokens=16)


def test_openai_client_against_a_tiny_gemma3_without_a_template(arch_model_factory: Any) -> None:
    # No tokenizer.chat_template: the built-in Gemma turns (engine_ext/chat_builtin.py), whose
    # turn tokens are single control tokens of this vocabulary; second-turn reuse, warm == cold.
    path = arch_model_factory("gemma3", chat_template=None, extra_tokens=("<start_of_turn>", "<end_of_turn>"))
    run_model_checks(path, max_tokens=16)
    with live_model_server(path) as server:
        client = client_for(server)
        model = client.models.list().data[0].id
        rendered = httpx.post(
            server.url + "/v1/chat/completions/render", json={"model": model, "messages": TURN1}, timeout=60
        ).json()
        start, end = 299, 300  # the two extra tokens, after the tiny vocabulary's 299
        assert rendered["prompt"] == (
            "<|im_start|><start_of_turn>user\nYou are a helpful assistant.\n\nWhat is the capital of France?"
            "<end_of_turn>\n<start_of_turn>model\n"
        )
        ids = rendered["prompt_token_ids"]
        assert ids[:2] == [1, start] and ids.count(start) == 2 and ids.count(end) == 1
        assert ids.index(end) < len(ids) - 1 - ids[::-1].index(
            start
        )  # the user turn ends, then the model's opens
        # <end_of_turn> ends a reply (the model emits it first when biased to)
        forced = client.chat.completions.create(
            model=model, messages=TURN1, max_tokens=16, temperature=0, logit_bias={str(end): 100}
        )
        assert (forced.choices[0].finish_reason, forced.choices[0].message.content) == ("stop", "")


@pytest.mark.real_model
def test_openai_client_against_the_real_model(real_model_path: Path) -> None:
    run_model_checks(real_model_path, max_tokens=12)


def test_serve_process_exits_0_on_sigterm(tiny_model_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "SLOTSERVE_PORT": str(port), "SLOTSERVE_LOG_LEVEL": "warning"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slotserve",
            "serve",
            "--model",
            str(tiny_model_path),
            "--parallel",
            "2",
            "--ctx-size",
            "256",
            "--drain-grace-s",
            "5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        summary = proc.stdout.readline()
        wait_http_ready(proc, f"http://127.0.0.1:{port}/ready", what="slotserve serve")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    for part in ("2 slots", "256 tokens", "KV", "kernels", "chat template gguf", f"http://127.0.0.1:{port}"):
        assert part in summary, summary
