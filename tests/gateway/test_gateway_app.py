"""The routes over the real Scheduler and FakeSlotPool, driven through httpx's ASGI transport.

Covers the happy paths (chat and completions, streamed and not), SSE framing, reuse accounting
in `usage.prompt_tokens_details.cached_tokens`, and the side endpoints.
"""

from __future__ import annotations

from typing import Any

from gateway_support import (
    MODEL,
    ByteTokenizer,
    chat_body,
    make_runtime,
    running_app,
    serve_config,
    sse_events,
)
from slotserve.gateway.app import create_app
from slotserve.metrics import ServerMetrics

SYSTEM = {"role": "system", "content": "You are a careful assistant. Answer briefly."}
USER1 = {"role": "user", "content": "Tell me about slots."}


def app_and_pool(**kw: Any) -> tuple[Any, Any, Any]:
    config_kw = {k: kw.pop(k) for k in list(kw) if k in ("api_key", "no_slots_endpoint", "max_body_bytes")}
    metrics = ServerMetrics()
    runtime, pool = make_runtime(metrics=metrics, **kw)
    return create_app(runtime, serve_config(**config_kw), metrics=metrics), runtime, pool


async def test_chat_non_streaming_shape_and_usage() -> None:
    app, runtime, _ = app_and_pool()
    async with running_app(app) as client:
        r = await client.post("/v1/chat/completions", json=chat_body([SYSTEM, USER1], max_tokens=12))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert r.headers["x-request-id"] == body["id"]
    assert body["model"] == MODEL
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    prompt_ids = runtime.encode_chat([SYSTEM, USER1])[0]
    assert usage["prompt_tokens"] == len(prompt_ids)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 1 <= usage["completion_tokens"] <= 12
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0  # cold start
    info = body["slotserve"]
    assert info["reuse_source"] == "none"
    assert info["reused_tokens"] == 0
    assert info["prefilled_tokens"] == len(prompt_ids)
    assert info["slot"] in (0, 1)


async def test_stream_deltas_concatenate_to_the_non_streamed_text() -> None:
    app, _, _ = app_and_pool()
    req = chat_body([USER1], max_tokens=24)
    async with running_app(app) as client:
        plain = (await client.post("/v1/chat/completions", json=req)).json()
        r = await client.post("/v1/chat/completions", json={**req, "stream": True})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"].get("content", "") for c in chunks[1:]]
    assert all(d for d in deltas[:-1])  # no empty content chunks (held-back bytes send nothing)
    assert "".join(deltas) == plain["choices"][0]["message"]["content"]
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == plain["choices"][0]["finish_reason"]
    assert last["delta"] == {}
    assert "usage" not in chunks[-1]  # only with stream_options.include_usage
    assert (
        chunks[-1]["slotserve"]["prefilled_tokens"] + chunks[-1]["slotserve"]["reused_tokens"]
        == plain["usage"]["prompt_tokens"]
    )


async def test_stream_include_usage_sends_a_final_usage_chunk() -> None:
    app, _, _ = app_and_pool()
    req = chat_body([USER1], max_tokens=8, stream=True, stream_options={"include_usage": True})
    async with running_app(app) as client:
        r = await client.post("/v1/chat/completions", json=req)
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["total_tokens"] == (
        usage_chunk["usage"]["prompt_tokens"] + usage_chunk["usage"]["completion_tokens"]
    )
    assert usage_chunk["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert events[-3]["choices"][0]["finish_reason"] in ("stop", "length")


async def test_second_turn_reports_cached_tokens_and_matches_a_cold_run() -> None:
    """Turn 2 resends turn 1: cached_tokens equals the common prefix with the slot's record,
    and its greedy text equals the same request on a server with reuse off."""
    app, runtime, pool = app_and_pool(num_slots=1)
    async with running_app(app) as client:
        first = (
            await client.post("/v1/chat/completions", json=chat_body([SYSTEM, USER1], max_tokens=10))
        ).json()
        answer = first["choices"][0]["message"]["content"]
        turn2 = [
            SYSTEM,
            USER1,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "More?"},
        ]
        record = [int(t) for t in pool.record(0)]
        prompt2 = runtime.encode_chat(turn2)[0]
        common = next(
            (i for i, (a, b) in enumerate(zip(record, prompt2)) if a != b), min(len(record), len(prompt2))
        )
        warm = (await client.post("/v1/chat/completions", json=chat_body(turn2, max_tokens=10))).json()
    cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    assert cached == min(common, len(prompt2) - 1)
    assert warm["slotserve"]["reused_tokens"] == cached
    assert warm["slotserve"]["reuse_source"] == "rewind"
    assert warm["slotserve"]["prefilled_tokens"] == len(prompt2) - cached

    cold_app, _, _ = app_and_pool(num_slots=1, reuse=False)
    async with running_app(cold_app) as client:
        cold = (await client.post("/v1/chat/completions", json=chat_body(turn2, max_tokens=10))).json()
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert cold["choices"][0]["message"]["content"] == warm["choices"][0]["message"]["content"]
    assert cold["usage"]["completion_tokens"] == warm["usage"]["completion_tokens"]


async def test_stop_string_is_never_streamed() -> None:
    app, _, _ = app_and_pool()
    base = chat_body([USER1], max_tokens=32)
    async with running_app(app) as client:
        full = (await client.post("/v1/chat/completions", json=base)).json()["choices"][0]["message"][
            "content"
        ]
        stop = full[len(full) // 2 : len(full) // 2 + 2]
        assert len(stop) == 2, "the fake model's answer is long enough to cut"
        expected = full[: full.index(stop)]
        plain = (await client.post("/v1/chat/completions", json={**base, "stop": [stop]})).json()
        streamed = sse_events(
            (await client.post("/v1/chat/completions", json={**base, "stop": stop, "stream": True})).text
        )
    assert plain["choices"][0]["message"]["content"] == expected
    assert plain["choices"][0]["finish_reason"] == "stop"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in streamed[:-1])
    assert text == expected
    assert stop not in text


async def test_completions_plain_stream_and_token_prompt() -> None:
    app, runtime, _ = app_and_pool()
    prompt = "Once upon a time"
    ids = ByteTokenizer().encode(prompt)
    req = {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0}
    async with running_app(app) as client:
        plain = (await client.post("/v1/completions", json=req)).json()
        by_ids = (await client.post("/v1/completions", json={**req, "prompt": ids})).json()
        batch1 = (await client.post("/v1/completions", json={**req, "prompt": [prompt]})).json()
        streamed = sse_events((await client.post("/v1/completions", json={**req, "stream": True})).text)
        default_len = (await client.post("/v1/completions", json={"prompt": prompt, "temperature": 0})).json()
    assert plain["object"] == "text_completion"
    assert plain["id"].startswith("cmpl-")
    assert plain["usage"]["prompt_tokens"] == len(ids)
    text = plain["choices"][0]["text"]
    assert by_ids["choices"][0]["text"] == text
    assert batch1["choices"][0]["text"] == text
    assert streamed[-1] == "[DONE]"
    assert "".join(c["choices"][0]["text"] for c in streamed[:-1]) == text
    assert streamed[-2]["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    assert default_len["usage"]["completion_tokens"] <= 16  # OpenAI's default for completions
    assert default_len["model"] == MODEL  # no model given: the served name is reported


async def test_models_health_ready_metrics() -> None:
    app, _, _ = app_and_pool()
    async with running_app(app) as client:
        models = (await client.get("/v1/models")).json()
        one = await client.get("/v1/models/alias")
        missing = await client.get("/v1/models/nope")
        health = await client.get("/health")
        ready = await client.get("/ready")
        await client.post("/v1/chat/completions", json=chat_body([USER1], max_tokens=4))
        metrics = await client.get("/metrics")
    assert [m["id"] for m in models["data"]] == [MODEL, "alias"]
    assert models["data"][0]["max_model_len"] == 512
    assert one.status_code == 200 and one.json()["id"] == "alias"
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert health.status_code == 200
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "slotserve_queue_depth" in metrics.text
    # a pushed series: the request above was recorded through the scheduler's sink
    assert 'outcome="ok"' in metrics.text


async def test_ready_is_503_before_the_lifespan_starts() -> None:
    import httpx

    app, _, _ = app_and_pool()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        r = await client.get("/ready")
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "not_ready"


async def test_slots_shows_counts_and_never_text() -> None:
    app, _, _ = app_and_pool(num_slots=2)
    secret = "the-secret-prompt-text"
    async with running_app(app) as client:
        await client.post(
            "/v1/chat/completions", json=chat_body([{"role": "user", "content": secret}], max_tokens=4)
        )
        r = await client.get("/slots")
    assert r.status_code == 200
    data = r.json()["data"]
    assert [s["slot"] for s in data] == [0, 1]
    used = [s for s in data if s["num_tokens"] > 0]
    assert len(used) == 1
    assert used[0]["state"] == "idle"
    assert used[0]["request_id"] is None
    assert used[0]["idle_s"] >= 0
    assert {"num_reuse_hits", "num_reused_tokens"} <= set(used[0])
    assert secret not in r.text


async def test_slots_endpoint_can_be_turned_off() -> None:
    app, _, _ = app_and_pool(no_slots_endpoint=True)
    async with running_app(app) as client:
        r = await client.get("/slots")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"


async def test_tokenize_and_detokenize_round_trip() -> None:
    app, runtime, _ = app_and_pool()
    text = "héllo <|im_end|> world"
    async with running_app(app) as client:
        llama = (await client.post("/tokenize", json={"content": text})).json()
        vllm = (await client.post("/tokenize", json={"model": MODEL, "prompt": text})).json()
        special = (await client.post("/tokenize", json={"content": "a", "add_special": True})).json()
        vllm_special = (
            await client.post("/tokenize", json={"prompt": "a", "add_special_tokens": True})
        ).json()
        chat = (await client.post("/tokenize", json={"messages": [USER1]})).json()
        back = (await client.post("/detokenize", json={"tokens": llama["tokens"]})).json()
    assert llama["tokens"] == ByteTokenizer().encode(text)
    assert 257 in llama["tokens"]  # the special token is parsed, not spelled out in bytes
    assert llama == vllm
    assert llama["count"] == len(llama["tokens"]) and llama["max_model_len"] == 512
    assert special["tokens"] == [258, ord("a")]
    assert vllm_special["tokens"] == [258, ord("a")]
    assert chat["tokens"] == runtime.encode_chat([USER1])[0]
    assert back == {"content": text, "prompt": text}


async def test_prefix_hint_is_where_the_system_turn_ends() -> None:
    app, runtime, _ = app_and_pool()
    seen: list[Any] = []
    submit = runtime.scheduler.submit
    runtime.scheduler.submit = lambda req: (seen.append(req), submit(req))[1]
    async with running_app(app) as client:
        await client.post("/v1/chat/completions", json=chat_body([SYSTEM, USER1], max_tokens=2))
        await client.post("/v1/chat/completions", json=chat_body([USER1], max_tokens=2))
        await client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2})
    system_ids = ByteTokenizer().encode(f"<|im_start|>system\n{SYSTEM['content']}<|im_end|>\n")
    with_system, without_system, completion = seen
    assert with_system.prefix_hint == len(system_ids)
    assert with_system.prompt_ids[: len(system_ids)] == system_ids
    assert without_system.prefix_hint is None
    assert completion.prefix_hint is None
    assert with_system.params.temperature == 0.0 and with_system.params.max_tokens == 2


def test_sampling_fields_map_onto_sampling_params() -> None:
    import msgspec
    from slotserve.gateway import protocol
    from slotserve.gateway.translate import chat_request

    runtime, _ = make_runtime()
    body = chat_body(
        [USER1],
        max_tokens=50,
        max_completion_tokens=7,
        top_k=-1,
        top_p=0.5,
        min_p=0.1,
        seed=-1,
        stop="END",
        stop_token_ids=[5],
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        ignore_eos=True,
    )
    req = msgspec.json.decode(msgspec.json.encode(body), type=protocol.ChatCompletionRequest)
    params = chat_request(req, serve_config(), runtime, "r1").params
    assert params.max_tokens == 7  # max_completion_tokens wins over max_tokens
    assert params.top_k == 0  # -1 means off
    assert (params.top_p, params.min_p, params.temperature) == (0.5, 0.1, 0.0)
    assert params.seed == 2**63 - 1  # folded into the non-negative range
    assert params.stop == ("END",) and params.stop_token_ids == (5,)
    assert (params.presence_penalty, params.frequency_penalty, params.ignore_eos) == (0.5, -0.5, True)
    defaults = chat_request(
        msgspec.json.decode(
            b'{"messages":[{"role":"user","content":"x"}]}', type=protocol.ChatCompletionRequest
        ),
        serve_config(),
        runtime,
        "r2",
    )
    assert defaults.params.temperature == 1.0 and defaults.params.max_tokens == 16  # serve_config's default
    assert defaults.request_id == "r2"


async def test_tokenize_prompt_counts_like_completions_for_a_bos_model() -> None:
    """A model that wants BOS: /tokenize {"prompt"} gives exactly the ids /v1/completions prefills."""
    app, runtime, _ = app_and_pool()
    runtime.tokenizer.add_bos_token = True  # this instance only
    async with running_app(app) as client:
        tok = (await client.post("/tokenize", json={"prompt": "hello"})).json()
        raw = (await client.post("/tokenize", json={"content": "hello"})).json()
        comp = (await client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 1})).json()
    assert tok["tokens"] == [258, *b"hello"]
    assert raw["tokens"] == list(b"hello")
    assert comp["usage"]["prompt_tokens"] == tok["count"]
