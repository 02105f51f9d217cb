"""Router-facing routes: SGLang's worker metadata probes and the render endpoints.

The render tests spy on `Scheduler.submit` and compare the rendered ids with the ids the
generation route really handed the scheduler for the same body.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import pytest
from gateway_support import MODEL, ByteTokenizer, chat_body, make_runtime, running_app, serve_config
from slotserve.gateway import router_compat
from slotserve.gateway.app import create_app


def make_app(**config: Any):
    runtime, pool = make_runtime(num_slots=2, ctx_len=256)
    app = create_app(runtime, serve_config(**config))
    if not any(getattr(r, "path", None) == "/v1/chat/completions/render" for r in app.router.routes):
        app.router.routes.extend(router_compat.routes(app.state.gateway))  # until create_app wires it
    submitted: list[list[int]] = []
    original = runtime.scheduler.submit

    def spy(gen):
        submitted.append(list(gen.prompt_ids))
        return original(gen)

    runtime.scheduler.submit = spy
    return app, runtime, submitted


async def test_model_and_server_info_answer_sglang_probes():
    app, runtime, _ = make_app(api_key="sekrit")
    async with running_app(app) as client:
        for path in ("/model_info", "/get_model_info"):
            r = await client.get(path)  # no key: the router registers workers without one
            assert r.status_code == 200
            info = r.json()
            assert info["served_model_name"] == MODEL
            assert info["is_generation"] is True
            assert info["max_context_length"] == 256
            assert "model_path" not in info and "tokenizer_path" not in info
        for path in ("/server_info", "/get_server_info"):
            r = await client.get(path)
            assert r.status_code == 200
            info = r.json()
            assert (info["served_model_name"], info["dp_size"], info["max_running_requests"]) == (MODEL, 1, 2)
            assert info["max_total_num_tokens"] == 2 * 256
            assert info["version"] == metadata.version("slotserve")  # the installed package's
            assert info["internal_states"][0]["num_waiting_requests"] == 0


async def test_chat_render_equals_what_the_scheduler_receives():
    app, runtime, submitted = make_app()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo, 1+1?"}]
    async with running_app(app) as client:
        rendered = (await client.post("/v1/chat/completions/render", json=chat_body(messages))).json()
        assert submitted == []  # rendering submits nothing
        r = await client.post("/v1/chat/completions", json=chat_body(messages, max_tokens=4))
        assert r.status_code == 200
    assert submitted == [rendered["prompt_token_ids"]]
    assert (
        rendered["num_prompt_tokens"]
        == len(rendered["prompt_token_ids"])
        == r.json()["usage"]["prompt_tokens"]
    )
    assert rendered["prompt"].startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert rendered["prompt"].endswith("<|im_start|>assistant\n")
    assert rendered["prompt_token_ids"] == ByteTokenizer().encode(rendered["prompt"])
    assert (rendered["object"], rendered["model"], rendered["max_model_len"]) == ("render", MODEL, 256)


@pytest.mark.parametrize("prompt", ["Once upon a time", [72, 105, 33], ["one element"], [[1, 2, 3]]])
async def test_completion_render_equals_what_the_scheduler_receives(prompt):
    app, runtime, submitted = make_app()
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0}
    async with running_app(app) as client:
        rendered = (await client.post("/v1/completions/render", json=body)).json()
        assert (await client.post("/v1/completions", json=body)).status_code == 200
    assert submitted == [rendered["prompt_token_ids"]]
    assert len(submitted[0]) > 0


async def test_render_rejects_what_generation_rejects_and_needs_the_key():
    app, _, submitted = make_app(api_key="sekrit")
    auth = {"Authorization": "Bearer sekrit"}
    async with running_app(app) as client:
        r = await client.post(
            "/v1/chat/completions/render", json=chat_body([{"role": "user", "content": "x"}])
        )
        assert r.status_code == 401
        cases = [
            ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404),
            (
                "/v1/chat/completions",
                chat_body([{"role": "user", "content": "x"}], response_format={"type": "json_object"}),
                400,
            ),
            ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400),
            ("/v1/completions", {"model": MODEL, "prompt": [5, 999999]}, 400),
            ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400),
        ]
        for path, body, status in cases:
            gen = await client.post(path, json=body, headers=auth)
            ren = await client.post(path + "/render", json=body, headers=auth)
            assert gen.status_code == ren.status_code == status, (path, body, gen.text, ren.text)
            assert ren.json()["error"]["message"] == gen.json()["error"]["message"]
    assert submitted == []


async def test_chat_accepts_the_fields_the_sglang_router_adds():
    app, _, submitted = make_app()
    extra = {
        "logprobs": False,
        "no_stop_trim": False,
        "ignore_eos": False,
        "continue_final_message": False,
        "skip_special_tokens": True,
        "separate_reasoning": True,
        "stream_reasoning": True,
        "return_hidden_states": False,
    }  # exactly what sglang-router 0.3.2 forwards
    async with running_app(app) as client:
        r = await client.post(
            "/v1/chat/completions", json=chat_body([{"role": "user", "content": "hi"}], max_tokens=3, **extra)
        )
    assert r.status_code == 200, r.text
    assert len(submitted) == 1
