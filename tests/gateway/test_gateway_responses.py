"""POST /v1/responses over ASGI: input items to the chat path, function_call output items,
the exact event sequence (scripted output), cached_tokens, previous_response_id and its
bounded store, and errors in OpenAI's shape naming this API's fields.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from gateway_support import (
    MODEL,
    ByteTokenizer,
    Reply,
    make_runtime,
    named_sse_events,
    running_app,
    scripted_runtime,
    serve_config,
)
from slotserve.gateway import translate
from slotserve.gateway.app import create_app
from slotserve.gateway.response_store import ResponseStore
from slotserve.gateway.responses_chat import to_chat
from slotserve.gateway.responses_protocol import ResponsesRequest
from slotserve.scheduler.request import FinishReason

TOK = ByteTokenizer()
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def body(input: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": input, "max_output_tokens": 16, **extra}


def assert_openai_error(r: Any, status: int, param: str | None = None) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param, err
    return err["message"]


# ------------------------------------------------------------------ translation


def test_input_items_become_chat_messages() -> None:
    items = [
        {"role": "developer", "content": "Be terse."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]
    req = msgspec.convert(
        body(items, instructions="Sys.", tools=[WEATHER_TOOL], tool_choice="required"), ResponsesRequest
    )
    plan = to_chat(req, [])
    assert translate.chat_messages(plan.chat) == [
        {"role": "system", "content": "Sys."},
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "function": {
                        "name": "get_weather",
                        "arguments": {"city": "Paris"},
                    },  # an object for the template
                    "id": "call_1",
                    "type": "function",
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    assert plan.chat.tool_choice == "required"
    assert plan.chat.max_tokens == 16
    assert plan.conversation[0] == {"role": "system", "content": "Be terse."}  # without instructions


def test_text_format_and_tool_choice_spellings() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = msgspec.convert(
        body(
            "x",
            text={"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "name": "get_weather"},
        ),
        ResponsesRequest,
    )
    # what the chat route receives (the chat route decides what it serves)
    from slotserve.gateway import protocol
    from slotserve.gateway.responses_chat import _response_format

    assert _response_format(req.text) == protocol.ResponseFormat(
        type="json_schema",
        json_schema=protocol.JsonSchemaFormat(name="out", schema=schema, strict=True),
    )
    fmt = to_chat(req, []).chat.response_format
    assert fmt is not None and fmt.json_schema is not None
    assert (fmt.type, fmt.json_schema.name, fmt.json_schema.schema) == ("json_schema", "out", schema)
    assert to_chat(req, []).chat.tool_choice == {"type": "function", "function": {"name": "get_weather"}}


# ------------------------------------------------------------------ answers


async def test_text_response_object_and_usage() -> None:
    runtime, sched = scripted_runtime(
        Reply(("Hel", "lo"), reused=4), Reply(("cut",), reason=FinishReason.LENGTH)
    )
    async with running_app(create_app(runtime, serve_config())) as client:
        done = (await client.post("/v1/responses", json=body("hi", instructions="Be terse."))).json()
        cut = (await client.post("/v1/responses", json=body("hi"))).json()
    assert done["object"] == "response" and done["id"].startswith("resp_")
    assert done["status"] == "completed" and done["incomplete_details"] is None
    assert done["instructions"] == "Be terse." and done["model"] == MODEL
    (item,) = done["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["status"] == "completed"
    assert item["content"] == [{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}]
    n = len(sched.submitted[0].prompt_ids)
    assert done["usage"] == {
        "input_tokens": n,
        "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": n + 2,
    }
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_function_call_output_item() -> None:
    runtime, _ = scripted_runtime(Reply((CALL_TEXT[:30], CALL_TEXT[30:])))
    async with running_app(create_app(runtime, serve_config())) as client:
        got = (await client.post("/v1/responses", json=body("w?", tools=[WEATHER_TOOL]))).json()
    (call,) = got["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather" and call["status"] == "completed"
    assert call["call_id"].startswith("call_") and call["id"].startswith("fc_")
    assert json.loads(call["arguments"]) == {"city": "Paris"}


async def test_stream_event_sequence_with_text_and_a_function_call() -> None:
    runtime, _ = scripted_runtime(Reply(("Let me check.", CALL_TEXT[:20], CALL_TEXT[20:]), reused=2))
    async with running_app(create_app(runtime, serve_config())) as client:
        r = await client.post("/v1/responses", json=body("w?", tools=[WEATHER_TOOL], stream=True))
    events = named_sse_events(r.text)
    assert [n for n, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert all(data["type"] == name for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    created = events[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    msg_id = events[2][1]["item"]["id"]
    assert events[4][1]["item_id"] == msg_id and events[4][1]["delta"] == "Let me check."
    assert events[5][1]["text"] == "Let me check."
    call = events[8][1]["item"]
    assert events[8][1]["output_index"] == 1 and call["name"] == "get_weather" and call["arguments"] == ""
    assert json.loads(events[10][1]["arguments"]) == {"city": "Paris"}
    final = events[-1][1]["response"]
    assert final["status"] == "completed" and final["id"] == created["id"]
    assert [o["type"] for o in final["output"]] == ["message", "function_call"]
    assert final["output"][0]["id"] == msg_id and final["output"][1]["id"] == call["id"]
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 2


async def test_stream_failure_is_response_failed() -> None:
    runtime, _ = scripted_runtime(Reply(("x",), reason=FinishReason.ERROR, error="boom"))
    async with running_app(create_app(runtime, serve_config())) as client:
        r = await client.post("/v1/responses", json=body("hi", stream=True))
    name, data = named_sse_events(r.text)[-1]
    assert name == "response.failed"
    assert data["response"]["status"] == "failed"
    assert data["response"]["error"] == {"code": "engine_error", "message": "generation failed: boom"}


# ------------------------------------------------------------------ previous_response_id


async def test_previous_response_id_continues_the_stored_conversation() -> None:
    runtime, sched = scripted_runtime(
        Reply(("Paris",)), Reply(("Rome",)), Reply(("x",)), Reply(("y",)), Reply(("z",))
    )
    async with running_app(create_app(runtime, serve_config())) as client:
        first = (
            await client.post("/v1/responses", json=body("Capital of France?", instructions="Terse."))
        ).json()
        second = await client.post(
            "/v1/responses", json=body("And Italy?", previous_response_id=first["id"], instructions="New.")
        )
        unstored = (await client.post("/v1/responses", json=body("q", store=False))).json()
        miss = await client.post("/v1/responses", json=body("q", previous_response_id=unstored["id"]))
        streamed = await client.post("/v1/responses", json=body("s", stream=True))
        stream_id = named_sse_events(streamed.text)[0][1]["response"]["id"]
        after_stream = await client.post("/v1/responses", json=body("t", previous_response_id=stream_id))
    assert second.status_code == 200 and second.json()["previous_response_id"] == first["id"]
    prompt = TOK.decode(sched.submitted[1].prompt_ids)
    assert prompt == (
        "<|im_start|>system\nNew.<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n"
        "<|im_start|>assistant\nParis<|im_end|>\n<|im_start|>user\nAnd Italy?<|im_end|>\n<|im_start|>assistant\n"
    )  # the old instructions are not carried over; the old output is
    assert unstored["store"] is False
    assert "not found" in assert_openai_error(miss, 404, "previous_response_id")
    assert miss.json()["error"]["code"] == "previous_response_not_found"
    assert after_stream.status_code == 200
    assert TOK.decode(sched.submitted[-1].prompt_ids).count("<|im_start|>user\ns<|im_end|>") == 1


def test_store_bounds_count_and_bytes_least_recently_used_first() -> None:
    store = ResponseStore(max_responses=2, max_bytes=200)
    msg = [{"role": "user", "content": "a" * 40}]
    assert store.put("r1", msg) and store.put("r2", msg)
    assert store.get("r1") == msg  # r1 is now the most recently used
    store.put("r3", msg)  # the count bound evicts r2
    assert store.get("r2") is None and store.get("r1") == msg and len(store) == 2
    big = [{"role": "user", "content": "b" * 120}]
    store.put("r4", big)  # the byte bound evicts until it fits
    assert store.num_bytes <= 200 and store.get("r4") == big
    assert store.get("r1") is None
    assert not store.put("huge", [{"role": "user", "content": "c" * 500}])  # larger than the cap: not kept
    assert store.get("huge") is None


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "patch, param",
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input"),  # accepted, but no message
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"max_output_tokens": 100000}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER_TOOL]}, "tool_choice"),
        ({"background": True}, "background"),
        ({"input": []}, "input"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format"),  # chat_plan's error, this API's name
    ],
)
async def test_bad_requests_are_400_naming_the_field(patch: dict[str, Any], param: str) -> None:
    runtime, sched = scripted_runtime()
    async with running_app(create_app(runtime, serve_config())) as client:
        r = await client.post("/v1/responses", json={**body("x"), **patch})
    assert_openai_error(r, 400, param)
    assert sched.submitted == []


async def test_reuse_across_turns_on_the_real_scheduler() -> None:
    runtime, _ = make_runtime(num_slots=1)
    app = create_app(runtime, serve_config())
    async with running_app(app) as client:
        r1 = (
            await client.post(
                "/v1/responses", json=body("Tell me about slots.", temperature=0, max_output_tokens=8)
            )
        ).json()
        r2 = (
            await client.post(
                "/v1/responses",
                json=body("More?", temperature=0, max_output_tokens=8, previous_response_id=r1["id"]),
            )
        ).json()
    assert r1["usage"]["input_tokens_details"]["cached_tokens"] == 0
    assert r2["usage"]["input_tokens_details"]["cached_tokens"] >= r1["usage"]["input_tokens"]


async def test_a_codex_shaped_request_is_served() -> None:
    """The shape Codex CLI sends: store false, the whole history each turn (developer and user
    messages, function_call items with ids, function_call_output), function tools with strict
    false, reasoning / include / prompt_cache_key this server ignores, streaming."""
    shell = {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
            "required": ["command"],
            "additionalProperties": False,
        },
    }
    req = {
        "model": MODEL,
        "instructions": "You are Codex.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "<permissions>"}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": "shell",
                "arguments": '{"command":["ls"]}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "a.py"},
        ],
        "tools": [shell],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": None,
        "store": False,
        "stream": True,
        "include": [],
        "prompt_cache_key": "session-1",
    }
    call = '<tool_call>\n{"name": "shell", "arguments": {"command": ["cat", "a.py"]}}\n</tool_call>'
    runtime, sched = scripted_runtime(Reply((call,)))
    async with running_app(create_app(runtime, serve_config())) as client:
        r = await client.post("/v1/responses", json=req)
    events = named_sse_events(r.text)
    final = events[-1][1]["response"]
    assert events[-1][0] == "response.completed" and final["store"] is False
    (item,) = final["output"]
    assert item["type"] == "function_call" and json.loads(item["arguments"]) == {"command": ["cat", "a.py"]}
    prompt = TOK.decode(sched.submitted[0].prompt_ids)
    assert prompt.startswith("<|im_start|>system\nYou are Codex.")
    assert '{"name": "shell", "arguments": {"command": ["ls"]}}' in prompt and "a.py" in prompt
