"""The default model, Qwen2.5-Coder-0.5B-Instruct, served live (marker real_model): a multi-turn
tool loop through the official `openai` client whose later turns reuse the earlier ones' KV, and
json_schema outputs valid against their schema. Short prompts and few tokens: it decodes about
20-30 tokens/s on two cores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from gateway_support import LiveServer, free_port
from slotserve.gateway.app import create_app
from slotserve.gateway.config import ServeConfig
from slotserve.metrics import ServerMetrics

pytestmark = pytest.mark.real_model

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
FORCE_WEATHER = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def qwen_server(qwen_model_path: Path) -> Iterator[tuple[openai.OpenAI, str]]:
    from slotserve.gateway.runtime import load_runtime

    config = ServeConfig(
        model=str(qwen_model_path),
        port=free_port(),
        log_level="warning",
        batched_session=1,  # one slot: every later turn must reuse the one conversation's KV
        ctx_size=1024,
        max_tokens_limit=64,
    )
    metrics = ServerMetrics()
    runtime = load_runtime(config, stats_sink=metrics.sink)
    with LiveServer(create_app(runtime, config, metrics=metrics), runtime, config) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
        yield client, client.models.list().data[0].id


def _call(reply: Any) -> tuple[Any, dict[str, Any]]:
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    return call, json.loads(call.function.arguments)


def test_tool_loop_over_three_turns_reuses_each_earlier_turn(qwen_server) -> None:
    client, model = qwen_server
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[WEATHER],
        tool_choice=FORCE_WEATHER,
        max_tokens=40,
        temperature=0,
    )
    call, args = _call(first)
    assert args["city"].lower().startswith("paris")
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # cold

    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21, "sky": "sunny"}'},
    ]
    second = client.chat.completions.create(
        model=model, messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=32, temperature=0
    )
    answer = second.choices[0].message.content or ""
    assert second.choices[0].message.tool_calls in (None, []) and answer.strip()
    # the whole first prompt came from the slot, not from a new prefill
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens, (cached, first.usage.prompt_tokens)
    assert second.model_dump()["slotserve"]["reused_tokens"] == cached

    messages += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And in Rome?"},
    ]
    third = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[WEATHER],
        tool_choice=FORCE_WEATHER,
        max_tokens=40,
        temperature=0,
    )
    _, args3 = _call(third)
    assert args3["city"].lower().startswith("rome")
    cached3 = third.usage.prompt_tokens_details.cached_tokens
    assert cached3 >= second.usage.prompt_tokens, (cached3, second.usage.prompt_tokens)


def test_json_schema_outputs_follow_their_schema(qwen_server) -> None:
    client, model = qwen_server
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "country": {"type": "string"},
            "population_millions": {"type": "number"},
        },
        "required": ["city", "country", "population_millions"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Give the capital of France as JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "capital", "schema": schema, "strict": True},
        },
        max_tokens=48,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "stop"
    data = json.loads(reply.choices[0].message.content)
    jsonschema.validate(data, schema)
    assert data["city"] == "Paris" and data["country"] == "France"

    items = {
        "type": "array",
        "items": {"type": "string", "enum": ["red", "green", "blue"]},
        "minItems": 2,
        "maxItems": 3,
    }
    listed = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name two colours of the French flag."}],
        response_format={"type": "json_schema", "json_schema": {"name": "colours", "schema": items}},
        max_tokens=24,
        temperature=0,
    )
    colours = json.loads(listed.choices[0].message.content)
    jsonschema.validate(colours, items)
