"""The agent API with the official `openai` client on the real SmolLM2 model: a three-turn tool
loop (streamed and not), json_schema answers over 50 seeds, logprobs against the sampler, n=4
prefilled once, logit_bias, and prefix reuse through a tool loop and under a schema."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from gateway_support import LiveServer, free_port
from slotserve.gateway.app import create_app
from slotserve.gateway.config import ServeConfig
from slotserve.scheduler.stats import NullSink, StepStats

pytestmark = pytest.mark.real_model

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "population": {"type": "integer", "minimum": 0, "maximum": 99999999},
        "is_capital": {"type": "boolean"},
    },
    "required": ["city", "population", "is_capital"],
    "additionalProperties": False,
}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


class CountingSink(NullSink):
    """Counts the prompt tokens the engine computed (the scheduler's StepStats)."""

    def __init__(self) -> None:
        self.num_prefill_tokens = 0

    def on_step(self, s: StepStats) -> None:
        self.num_prefill_tokens += s.num_prefill_tokens


@pytest.fixture(scope="module")
def server(real_model_path: Path) -> Iterator[tuple[LiveServer, CountingSink]]:
    from slotserve.gateway.runtime import load_runtime

    config = ServeConfig(
        model=str(real_model_path),
        port=free_port(),
        log_level="warning",
        batched_session=4,
        ctx_size=1024,
        max_tokens_limit=128,
        default_max_tokens=64,
    )
    sink = CountingSink()
    runtime = load_runtime(config, stats_sink=sink)
    with LiveServer(create_app(runtime, config), runtime, config) as live:
        yield live, sink


@pytest.fixture(scope="module")
def client(server: tuple[LiveServer, CountingSink]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0].url + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def _stream_turn(client: openai.OpenAI, **kw: Any) -> tuple[str, list[dict[str, str]], str, Any]:
    """A streamed chat turn rebuilt as a client does: content, tool calls, finish reason, usage."""
    content, calls, finish, usage = [], {}, None, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            content.append(ch.delta.content or "")
            for tc in ch.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += tc.id or ""
                if tc.function is not None:
                    slot["name"] += tc.function.name or ""
                    slot["arguments"] += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    return "".join(content), [calls[i] for i in sorted(calls)], finish, usage


def _reuse_hits(server: tuple[LiveServer, CountingSink]) -> int:
    """The scheduler's per-slot reuse-hit counters, summed (GET /slots)."""
    return sum(s["num_reuse_hits"] for s in httpx.get(server[0].url + "/slots").json()["data"])


@pytest.mark.parametrize("stream", [False, True])
def test_three_turn_tool_loop_and_reuse(
    client: openai.OpenAI, model: str, stream: bool, server: tuple[LiveServer, CountingSink]
) -> None:
    hits_before = _reuse_hits(server)
    user = {"role": "user", "content": f"What is the weather in Paris? ({'streamed' if stream else 'plain'})"}
    messages: list[dict[str, Any]] = [SYSTEM, user]
    common = dict(model=model, tools=[WEATHER], temperature=0, max_tokens=64)
    # turn 1: the model must call the tool (tool_choice=required: constrained decoding)
    if stream:
        content, calls, finish, usage1 = _stream_turn(
            client, messages=messages, tool_choice="required", **common
        )
    else:
        r1 = client.chat.completions.create(messages=messages, tool_choice="required", **common)
        finish, usage1 = r1.choices[0].finish_reason, r1.usage
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in r1.choices[0].message.tool_calls or []
        ]
    assert finish == "tool_calls" and len(calls) >= 1
    call = calls[0]
    assert call["name"] == "get_weather" and call["id"].startswith("call_")
    jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])
    # turn 2: the tool result goes back; the model answers in text, reusing turn 1's prompt
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": '{"temperature_c": 21, "sky": "clear"}'},
    ]
    if stream:
        answer, calls2, finish2, usage2 = _stream_turn(
            client, messages=messages, tool_choice="none", **common
        )
    else:
        r2 = client.chat.completions.create(messages=messages, tool_choice="none", **common)
        answer, finish2, usage2 = r2.choices[0].message.content or "", r2.choices[0].finish_reason, r2.usage
        calls2 = r2.choices[0].message.tool_calls or []
    assert answer and not calls2 and finish2 in ("stop", "length")
    # the whole turn-1 prompt was reused (its rows were still in the slot)
    assert usage2.prompt_tokens_details.cached_tokens >= usage1.prompt_tokens - 1
    # turn 3: a follow-up question; reuse covers turn 2's prompt
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And in Rome?"}]
    r3 = client.chat.completions.create(messages=messages, tool_choice="required", **common)
    assert r3.choices[0].finish_reason == "tool_calls"
    assert r3.usage.prompt_tokens_details.cached_tokens >= usage2.prompt_tokens - 1
    assert r3.usage.prompt_tokens_details.cached_tokens == r3.model_dump()["slotserve"]["reused_tokens"]
    assert _reuse_hits(server) - hits_before >= 2  # turns 2 and 3 were reuse hits in the scheduler


def test_json_schema_answers_validate_over_50_seeds(client: openai.OpenAI, model: str) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Describe a city as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}}
    for seed in range(50):
        r = client.chat.completions.create(
            model=model, messages=messages, response_format=fmt, temperature=1.0, seed=seed, max_tokens=96
        )
        text = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop", (seed, text)
        jsonschema.validate(json.loads(text), CITY_SCHEMA)


def test_json_object_on_completions(client: openai.OpenAI, model: str) -> None:
    r = client.completions.create(
        model=model,
        prompt="A JSON object describing a cat:",
        max_tokens=96,
        temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"schema": CITY_SCHEMA}}},
    )
    jsonschema.validate(json.loads(r.choices[0].text), CITY_SCHEMA)


def test_reuse_under_a_schema(client: openai.OpenAI, model: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}}
    messages = [SYSTEM, {"role": "user", "content": "Give me Lyon as JSON."}]
    r1 = client.chat.completions.create(model=model, messages=messages, response_format=fmt, temperature=0)
    messages += [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "Now Nice."},
    ]
    r2 = client.chat.completions.create(model=model, messages=messages, response_format=fmt, temperature=0)
    jsonschema.validate(json.loads(r2.choices[0].message.content), CITY_SCHEMA)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= r1.usage.prompt_tokens - 1
    assert cached == r2.model_dump()["slotserve"]["reused_tokens"]


def test_logprobs_agree_with_the_sampler(client: openai.OpenAI, model: str) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Name three colours."}]
    r = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=12, logprobs=True, top_logprobs=5
    )
    content = r.choices[0].logprobs.content
    eos = 1 if r.choices[0].finish_reason == "stop" else 0  # the eos token ends the reply unseen
    assert len(content) == r.usage.completion_tokens - eos
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 5
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob  # greedy = top
        assert sum(2.718281828459045**x.logprob for x in t.top_logprobs) <= 1.0 + 1e-6
    streamed = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=12,
        logprobs=True,
        top_logprobs=5,
        stream=True,
    )
    tokens = [
        t for chunk in streamed for ch in chunk.choices if ch.logprobs for t in ch.logprobs.content or []
    ]
    assert [(t.token, t.logprob) for t in tokens] == [(t.token, t.logprob) for t in content]
    comp = client.completions.create(
        model=model, prompt="Red, green and", max_tokens=5, temperature=0, logprobs=3
    )
    lp = comp.choices[0].logprobs
    eos = 1 if comp.choices[0].finish_reason == "stop" else 0
    assert (
        len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == comp.usage.completion_tokens - eos
    )
    assert all(max(top.values()) == value for top, value in zip(lp.top_logprobs, lp.token_logprobs))


def test_logit_bias_bans_the_greedy_token(
    client: openai.OpenAI, model: str, server: tuple[LiveServer, CountingSink]
) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Say hello."}]
    base = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=4, logprobs=True, top_logprobs=2
    )
    first = base.choices[0].logprobs.content[0]
    tid = httpx.post(server[0].url + "/tokenize", json={"content": first.token}).json()["tokens"][0]
    banned = client.chat.completions.create(
        model=model,
        messages=messages,
        temperature=0,
        max_tokens=4,
        logprobs=True,
        logit_bias={str(tid): -100},
    )
    assert banned.choices[0].logprobs.content[0].token == first.top_logprobs[1].token


def test_n_4_prefills_the_prompt_once(
    client: openai.OpenAI, model: str, server: tuple[LiveServer, CountingSink]
) -> None:
    _, sink = server
    messages = [SYSTEM, {"role": "user", "content": "Write a word that rhymes with 'cat' (n=4 test)."}]
    before = sink.num_prefill_tokens
    r = client.chat.completions.create(
        model=model, messages=messages, n=4, temperature=1.0, seed=7, max_tokens=8
    )
    computed = sink.num_prefill_tokens - before
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    prompt, cached = r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens
    assert prompt - cached > 4  # enough of the prompt is new for the count to tell
    # the prompt once, then each fork recomputes only its last token (for its own logits)
    assert computed == prompt - cached + 3, (computed, prompt, cached)
    assert 4 <= r.usage.completion_tokens <= 4 * 8  # summed over the choices
    again = client.chat.completions.create(
        model=model, messages=messages, n=4, temperature=1.0, seed=7, max_tokens=8
    )
    assert [c.message.content for c in again.choices] == [
        c.message.content for c in r.choices
    ]  # seeds per choice
    assert len({c.message.content for c in r.choices}) > 1


def test_strict_tool_under_auto_and_a_named_function(client: openai.OpenAI, model: str) -> None:
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    clock = {
        "type": "function",
        # no arguments at all (an open object would let a small model write arguments forever)
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    }
    messages = [SYSTEM, {"role": "user", "content": "What is the weather in Oslo?"}]
    for seed in range(4):
        r = client.chat.completions.create(
            model=model, messages=messages, tools=[strict, clock], temperature=1.0, seed=seed, max_tokens=64
        )
        msg = r.choices[0].message
        for call in msg.tool_calls or []:  # whatever the model chose, a call is valid
            if call.function.name == "get_weather":
                jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        assert msg.tool_calls or msg.content
    named = client.chat.completions.create(
        model=model,
        messages=messages,
        tools=[strict, clock],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=64,
    )
    calls = named.choices[0].message.tool_calls
    assert named.choices[0].finish_reason == "tool_calls", named.choices[0].message
    assert [c.function.name for c in calls] == ["get_time"]
