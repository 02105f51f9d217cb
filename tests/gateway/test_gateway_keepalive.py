"""Streams that survive a long prefill: while a streamed request waits or prefills, the server
writes a keep-alive every --stream-keepalive-s (an SSE comment on the OpenAI routes, a `ping`
event on /v1/messages, a comment on /v1/responses), and with `return_progress` the prompt's
prefill progress. A real uvicorn server on loopback, the fake engine slowed by a forward hook
(each prefill segment sleeps), and a client whose read timeout is shorter than the prefill.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from gateway_support import MODEL, free_port, live_server, make_runtime, serve_config
from slotserve.gateway.app import create_app

SEGMENT_SLEEP_S = 0.3  # per prefill segment (64 tokens): a 5-segment prompt takes ~1.5 s
READ_TIMEOUT_S = 0.8  # the client gives up after this long without a byte
KEEPALIVE_S = 0.25
LONG_TEXT = "slotserve keeps every conversation warm. " * 7  # ~290 tokens: 5 segments of 64


def slow_server(keepalive_s: float) -> Any:
    runtime, pool = make_runtime(num_slots=1, ctx_len=1024)

    def hook(batch: Any) -> None:
        if any(len(item.tokens) > 1 for item in batch):  # prefill segments only; decode stays fast
            time.sleep(SEGMENT_SLEEP_S)

    pool.forward_hook = hook
    config = serve_config(port=free_port(), log_level="warning", stream_keepalive_s=keepalive_s)
    return live_server(create_app(runtime, config), runtime, config)


ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": LONG_TEXT}], "max_tokens": 4},
    ),
    "messages": (
        "/v1/messages",
        {"messages": [{"role": "user", "content": LONG_TEXT}], "max_tokens": 4},
    ),
    "responses": ("/v1/responses", {"input": LONG_TEXT, "max_output_tokens": 4}),
}


def stream_lines(url: str, route: str, body: dict[str, Any]) -> tuple[list[str], float]:
    """The stream's lines, read with a client whose read timeout is READ_TIMEOUT_S, and the
    seconds until the first generated text arrived."""
    payload = {"model": MODEL, "temperature": 0, "stream": True, **body}
    timeout = httpx.Timeout(10.0, read=READ_TIMEOUT_S)
    lines, first_text_at = [], None
    start = time.monotonic()
    with httpx.Client(timeout=timeout) as client:
        with client.stream("POST", url + route, json=payload) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line:  # the blank line that ends each event
                    continue
                lines.append(line)
                if first_text_at is None and any(
                    k in line for k in ('"content":"', "text_delta", "output_text.delta")
                ):
                    if '"content":""' not in line:
                        first_text_at = time.monotonic() - start
    assert first_text_at is not None, lines
    return lines, first_text_at


@pytest.mark.parametrize("door", sorted(ROUTES))
def test_a_stream_outlives_a_prefill_longer_than_the_clients_read_timeout(door: str) -> None:
    route, body = ROUTES[door]
    with slow_server(KEEPALIVE_S) as server:
        lines, first_text_s = stream_lines(server.url, route, body)
    # the prefill really was longer than the client's patience: only keep-alives kept it
    assert first_text_s > 1.5 * READ_TIMEOUT_S
    if door == "messages":
        pings = [i for i, line in enumerate(lines) if line == "event: ping"]
        assert len(pings) >= 3, lines  # one at message_start, then keep-alives
        assert all(lines[i + 1] == 'data: {"type":"ping"}' for i in pings)
        assert lines[-2:] == ["event: message_stop", 'data: {"type":"message_stop"}']
    else:
        assert lines.count(": keep-alive") >= 2, lines
        if door == "chat":
            assert lines[-1] == "data: [DONE]"
        else:
            assert lines[-2] == "event: response.incomplete"  # max_output_tokens reached


def test_without_keepalives_the_same_client_times_out() -> None:
    route, body = ROUTES["chat"]
    with slow_server(0.0) as server:
        with pytest.raises(httpx.ReadTimeout):
            stream_lines(server.url, route, body)


def _progress(lines: list[str], door: str) -> list[dict[str, int]]:
    out = []
    for line in lines:
        if door == "responses" and line.startswith(": prompt_progress "):
            out.append(json.loads(line[len(": prompt_progress ") :]))
        elif line.startswith("data: {") and "prompt_progress" in line:
            out.append(json.loads(line[len("data: ") :])["prompt_progress"])
    return out


@pytest.mark.parametrize("door", sorted(ROUTES))
def test_return_progress_reports_the_prefill(door: str) -> None:
    route, body = ROUTES[door]
    with slow_server(KEEPALIVE_S) as server:  # progress replaces the keep-alives
        lines, _ = stream_lines(server.url, route, {**body, "return_progress": True})
    # (message_start's own ping, lines 2-3, is Anthropic's opening, not a keep-alive)
    assert ": keep-alive" not in lines and 'data: {"type":"ping"}' not in lines[4:]
    progress = _progress(lines, door)
    assert len(progress) >= 2, lines
    total = progress[-1]["total"]
    assert total > 256 and all(p["total"] == total for p in progress)
    processed = [p["processed"] for p in progress]
    assert processed == sorted(processed) and processed[-1] == total  # rising, then done
    assert any(0 < n < total for n in processed)  # seen part-way through the prefill
    assert all(p["cache"] == 0 for p in progress)  # a cold prompt
    if door == "chat":
        chunk = json.loads(next(line for line in lines if "prompt_progress" in line)[len("data: ") :])
        assert chunk["choices"] == [] and chunk["object"] == "chat.completion.chunk"
    # progress stops at the first token: none after it
    first_text = next(
        i
        for i, line in enumerate(lines)
        if "text_delta" in line
        or '"content":"' in line
        and '"content":""' not in line
        or "output_text.delta" in line
    )
    assert not _progress(lines[first_text:], door)


def test_the_official_clients_read_through_keepalives_and_progress() -> None:
    # the openai and anthropic SDKs skip SSE comments, no-choice chunks and pings: the text they
    # assemble is the text of the same greedy request on a server without any of it
    import anthropic
    import openai

    texts: dict[str, list[str]] = {}
    with slow_server(KEEPALIVE_S) as server:
        for progress in (True, False):
            timeout = openai.Timeout(10.0, read=READ_TIMEOUT_S)
            oa = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=timeout)
            stream = oa.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": LONG_TEXT}],
                max_tokens=6,
                temperature=0,
                stream=True,
                extra_body={"return_progress": progress},
            )
            chat = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            a_timeout = anthropic.Timeout(10.0, read=READ_TIMEOUT_S)
            an = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=a_timeout)
            with an.messages.stream(
                model=MODEL,
                max_tokens=6,
                messages=[{"role": "user", "content": LONG_TEXT}],
                extra_body={"return_progress": progress, "temperature": 0},
            ) as s:
                msg = "".join(s.text_stream)
            texts.setdefault("chat", []).append(chat)
            texts.setdefault("messages", []).append(msg)
    for door, (with_progress, plain) in texts.items():
        assert with_progress == plain and plain, (door, texts)
