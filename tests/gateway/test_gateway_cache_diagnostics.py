"""Cache-miss diagnostics: Anthropic's `diagnostics` through the official SDK, and the divergence
report of every route (`slotserve.divergence`, the counter, GET /slots).

Each `cache_miss_reason` type is produced by the change that causes it, on a conversation the
previous turn answered; the divergence tests edit one rendered part and check the part, offset
and reason reported, and the reuse that went with it.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2
import pytest
from gateway_support import MODEL, chat_body, make_runtime, running_app, serve_config
from slotserve.gateway.app import create_app
from slotserve.gateway.cache_diagnostics import (
    BLOCK_TOKENS,
    Fingerprint,
    FingerprintStore,
    MissType,
    diagnose,
    fingerprint,
)
from slotserve.metrics import ServerMetrics

SYSTEM = "You are a careful assistant. " * 12
TOOLS = [{"name": "get_weather", "description": "weather", "input_schema": {"type": "object"}}]


def _fp(**over: Any) -> Fingerprint:
    parts: dict[str, Any] = dict(
        model="m", system="s", tools=None, messages=["a", "b"], other=None, prompt_ids=list(range(100))
    )
    parts.update(over)
    return fingerprint(**parts)


def test_diagnose_names_the_first_part_that_changed_in_anthropics_order() -> None:
    prev = _fp()
    assert diagnose(prev, _fp(messages=["a", "b", "c"], prompt_ids=list(range(130)))) is None
    assert (
        diagnose(None, prev) is not None and diagnose(None, prev).type is MissType.PREVIOUS_MESSAGE_NOT_FOUND
    )  # type: ignore[union-attr]
    cases = {
        MissType.MODEL_CHANGED: _fp(model="n", system="x"),
        MissType.SYSTEM_CHANGED: _fp(system="x", tools=[1]),
        MissType.TOOLS_CHANGED: _fp(tools=[1], messages=["z"]),
        MissType.MESSAGES_CHANGED: _fp(messages=["z", "b"], other=1),
        MissType.UNAVAILABLE: _fp(other=1),
    }
    for kind, cur in cases.items():
        got = diagnose(prev, cur)
        assert got is not None and got.type is kind
    fewer = diagnose(prev, _fp(messages=["a"]))
    assert fewer is not None and fewer.type is MissType.MESSAGES_CHANGED


def test_missed_tokens_count_whole_shared_blocks_and_the_previous_answer() -> None:
    prev = _fp(prompt_ids=list(range(100)))
    from dataclasses import replace

    prev = replace(prev, output_tokens=7)
    cur = _fp(system="x", prompt_ids=[*range(40), 999, *range(41, 120)])  # differs at token 40
    got = diagnose(prev, cur)
    assert got is not None and got.type is MissType.SYSTEM_CHANGED
    assert got.cache_missed_input_tokens == 100 + 7 - BLOCK_TOKENS  # one whole block shared
    assert got.to_json() == {"type": "system_changed", "cache_missed_input_tokens": 100 + 7 - BLOCK_TOKENS}


def test_fingerprint_store_is_bounded_lru() -> None:
    store = FingerprintStore(max_entries=2)
    a, b, c = _fp(), _fp(model="b"), _fp(model="c")
    store.put("a", a)
    store.put("b", b)
    assert store.get("a") is a  # a is now the most recent
    store.put("c", c)
    assert store.get("b") is None and store.get("a") is a and store.get("c") is c
    assert len(store) == 2
    with pytest.raises(ValueError):
        FingerprintStore(0)


def _client(app: Any) -> anthropic.AsyncAnthropic:
    """The official SDK, its requests sent straight into the app (its own httpx2 transport)."""
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test")
    return anthropic.AsyncAnthropic(base_url="http://test", api_key="k", http_client=http, max_retries=0)


async def test_each_cache_miss_reason_from_the_official_sdk() -> None:
    runtime, _ = make_runtime(num_slots=2, ctx_len=1024)
    app = create_app(runtime, serve_config())
    async with running_app(app):
        client = _client(app)
        msgs: list[Any] = [{"role": "user", "content": "hello there, what is the weather?"}]
        first = await client.messages.create(
            model=MODEL,
            max_tokens=4,
            system=SYSTEM,
            tools=TOOLS,  # type: ignore[arg-type]
            messages=msgs,
            diagnostics={"previous_message_id": None},
        )
        assert first.diagnostics is not None and first.diagnostics.cache_miss_reason is None

        async def turn(prev_id: str, **changes: Any) -> Any:
            body: dict[str, Any] = dict(
                model=MODEL,
                max_tokens=4,
                system=SYSTEM,
                tools=TOOLS,
                messages=[*msgs, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}],
            )
            body.update(changes)
            return await client.messages.create(**body, diagnostics={"previous_message_id": prev_id})

        same = await turn(first.id)
        assert same.diagnostics is not None and same.diagnostics.cache_miss_reason is None
        assert same.usage.cache_read_input_tokens > 0  # the appended turn reused the first one

        expected = {
            "model_changed": dict(model="alias"),
            "system_changed": dict(system=SYSTEM + "Be brief."),
            "tools_changed": dict(tools=[*TOOLS, {"name": "t2", "input_schema": {"type": "object"}}]),
            "messages_changed": dict(
                messages=[{"role": "user", "content": "HELLO there"}, {"role": "user", "content": "x"}]
            ),
            "unavailable": dict(tool_choice={"type": "auto"}),
        }
        for kind, change in expected.items():
            got = await turn(first.id, **change)
            reason = got.diagnostics.cache_miss_reason
            assert reason is not None and reason.type == kind, (kind, reason)
            if kind != "unavailable":
                assert reason.cache_missed_input_tokens > 0  # type: ignore[union-attr]
        lost = await turn("msg_unknown")
        assert lost.diagnostics.cache_miss_reason.type == "previous_message_not_found"

        # streamed: message_start carries the diagnosis
        async with client.messages.stream(
            model=MODEL,
            max_tokens=4,
            system=SYSTEM + "!",
            tools=TOOLS,  # type: ignore[arg-type]
            messages=msgs,
            diagnostics={"previous_message_id": first.id},
        ) as stream:
            final = await stream.get_final_message()
        assert final.diagnostics is not None and final.diagnostics.cache_miss_reason.type == "system_changed"

        plain = await client.messages.create(model=MODEL, max_tokens=4, messages=msgs)
        assert plain.diagnostics is None  # not asked for: not in the answer


async def test_divergence_names_the_edited_message_and_counts_it() -> None:
    metrics = ServerMetrics()
    runtime, _ = make_runtime(num_slots=1, ctx_len=2048, metrics=metrics)
    history = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "first question about gardens " * 4},
        {"role": "assistant", "content": "first answer about roses " * 4},
        {"role": "user", "content": "second question"},
    ]
    async with running_app(create_app(runtime, serve_config(), metrics=metrics)) as http:
        r = await http.post("/v1/chat/completions", json=chat_body(history, max_tokens=2, temperature=0))
        first = r.json()["slotserve"]
        assert first["divergence"]["reason"] == "cold" and first["reused_tokens"] == 0

        edited = [
            *history[:2],
            {"role": "assistant", "content": "first answer about TULIPS " * 4},
            history[3],
        ]
        r = await http.post("/v1/chat/completions", json=chat_body(edited, max_tokens=2, temperature=0))
        info = r.json()["slotserve"]
        div = info["divergence"]
        assert div["reason"] == "prompt_changed"
        assert div["part"] == {"kind": "message", "index": 2, "role": "assistant"}
        assert div["text_after"].startswith("TULIPS") and div["text_before"].endswith("about ")
        assert info["reused_tokens"] == div["offset"] > 0  # reused exactly up to the edit

        # the same conversation again: all but the last token reused, nothing to report
        r = await http.post("/v1/chat/completions", json=chat_body(edited, max_tokens=2, temperature=0))
        assert "divergence" not in r.json()["slotserve"] or r.json()["slotserve"]["divergence"] is None

        slots = (await http.get("/slots")).json()["data"]
        assert slots[0]["last_divergence"]["reason"] == "none"
        text = (await http.get("/metrics")).text
        assert 'slotserve_prefix_divergence_total{part="message",reason="prompt_changed"} 1.0' in text
        assert 'slotserve_prefix_divergence_total{part="system",reason="cold"} 1.0' in text


async def test_divergence_in_the_system_prompt_and_after_an_eviction() -> None:
    runtime, _ = make_runtime(num_slots=1, ctx_len=2048, checkpoint_memory_mb=0)
    a = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "tell me about A " * 6}]
    b = [{"role": "system", "content": "Other rules. " * 10}, {"role": "user", "content": "B please"}]
    async with running_app(create_app(runtime, serve_config())) as http:
        await http.post("/v1/chat/completions", json=chat_body(a, max_tokens=2, temperature=0))
        r = await http.post("/v1/chat/completions", json=chat_body(b, max_tokens=2, temperature=0))
        div = r.json()["slotserve"]["divergence"]
        assert div["part"]["kind"] == "system" and div["part"]["index"] == 0
        # A again: its slot was overwritten by B and no checkpoint budget kept it
        r = await http.post("/v1/chat/completions", json=chat_body(a, max_tokens=2, temperature=0))
        div = r.json()["slotserve"]["divergence"]
        assert div["reason"] == "evicted"
        assert div["evicted_tokens"] > div["offset"]


def test_the_metrics_parts_are_the_gateways_parts() -> None:
    from slotserve.gateway.prompt_parts import PartKind
    from slotserve.metrics.definitions import DIVERGENCE_PARTS

    assert set(DIVERGENCE_PARTS) == {k.value for k in PartKind}


def _claude_code_body(nonce: str, turn: str) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 2,
        "system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.0.1; cch={nonce};"},
            {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [{"role": "user", "content": "summarise the repository layout " * 4 + turn}],
        "diagnostics": {"previous_message_id": None},
    }


@pytest.mark.parametrize("normalize", [False, True])
async def test_claude_code_nonce_breaks_reuse_unless_normalized(normalize: bool) -> None:
    runtime, _ = make_runtime(num_slots=1, ctx_len=2048)
    config = serve_config(normalize=("claude-code",) if normalize else ())
    async with running_app(create_app(runtime, config)) as http:
        first = await http.post("/v1/messages", json=_claude_code_body("a1b2", "first"))
        body = _claude_code_body("c3d4", "second")
        body["diagnostics"] = {"previous_message_id": first.json()["id"]}
        second = await http.post("/v1/messages", json=body)
    got = second.json()
    reused = got["usage"]["cache_read_input_tokens"]
    reason = got["diagnostics"]["cache_miss_reason"]
    if normalize:
        assert second.headers["x-slotserve-normalized"] == "claude-code:billing-header"
        assert reused > len(SYSTEM)  # the system prompt and the shared start of the message
        assert reason["type"] == "messages_changed"  # the system prompt no longer changes
    else:
        assert "x-slotserve-normalized" not in second.headers
        assert reused < 64  # diverged inside the first system block's nonce
        assert reason["type"] == "system_changed"


def test_session_keys_come_from_headers_then_body_fields_and_are_hashed() -> None:
    from types import SimpleNamespace

    from slotserve.gateway.endpoint import session_key
    from starlette.requests import Request

    def req(headers: dict[str, str]) -> Request:
        raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})

    body = SimpleNamespace(prompt_cache_key="conv-1", user="u", metadata=None)
    k_body = session_key(req({}), body)
    assert k_body is not None and "conv-1" not in k_body
    assert (
        session_key(req({}), SimpleNamespace(prompt_cache_key=None, user="conv-1", metadata=None)) == k_body
    )
    k_head = session_key(req({"X-Claude-Code-Session-Id": "s-9"}), body)
    assert k_head != k_body and k_head == session_key(req({"X-Session-Id": "s-9"}), None)
    meta = SimpleNamespace(metadata={"user_id": "conv-1"})
    assert session_key(req({}), meta) == k_body
    assert session_key(req({}), SimpleNamespace()) is None
