"""The official `anthropic` and `openai` clients against /v1/messages and /v1/responses on a live
uvicorn server: plain and streamed answers (the SDKs' own stream accumulators must rebuild the
same message), a tool round trip on each API, errors as the SDKs' exception types, and reuse
across turns (`cache_read_input_tokens` / `cached_tokens` grow from turn 2 on) on the real model.

Scripted output (ScriptedScheduler) makes the tool calls deterministic; the real SmolLM2 model
checks reuse and the streamed == non-streamed text for the same greedy request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from gateway_support import MODEL, ByteTokenizer, LiveServer, Reply, free_port, scripted_runtime, serve_config
from slotserve.gateway.app import create_app
from slotserve.gateway.config import ServeConfig
from slotserve.metrics import ServerMetrics

KEY = "k-123"
TOK = ByteTokenizer()
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,  # held to this, a tiny model cannot ramble on in the arguments
    },
}
RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": ANTHROPIC_TOOL["input_schema"],
}


def anthropic_client(server: LiveServer, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=120)


def openai_client(server: LiveServer, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture()
def scripted_live(request: pytest.FixtureRequest) -> Iterator[tuple[LiveServer, Any]]:
    replies = request.param if hasattr(request, "param") else ()
    runtime, sched = scripted_runtime(*replies)
    config = serve_config(port=free_port(), log_level="warning", api_key=KEY)
    with LiveServer(create_app(runtime, config), runtime, config) as server:
        yield server, sched


# ------------------------------------------------------------------ scripted output


TOOL_LOOP = (
    Reply(("Let me check.", CALL_TEXT[:25], CALL_TEXT[25:])),  # turn 1, plain
    Reply(("Let me check.", CALL_TEXT[:25], CALL_TEXT[25:])),  # turn 1, streamed
    Reply(("It is ", "sunny in Paris.")),  # turn 2, after the tool result
)


@pytest.mark.parametrize("scripted_live", [TOOL_LOOP], indirect=True)
def test_anthropic_client_tool_round_trip(scripted_live: tuple[LiveServer, Any]) -> None:
    server, sched = scripted_live
    client = anthropic_client(server)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.messages.create(model=MODEL, max_tokens=32, messages=messages, tools=[ANTHROPIC_TOOL])
    assert first.stop_reason == "tool_use"
    text, call = first.content
    assert text.type == "text" and text.text == "Let me check."
    assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Paris"}
    with client.messages.stream(
        model=MODEL, max_tokens=32, messages=messages, tools=[ANTHROPIC_TOOL]
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use"
    assert [b.type for b in streamed.content] == ["text", "tool_use"]
    assert streamed.content[1].input == {"city": "Paris"}  # rebuilt from input_json_delta events
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 24C"}],
        },
    ]
    second = client.messages.create(model=MODEL, max_tokens=32, messages=messages, tools=[ANTHROPIC_TOOL])
    assert second.stop_reason == "end_turn"
    assert second.content[0].text == "It is sunny in Paris."
    prompt = TOK.decode(sched.submitted[2].prompt_ids)
    # the call and its result reached the template (this one renders no tools: the Hermes shim)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<|im_start|>tool\n<tool_response>\nsunny, 24C\n</tool_response><|im_end|>" in prompt


BARE_CALLS = '{"name": "get_weather", "arguments": {"city": "Paris"}}\n{"name": "get_weather", "arguments": {"city": "Rome"}}'
CHAT_TOOL = {
    "type": "function",
    "function": {k: RESPONSES_TOOL[k] for k in ("name", "description", "parameters")},
}


def _pieces(text: str, n: int) -> tuple[str, ...]:
    return tuple(text[i : i + n] for i in range(0, len(text), n))


@pytest.mark.parametrize(
    "scripted_live",
    [
        (
            Reply(
                _pieces(
                    "<tool_call>\n"
                    + BARE_CALLS.replace("\n", "\n</tool_call>\n<tool_call>\n")
                    + "\n</tool_call>",
                    5,
                )
            ),
            Reply(_pieces(BARE_CALLS, 4)),
        )
    ],
    indirect=True,
)
def test_openai_chat_stream_accumulates_tool_calls(scripted_live: tuple[LiveServer, Any]) -> None:
    """The SDK's own accumulator (chat.completions.stream) rebuilds both calls from the chunks,
    tagged (Hermes) and bare (what small models write), and sees no content in the turn."""
    server, _ = scripted_live
    client = openai_client(server)
    for _ in range(2):
        with client.chat.completions.stream(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather in Paris and Rome?"}],
            tools=[CHAT_TOOL],
        ) as stream:
            events = list(stream)
            final = stream.get_final_completion()
        choice = final.choices[0]
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        calls = choice.message.tool_calls
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("get_weather", {"city": "Paris"}),
            ("get_weather", {"city": "Rome"}),
        ]
        assert len({c.id for c in calls}) == 2
        deltas = [e for e in events if e.type == "tool_calls.function.arguments.delta"]
        assert len(deltas) > 4  # fragments as they were generated, not one per call
        assert not [e for e in events if e.type == "content.delta" and e.delta]


@pytest.mark.parametrize("scripted_live", [TOOL_LOOP], indirect=True)
def test_openai_responses_client_tool_round_trip(scripted_live: tuple[LiveServer, Any]) -> None:
    server, sched = scripted_live
    client = openai_client(server)
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[RESPONSES_TOOL])
    assert first.status == "completed"
    message, call = first.output
    assert message.type == "message" and first.output_text == "Let me check."
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    with client.responses.stream(model=MODEL, input="Weather in Paris?", tools=[RESPONSES_TOOL]) as stream:
        names = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert names[0] == "response.created" and names[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in names
    assert [o.type for o in streamed.output] == ["message", "function_call"]
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24C"}],
        tools=[RESPONSES_TOOL],
    )
    assert second.output_text == "It is sunny in Paris."
    prompt = TOK.decode(sched.submitted[2].prompt_ids)
    assert "<|im_start|>user\nWeather in Paris?<|im_end|>" in prompt  # from the stored response
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<|im_start|>tool\n<tool_response>\nsunny, 24C\n</tool_response><|im_end|>" in prompt


@pytest.mark.parametrize("scripted_live", [()], indirect=True)
def test_both_sdks_list_the_served_models(scripted_live: tuple[LiveServer, Any]) -> None:
    server, _ = scripted_live
    listed = anthropic_client(server).models.list()
    assert [m.id for m in listed.data] == [MODEL] and listed.has_more is False
    card = anthropic_client(server).models.retrieve(MODEL)
    assert (card.type, card.display_name, card.created_at.year) == ("model", MODEL, 2023)
    assert [m.id for m in openai_client(server).models.list().data] == [MODEL]


@pytest.mark.parametrize("scripted_live", [()], indirect=True)
def test_errors_are_the_sdks_exception_types(scripted_live: tuple[LiveServer, Any]) -> None:
    server, sched = scripted_live
    user = [{"role": "user", "content": "x"}]
    with pytest.raises(anthropic.AuthenticationError) as auth:
        anthropic_client(server, "wrong").messages.create(model=MODEL, max_tokens=4, messages=user)
    assert auth.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError):
        anthropic_client(server).messages.create(model="claude-nope", max_tokens=4, messages=user)
    image = [
        {
            "role": "user",
            "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
            ],
        }
    ]
    with pytest.raises(anthropic.BadRequestError) as bad:
        anthropic_client(server).messages.create(model=MODEL, max_tokens=4, messages=image)
    assert "images are not supported" in bad.value.body["error"]["message"]
    with pytest.raises(openai.NotFoundError) as missing:
        openai_client(server).responses.create(model=MODEL, input="x", previous_response_id="resp_nope")
    assert missing.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError) as bad_item:
        openai_client(server).responses.create(
            model=MODEL,
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}],
        )
    assert bad_item.value.param == "input[0].content[0].type"
    assert sched.submitted == []


# ------------------------------------------------------------------ the real model


def live_model_server(model_path: Path) -> LiveServer:
    from slotserve.gateway.runtime import load_runtime

    config = ServeConfig(
        model=str(model_path),
        port=free_port(),
        log_level="warning",
        batched_session=2,
        ctx_size=1024,
        max_tokens_limit=64,
        default_max_tokens=16,
    )
    metrics = ServerMetrics()
    runtime = load_runtime(config, stats_sink=metrics.sink)
    return LiveServer(create_app(runtime, config, metrics=metrics), runtime, config)


@pytest.fixture(scope="module")
def real_live(real_model_path: Path) -> Iterator[LiveServer]:
    with live_model_server(real_model_path) as server:
        yield server


SYSTEM = "You are a helpful assistant. Answer in one short sentence."
QUESTIONS = ("What is the capital of France?", "And of Italy?", "And of Spain?")


@pytest.mark.real_model
def test_anthropic_client_turns_reuse_the_conversation(real_live: LiveServer) -> None:
    client = anthropic_client(real_live, "none")
    model = openai_client(real_live, "none").models.list().data[0].id
    messages: list[dict[str, Any]] = []
    reads = []
    for turn, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": question})
        # temperature is not in the current SDK's signature (older clients send it): extra_body
        kwargs: dict[str, Any] = dict(
            model=model, max_tokens=12, system=SYSTEM, messages=messages, extra_body={"temperature": 0}
        )
        got = client.messages.create(**kwargs)
        u = got.usage
        counted = client.messages.count_tokens(model=model, system=SYSTEM, messages=messages).input_tokens
        assert u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens == counted
        reads.append(u.cache_read_input_tokens)
        if turn == 0:
            with client.messages.stream(**kwargs) as stream:
                streamed = stream.get_final_message()
            assert streamed.content[0].text == got.content[0].text  # same greedy request
            assert streamed.usage.output_tokens == u.output_tokens
            assert streamed.usage.cache_read_input_tokens > 0  # the same prompt, again
        messages.append({"role": "assistant", "content": got.content[0].text})
    assert reads[1] > 0 and reads[2] > reads[1]  # each turn reads the conversation so far


@pytest.mark.real_model
def test_openai_responses_turns_reuse_the_conversation(real_live: LiveServer) -> None:
    client = openai_client(real_live, "none")
    model = client.models.list().data[0].id
    cached, previous = [], None
    for turn, question in enumerate(QUESTIONS):
        got = client.responses.create(
            model=model,
            instructions=SYSTEM,
            input=question,
            previous_response_id=previous,
            max_output_tokens=12,
            temperature=0,
        )
        assert got.usage is not None
        cached.append(got.usage.input_tokens_details.cached_tokens)
        if turn == 0:
            with client.responses.stream(
                model=model, instructions=SYSTEM, input=question, max_output_tokens=12, temperature=0
            ) as stream:
                streamed = stream.get_final_response()
            assert streamed.output_text == got.output_text
        previous = got.id
    assert cached[1] > 0 and cached[2] > cached[1]


@pytest.mark.real_model
def test_anthropic_client_tool_round_trip_on_the_real_model(real_live: LiveServer) -> None:
    """tool_choice `tool` forces a call (constrained decoding); the tool result goes back and the
    next turn reuses the conversation, tool call and result included."""
    client = anthropic_client(real_live, "none")
    model = openai_client(real_live, "none").models.list().data[0].id
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    kwargs: dict[str, Any] = dict(
        model=model, max_tokens=48, tools=[ANTHROPIC_TOOL], extra_body={"temperature": 0}
    )
    first = client.messages.create(
        messages=messages,
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        **kwargs,
    )
    assert first.stop_reason == "tool_use"
    calls = [b for b in first.content if b.type == "tool_use"]
    assert [b.type for b in first.content] == ["tool_use"]  # one call, nothing else (forced)
    assert calls[0].name == "get_weather" and isinstance(calls[0].input["city"], str)  # held to the schema
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "Sunny, 24 C"}],
        },
    ]
    second = client.messages.create(messages=messages, tool_choice={"type": "none"}, **kwargs)
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert second.content and second.content[0].type == "text"
    assert second.usage.cache_read_input_tokens > 0  # the first turn's prompt, from its slot


@pytest.mark.real_model
def test_openai_responses_tool_round_trip_on_the_real_model(real_live: LiveServer) -> None:
    client = openai_client(real_live, "none")
    model = client.models.list().data[0].id
    first = client.responses.create(
        model=model,
        input="What is the weather in Paris?",
        tools=[RESPONSES_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=48,
        temperature=0,
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments).get("city"), str)
    second = client.responses.create(
        model=model,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 24 C"}],
        tools=[RESPONSES_TOOL],
        tool_choice="none",
        max_output_tokens=24,
        temperature=0,
    )
    assert second.output_text
    assert second.usage is not None and second.usage.input_tokens_details.cached_tokens > 0


THINKING_REPLY = Reply(_pieces("<think>\nFrance's capital is Paris.\n</think>\n\nParis.", 4))


@pytest.mark.parametrize("scripted_live", [(THINKING_REPLY,) * 3], indirect=True)
def test_sdk_accumulators_rebuild_thinking(scripted_live: tuple[LiveServer, Any]) -> None:
    """A thinking reply streamed to each SDK: Anthropic's accumulator builds a thinking block,
    the Responses one a reasoning item, the chat one keeps `reasoning_content` apart."""
    server, _ = scripted_live
    user = [{"role": "user", "content": "Capital of France?"}]
    with anthropic_client(server).messages.stream(model=MODEL, max_tokens=64, messages=user) as stream:
        message = stream.get_final_message()
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking.strip() == "France's capital is Paris."  # type: ignore[union-attr]
    with openai_client(server).responses.stream(model=MODEL, input="Capital of France?") as rstream:
        response = rstream.get_final_response()
    assert [o.type for o in response.output] == ["reasoning", "message"] and response.output_text == "Paris."
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens > 0
    chunks = list(openai_client(server).chat.completions.create(model=MODEL, messages=user, stream=True))
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert (reasoning.strip(), content) == ("France's capital is Paris.", "Paris.")
