"""Requests without max_tokens (issue 22): chat completions and the Responses API generate until
the end of the turn or of the slot's context, bounded by --max-tokens-limit (as OpenAI, vLLM and
llama.cpp do); `--default-max-tokens N` makes N the default instead; /v1/completions keeps
OpenAI's 16; Anthropic's Messages API still requires max_tokens, as Anthropic's does."""

from __future__ import annotations

from typing import Any

import pytest
from gateway_support import (
    IM_END,
    MODEL,
    Reply,
    chat_body,
    make_runtime,
    running_app,
    scripted_runtime,
    serve_config,
)
from slotserve.gateway.app import create_app

CTX = 192  # small: a run to the end of the context is a short test
USER = [{"role": "user", "content": "Write me a long story."}]
NO_EOS = {str(IM_END): -100}  # the fake engine's greedy text never ends the turn by itself


def limits(**overrides: Any) -> dict[str, Any]:
    return {"max_tokens_limit": 4096, "default_max_tokens": None, **overrides}


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": USER}),
        ("/v1/responses", {"model": MODEL, "input": "Write me a long story."}),
    ],
)
async def test_no_max_tokens_asks_for_the_limit(route: str, body: dict[str, Any]) -> None:
    runtime, sched = scripted_runtime(Reply(("once",)))
    app = create_app(runtime, serve_config(**limits(max_tokens_limit=3000)))
    async with running_app(app) as client:
        r = await client.post(route, json=body)
    assert r.status_code == 200, r.text
    (gen,) = sched.submitted
    assert gen.params.max_tokens == 3000  # not a fixed 512: the limit bounds a run to the turn's end


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": USER}),
        ("/v1/responses", {"model": MODEL, "input": "Write me a long story."}),
    ],
)
async def test_default_max_tokens_flag_still_sets_the_default(route: str, body: dict[str, Any]) -> None:
    runtime, sched = scripted_runtime(Reply(("once",)))
    app = create_app(runtime, serve_config(**limits(default_max_tokens=77)))
    async with running_app(app) as client:
        assert (await client.post(route, json=body)).status_code == 200
    assert sched.submitted[0].params.max_tokens == 77


async def test_chat_without_max_tokens_runs_to_the_end_of_the_context() -> None:
    runtime, _ = make_runtime(num_slots=1, ctx_len=CTX)
    app = create_app(runtime, serve_config(**limits()))
    async with running_app(app) as client:
        r = await client.post("/v1/chat/completions", json=chat_body(USER, logit_bias=NO_EOS))
        capped = await client.post(
            "/v1/chat/completions", json=chat_body(USER, logit_bias=NO_EOS, max_tokens=20)
        )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["finish_reason"] == "length"
    usage = out["usage"]
    # every row of the slot: the prompt, then generated tokens until the context is full (the
    # last token is sampled from the last row's logits and never needs a row of its own)
    assert usage["prompt_tokens"] + usage["completion_tokens"] == CTX + 1
    assert usage["completion_tokens"] > 100
    assert capped.json()["usage"]["completion_tokens"] == 20


async def test_chat_without_max_tokens_stops_at_the_end_of_the_turn() -> None:
    # eos made certain: the reply ends by itself long before the limit and the context
    runtime, _ = make_runtime(num_slots=1, ctx_len=CTX)
    app = create_app(runtime, serve_config(**limits()))
    async with running_app(app) as client:
        r = await client.post("/v1/chat/completions", json=chat_body(USER, logit_bias={str(IM_END): 100}))
    out = r.json()
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] == 1


async def test_responses_without_max_output_tokens_runs_to_the_end_of_the_context() -> None:
    runtime, _ = make_runtime(num_slots=1, ctx_len=CTX)
    app = create_app(runtime, serve_config(**limits()))
    async with running_app(app) as client:
        r = await client.post("/v1/responses", json={"model": MODEL, "input": "Hi", "temperature": 0})
    assert r.status_code == 200, r.text
    out = r.json()
    usage = out["usage"]
    if out["status"] == "incomplete":  # no end of turn: ran until the slot was full
        assert out["incomplete_details"]["reason"] == "max_output_tokens"
        assert usage["input_tokens"] + usage["output_tokens"] == CTX + 1
    else:  # the fake model's greedy text ended its turn: well before any fixed default
        assert out["status"] == "completed"
        assert usage["input_tokens"] + usage["output_tokens"] < CTX


async def test_anthropic_messages_still_require_max_tokens() -> None:
    runtime, sched = scripted_runtime(Reply(("x",)))
    app = create_app(runtime, serve_config(**limits()))
    async with running_app(app) as client:
        r = await client.post("/v1/messages", json={"model": MODEL, "messages": USER})
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and "max_tokens" in r.json()["error"]["message"]
    assert sched.submitted == []


async def test_legacy_completions_keep_openais_default_of_16() -> None:
    runtime, sched = scripted_runtime(Reply(("x",)))
    app = create_app(runtime, serve_config(**limits()))
    async with running_app(app) as client:
        r = await client.post("/v1/completions", json={"model": MODEL, "prompt": "Once upon"})
    assert r.status_code == 200, r.text
    assert sched.submitted[0].params.max_tokens == 16
