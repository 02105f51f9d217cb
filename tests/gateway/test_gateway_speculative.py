"""Speculative decoding through the OpenAI routes: usage reports the draft tokens
(completion_tokens_details), a request opts out with "speculative": false, output unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from gateway_support import MODEL, make_runtime, running_app, serve_config
from slotserve.gateway.app import create_app


async def _post(runtime: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with running_app(create_app(runtime, serve_config(max_tokens_limit=256))) as client:
        r = await client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def test_usage_reports_draft_tokens_and_opt_out_turns_them_off() -> None:
    text = "def f(x):\n    return x + 1\n" * 6
    chat = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 120,
        "temperature": 0,
    }
    comp = {"model": MODEL, "prompt": text, "max_tokens": 120, "temperature": 0}
    got = {}
    for name, spec in (("plain", None), ("spec", 6)):
        kw = {"draft_max": spec, "spec_cost_gate": False} if spec else {}
        for opt_out in (False, True):
            runtime, _ = make_runtime(pool_options={"copy_bias": 12.0}, ctx_len=1024, **kw)
            c = await _post(
                runtime, "/v1/chat/completions", {**chat, **({"speculative": False} if opt_out else {})}
            )
            runtime, _ = make_runtime(pool_options={"copy_bias": 12.0}, ctx_len=1024, **kw)
            t = await _post(
                runtime, "/v1/completions", {**comp, **({"speculative": False} if opt_out else {})}
            )
            got[name, opt_out] = (c, t)
    for i in range(2):
        plain = got["plain", False][i]
        assert "completion_tokens_details" not in plain["usage"]
        assert "completion_tokens_details" not in got["spec", True][i]["usage"]  # opted out
        spec = got["spec", False][i]
        details = spec["usage"]["completion_tokens_details"]
        assert details["accepted_prediction_tokens"] > 0 and details["rejected_prediction_tokens"] >= 0
        text_of = (
            (lambda r: r["choices"][0]["message"]["content"])
            if i == 0
            else (lambda r: r["choices"][0]["text"])
        )
        assert text_of(spec) == text_of(plain) == text_of(got["spec", True][i])
        assert spec["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"]


async def test_n_choices_with_speculation_equal_plain() -> None:
    """n = 3 sampled choices (seeded) fork one prefill by copy, then each drafts on its own
    slot: the choices equal those of a server without speculation."""
    text = "x = [1, 2, 3]\nfor v in x:\n    print(v * 2)\n" * 5
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 80,
        "temperature": 0.7,
        "seed": 11,
        "n": 3,
    }
    got = []
    for kw in ({}, {"draft_max": 6, "spec_cost_gate": False}):
        runtime, _ = make_runtime(num_slots=3, pool_options={"copy_bias": 12.0}, ctx_len=1024, **kw)
        got.append(await _post(runtime, "/v1/chat/completions", body))
    plain, spec = got
    assert [c["message"]["content"] for c in plain["choices"]] == [
        c["message"]["content"] for c in spec["choices"]
    ]
    assert len({c["message"]["content"] for c in spec["choices"]}) > 1  # the choices differ
    assert spec["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0


AGENT_ROUTES = {
    "/v1/messages": (
        lambda text, extra: {
            "model": MODEL,
            "max_tokens": 120,
            "temperature": 0,
            "messages": [{"role": "user", "content": text}],
            **extra,
        },
        lambda r: "".join(b["text"] for b in r["content"] if b["type"] == "text"),
        lambda r: r["usage"]["output_tokens"],
    ),
    "/v1/responses": (
        lambda text, extra: {
            "model": MODEL,
            "max_output_tokens": 120,
            "temperature": 0,
            "input": text,
            **extra,
        },
        lambda r: "".join(c["text"] for item in r["output"] for c in item.get("content", [])),
        lambda r: r["usage"]["output_tokens"],
    ),
}


@pytest.mark.parametrize("path", sorted(AGENT_ROUTES))
async def test_agent_routes_draft_and_opt_out(path: str) -> None:
    """Messages and Responses draft as the chat route does (the `slotserve` block counts the
    draft tokens: these APIs' usage has no field for them) and `"speculative": false` opts a
    request out; the text is the plain server's either way."""
    text = "def f(x):\n    return x + 1\n" * 6
    body, text_of, tokens_of = AGENT_ROUTES[path]
    got = {}
    for name, kw in (("plain", {}), ("spec", {"draft_max": 6, "spec_cost_gate": False})):
        for opt_out in (False, True):
            runtime, _ = make_runtime(pool_options={"copy_bias": 12.0}, ctx_len=1024, **kw)
            extra = {"speculative": False} if opt_out else {}
            got[name, opt_out] = await _post(runtime, path, body(text, extra))
    spec = got["spec", False]["slotserve"]
    assert spec["drafted_tokens"] > 0 and 0 < spec["accepted_tokens"] <= spec["drafted_tokens"]
    for key in (("plain", False), ("plain", True), ("spec", True)):
        info = got[key]["slotserve"]
        assert (info["drafted_tokens"], info["accepted_tokens"]) == (0, 0), key
    texts = {key: text_of(r) for key, r in got.items()}
    assert len(set(texts.values())) == 1 and texts["plain", False]
    assert len({tokens_of(r) for r in got.values()}) == 1
