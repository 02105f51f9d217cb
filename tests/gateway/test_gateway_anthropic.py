"""POST /v1/messages and /v1/messages/count_tokens over ASGI: translation to the chat path,
the cache_control hint's token offset, exact event sequences (scripted output), tool_use
blocks, usage accounting, and every error in Anthropic's shape.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
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
from slotserve.gateway.anthropic_chat import to_chat
from slotserve.gateway.anthropic_protocol import MessagesRequest
from slotserve.gateway.app import create_app
from slotserve.scheduler.request import Draining, FinishReason, PromptTooLong, QueueFull

TOK = ByteTokenizer()
SYSTEM_TEXT = "You are terse."
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 16, "messages": messages, **extra}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assert_anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    got = r.json()
    assert set(got) == {"type", "error"} and got["type"] == "error"
    assert set(got["error"]) == {"type", "message"}
    assert got["error"]["type"] == kind, got
    assert got["error"]["message"]
    return got["error"]["message"]


def ids(text: str) -> list[int]:
    return TOK.encode(text)


# ------------------------------------------------------------------ translation


def test_blocks_become_chat_messages_with_tool_calls_and_tool_results() -> None:
    req = msgspec.convert(
        body(
            [
                user("Weather in Paris?"),
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Checking."},
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "sunny"}],
                        },
                        {"type": "text", "text": "Thanks"},
                    ],
                },
            ],
            system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
            tools=[WEATHER_TOOL],
            tool_choice={"type": "any"},
            stop_sequences=["END"],
            top_k=5,
        ),
        MessagesRequest,
    )
    plan = to_chat(req)
    chat = msgspec.to_builtins(plan.chat)
    assert translate.chat_messages(plan.chat) == [
        {"role": "system", "content": "A\nB"},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    # the template gets the arguments as an object (translate._message_dict)
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    "id": "toolu_1",
                    "type": "function",
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "toolu_1"},
        {"role": "user", "content": "Thanks"},
    ]
    assert chat["tools"] == [
        {
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": WEATHER_TOOL["input_schema"],
            },
            "type": "function",
        }
    ]
    assert chat["tool_choice"] == "required"
    assert chat["stop"] == ["END"] and chat["top_k"] == 5 and chat["max_tokens"] == 16
    assert plan.breakpoint is None


@pytest.mark.parametrize(
    "choice, chat_choice",
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}),
    ],
)
def test_tool_choice_spellings(choice: dict[str, Any], chat_choice: Any) -> None:
    req = msgspec.convert(body([user("x")], tools=[WEATHER_TOOL], tool_choice=choice), MessagesRequest)
    assert to_chat(req).chat.tool_choice == chat_choice


# ------------------------------------------------------------------ the cache_control hint


async def submitted_hint(req_body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    runtime, sched = scripted_runtime(Reply(("ok",)))
    async with running_app(create_app(runtime, serve_config())) as client:
        r = await client.post("/v1/messages", json=req_body)
    assert r.status_code == 200, r.text
    return sched.submitted[0], r.json()


async def test_a_breakpoint_on_an_inner_system_block_or_a_tool_hints_the_whole_system_turn() -> None:
    turn = f"<|im_start|>system\nA\n{SYSTEM_TEXT}<|im_end|>\n"
    marked_first = [
        {"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": SYSTEM_TEXT},
    ]
    gen, _ = await submitted_hint(body([user("hi")], system=marked_first))
    assert gen.prefix_hint == len(ids(turn))
    tool = {**WEATHER_TOOL, "cache_control": {"type": "ephemeral"}}
    gen, got = await submitted_hint(body([user("hi")], system=SYSTEM_TEXT, tools=[tool]))
    system_end = TOK.decode(gen.prompt_ids).index("<|im_end|>\n") + len("<|im_end|>\n")
    assert gen.prefix_hint == len(ids(TOK.decode(gen.prompt_ids)[:system_end]))  # tools included
    assert got["usage"]["cache_creation_input_tokens"] == gen.prefix_hint


async def test_cache_control_on_the_system_block_hints_the_end_of_the_system_turn() -> None:
    system = [{"type": "text", "text": SYSTEM_TEXT, "cache_control": {"type": "ephemeral"}}]
    gen, got = await submitted_hint(body([user("hi")], system=system))
    offset = len(ids(f"<|im_start|>system\n{SYSTEM_TEXT}<|im_end|>\n"))
    assert gen.prefix_hint == offset
    assert gen.prompt_ids[:offset] == ids(f"<|im_start|>system\n{SYSTEM_TEXT}<|im_end|>\n")
    # Anthropic's accounting: the tokens up to the breakpoint were written, the rest is input
    assert got["usage"] == {
        "input_tokens": len(gen.prompt_ids) - offset,
        "output_tokens": 1,
        "cache_creation_input_tokens": offset,
        "cache_read_input_tokens": 0,
    }


async def test_cache_control_on_the_last_message_hints_the_end_of_that_turn() -> None:
    msgs = [
        user("one"),
        {"role": "assistant", "content": "two"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "three", "cache_control": {"type": "ephemeral"}}],
        },
    ]
    gen, _ = await submitted_hint(body(msgs, system=SYSTEM_TEXT))
    turns = (
        f"<|im_start|>system\n{SYSTEM_TEXT}<|im_end|>\n<|im_start|>user\none<|im_end|>\n"
        "<|im_start|>assistant\ntwo<|im_end|>\n<|im_start|>user\nthree<|im_end|>\n"
    )
    assert gen.prefix_hint == len(ids(turns))
    assert gen.prompt_ids == ids(turns + "<|im_start|>assistant\n")


async def test_cache_control_inside_a_message_hints_the_end_of_that_block() -> None:
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "first block", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "second block"},
            ],
        }
    ]
    gen, _ = await submitted_hint(body(msgs, system=SYSTEM_TEXT))
    before = f"<|im_start|>system\n{SYSTEM_TEXT}<|im_end|>\n<|im_start|>user\nfirst block"
    assert gen.prefix_hint == len(ids(before))
    assert TOK.decode(gen.prompt_ids[gen.prefix_hint :]).startswith("\nsecond block")


async def test_a_system_breakpoint_wins_over_later_ones_in_messages() -> None:
    """The shared prefix (system) is hinted, not the conversation's latest turn: that stays in
    its slot, and a snapshot of it at every turn would churn the checkpoint memory. Within the
    messages, the earliest breakpoint is the hint."""
    system = [{"type": "text", "text": SYSTEM_TEXT, "cache_control": {"type": "ephemeral"}}]
    msgs = [
        user("one"),
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral"}}]},
    ]
    gen, _ = await submitted_hint(body(msgs, system=system, cache_control={"type": "ephemeral"}))
    assert gen.prefix_hint == len(ids(f"<|im_start|>system\n{SYSTEM_TEXT}<|im_end|>\n"))
    two_marks = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "first block", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "second block", "cache_control": {"type": "ephemeral"}},
            ],
        }
    ]
    gen, _ = await submitted_hint(body(two_marks))
    assert gen.prefix_hint == len(ids("<|im_start|>user\nfirst block"))


async def test_top_level_cache_control_marks_the_last_message() -> None:
    msgs = [user("one"), {"role": "assistant", "content": "two"}, user("three")]
    gen, got = await submitted_hint(body(msgs, cache_control={"type": "ephemeral"}))
    turns = (
        "<|im_start|>user\none<|im_end|>\n<|im_start|>assistant\ntwo<|im_end|>\n"
        "<|im_start|>user\nthree<|im_end|>\n"
    )
    assert gen.prefix_hint == len(ids(turns))
    assert got["usage"]["cache_creation_input_tokens"] == len(ids(turns))


def test_output_config_format_is_the_chat_json_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = msgspec.convert(
        body(
            [user("x")], output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"}
        ),
        MessagesRequest,
    )
    fmt = to_chat(req).chat.response_format
    assert fmt is not None and fmt.type == "json_schema"
    assert fmt.json_schema is not None and fmt.json_schema.schema == schema


async def test_without_cache_control_the_system_prefix_hint_stays_and_nothing_is_created() -> None:
    gen, got = await submitted_hint(body([user("hi")], system=SYSTEM_TEXT))
    assert gen.prefix_hint == len(
        ids(f"<|im_start|>system\n{SYSTEM_TEXT}<|im_end|>\n")
    )  # the chat route's own
    assert got["usage"]["cache_creation_input_tokens"] == 0
    assert got["usage"]["input_tokens"] == len(gen.prompt_ids)


async def test_reused_tokens_are_cache_reads_on_the_real_scheduler() -> None:
    """Over FakeSlotPool and the real scheduler: turn 2 reads turn 1's prompt from the slot."""
    runtime, _ = make_runtime(num_slots=1)
    app = create_app(runtime, serve_config())
    first = body([user("Tell me about slots.")], system=SYSTEM_TEXT, temperature=0, max_tokens=8)
    async with running_app(app) as client:
        r1 = (await client.post("/v1/messages", json=first)).json()
        answer = r1["content"][0]["text"] if r1["content"] else ""
        second = {
            **first,
            "messages": [*first["messages"], {"role": "assistant", "content": answer}, user("More?")],
        }
        r2 = (await client.post("/v1/messages", json=second)).json()
        counted = (
            await client.post(
                "/v1/messages/count_tokens",
                json={"model": MODEL, **{k: second[k] for k in ("messages", "system")}},
            )
        ).json()
    assert r1["usage"]["cache_read_input_tokens"] == 0
    u = r2["usage"]
    prompt1 = r1["usage"]["input_tokens"]
    assert u["cache_read_input_tokens"] >= prompt1  # all of turn 1's prompt was reused
    assert (
        u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
        == counted["input_tokens"]
    )


# ------------------------------------------------------------------ answers


async def test_text_answer_shape_and_stop_reasons() -> None:
    replies = (
        Reply(("Hel", "lo")),
        Reply(("cut",), reason=FinishReason.LENGTH),
        Reply(("up to",), stop_sequence="END"),
    )
    runtime, sched = scripted_runtime(*replies)
    async with running_app(create_app(runtime, serve_config())) as client:
        got = [
            (await client.post("/v1/messages", json=body([user("hi")], stop_sequences=["END"]))).json()
            for _ in replies
        ]
    assert sched.submitted[0].params.stop == ("END",)
    first = got[0]
    assert first["id"].startswith("msg_") and first["type"] == "message" and first["role"] == "assistant"
    assert first["model"] == MODEL
    assert first["content"] == [{"type": "text", "text": "Hello"}]
    assert [g["stop_reason"] for g in got] == ["end_turn", "max_tokens", "stop_sequence"]
    assert [g["stop_sequence"] for g in got] == [None, None, "END"]


async def test_tool_call_text_becomes_a_tool_use_block() -> None:
    pieces = ("Let me check.", CALL_TEXT[:20], CALL_TEXT[20:])
    runtime, _ = scripted_runtime(Reply(pieces), Reply(pieces))
    async with running_app(create_app(runtime, serve_config())) as client:
        with_tools = (await client.post("/v1/messages", json=body([user("w?")], tools=[WEATHER_TOOL]))).json()
        none = await client.post(
            "/v1/messages", json=body([user("w?")], tools=[WEATHER_TOOL], tool_choice={"type": "none"})
        )
    content = with_tools["content"]
    assert content[0] == {"type": "text", "text": "Let me check."}
    assert content[1]["type"] == "tool_use" and content[1]["id"].startswith("toolu_")
    assert content[1]["name"] == "get_weather" and content[1]["input"] == {"city": "Paris"}
    assert with_tools["stop_reason"] == "tool_use"
    # tool_choice none: the output is not parsed
    assert none.json()["content"] == [{"type": "text", "text": "".join(pieces)}]


async def test_stream_event_sequence_with_text_and_a_tool_call() -> None:
    pieces = ("Let me check.", CALL_TEXT[:20], CALL_TEXT[20:])
    runtime, _ = scripted_runtime(Reply(pieces, reused=3))
    async with running_app(create_app(runtime, serve_config())) as client:
        r = await client.post("/v1/messages", json=body([user("w?")], tools=[WEATHER_TOOL], stream=True))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = named_sse_events(r.text)
    names = [n for n, _ in events]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert events[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    assert events[3][1]["delta"] == {"type": "text_delta", "text": "Let me check."}
    tool = events[5][1]["content_block"]
    assert events[5][1]["index"] == 1 and tool["type"] == "tool_use" and tool["name"] == "get_weather"
    assert tool["input"] == {}
    assert events[6][1]["delta"]["type"] == "input_json_delta"
    assert json.loads(events[6][1]["delta"]["partial_json"]) == {"city": "Paris"}
    delta = events[8][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    prompt = start["usage"]["input_tokens"]  # message_start: the whole prompt, no reuse known yet
    assert delta["usage"] == {
        "input_tokens": prompt - 3,
        "output_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 3,
    }


async def test_stream_error_after_tokens_is_an_error_event() -> None:
    runtime, _ = scripted_runtime(Reply(("par",), reason=FinishReason.ERROR, error="boom"))
    async with running_app(create_app(runtime, serve_config())) as client:
        r = await client.post("/v1/messages", json=body([user("x")], stream=True))
    events = named_sse_events(r.text)
    assert [n for n, _ in events][-2:] == ["content_block_stop", "error"]
    assert events[-1][1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "generation failed: boom"},
    }


async def test_an_engine_failure_is_a_500_api_error() -> None:
    runtime, _ = scripted_runtime(Reply(("x",), reason=FinishReason.ERROR, error="boom"))
    async with running_app(create_app(runtime, serve_config())) as client:
        r = await client.post("/v1/messages", json=body([user("x")]))
    assert "boom" in assert_anthropic_error(r, 500, "api_error")


async def test_count_tokens_counts_the_prompt_the_route_would_prefill() -> None:
    runtime, sched = scripted_runtime(Reply(("x",)))
    req = body([user("how many?")], system=SYSTEM_TEXT, tools=[WEATHER_TOOL])
    async with running_app(create_app(runtime, serve_config())) as client:
        counted = await client.post(
            "/v1/messages/count_tokens", json={k: v for k, v in req.items() if k != "max_tokens"}
        )
        await client.post("/v1/messages", json=req)
    assert counted.json() == {"input_tokens": len(sched.submitted[0].prompt_ids)}


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "patch, words",
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "images"),
        ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "documents"),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]}]},
            "redacted thinking",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "hm"}]}]},
            "assistant turns",
        ),
        ({"thinking": {"type": "sometimes"}}, "thinking"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
        ({"messages": [{"role": "system", "content": "x"}]}, "role"),
        ({"temperature": 1.5}, "temperature"),
        ({"max_tokens": 100000}, "max_tokens"),
        ({"tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
        ({"stop_sequences": [""]}, "stop_sequences"),  # chat_plan's error, this API's name
        ({"messages": [{"role": "user", "content": []}]}, "messages"),  # no message with content
    ],
)
async def test_bad_requests_are_400_invalid_request_error(patch: dict[str, Any], words: str) -> None:
    runtime, sched = scripted_runtime()
    req = {**body([user("x")]), **patch}
    req = {k: v for k, v in req.items() if v is not None}
    async with running_app(create_app(runtime, serve_config())) as client:
        r = await client.post("/v1/messages", json=req)
    assert words in assert_anthropic_error(r, 400, "invalid_request_error")
    assert sched.submitted == []


async def test_auth_model_size_and_admission_errors_use_anthropic_codes() -> None:
    runtime, sched = scripted_runtime()
    app = create_app(runtime, serve_config(api_key="k", max_body_bytes=4096))
    ok_key = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    async with running_app(app) as client:
        no_key = await client.post("/v1/messages", json=body([user("x")]))
        bad_key = await client.post("/v1/messages", json=body([user("x")]), headers={"x-api-key": "no"})
        bad_model = await client.post(
            "/v1/messages", json={**body([user("x")]), "model": "claude-x"}, headers=ok_key
        )
        big = await client.post("/v1/messages", json=body([user("z" * 5000)]), headers=ok_key)
        not_json = await client.post(
            "/v1/messages", content=b"{}", headers={**ok_key, "content-type": "text/plain"}
        )
        sched.admission_error = QueueFull(2.0)
        busy = await client.post("/v1/messages", json=body([user("x")]), headers=ok_key)
        sched.admission_error = PromptTooLong("prompt has 600 tokens but a slot holds 512")
        too_long = await client.post("/v1/messages", json=body([user("x")]), headers=ok_key)
        sched.admission_error = Draining()
        draining = await client.post("/v1/messages", json=body([user("x")]), headers=ok_key)
        counted = await client.post(
            "/v1/messages/count_tokens", json={"model": MODEL, "messages": [user("x")]}
        )
    assert_anthropic_error(no_key, 401, "authentication_error")
    assert_anthropic_error(bad_key, 401, "authentication_error")
    assert_anthropic_error(counted, 401, "authentication_error")
    assert "claude-x" in assert_anthropic_error(bad_model, 404, "not_found_error")
    assert_anthropic_error(big, 413, "request_too_large")
    assert_anthropic_error(not_json, 415, "invalid_request_error")
    assert_anthropic_error(busy, 429, "rate_limit_error")
    assert busy.headers["retry-after"] == "2"
    assert_anthropic_error(draining, 529, "overloaded_error")
    # Anthropic's spelling of an over-long prompt (the client compacts on it)
    assert assert_anthropic_error(too_long, 400, "invalid_request_error").startswith("prompt is too long: ")


async def test_disable_parallel_tool_use_keeps_the_first_call() -> None:
    two = CALL_TEXT + "\n" + CALL_TEXT.replace("Paris", "Rome")
    runtime, _ = scripted_runtime(Reply((two,)), Reply((two,)), Reply((two,)))
    choice = {"type": "auto", "disable_parallel_tool_use": True}
    async with running_app(create_app(runtime, serve_config())) as client:
        both = (await client.post("/v1/messages", json=body([user("w?")], tools=[WEATHER_TOOL]))).json()
        one = (
            await client.post(
                "/v1/messages", json=body([user("w?")], tools=[WEATHER_TOOL], tool_choice=choice)
            )
        ).json()
        streamed = await client.post(
            "/v1/messages", json=body([user("w?")], tools=[WEATHER_TOOL], tool_choice=choice, stream=True)
        )
    assert [b["input"]["city"] for b in both["content"]] == ["Paris", "Rome"]
    assert [b["input"]["city"] for b in one["content"]] == ["Paris"]
    starts = [d for n, d in named_sse_events(streamed.text) if n == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["tool_use"]


async def test_streamed_text_equals_the_message_text_also_with_trailing_whitespace() -> None:
    pieces = ("Hello", " ", "world", "\n\n")
    runtime, _ = scripted_runtime(Reply(pieces), Reply(pieces))
    async with running_app(create_app(runtime, serve_config())) as client:
        whole = (await client.post("/v1/messages", json=body([user("x")]))).json()
        r = await client.post("/v1/messages", json=body([user("x")], stream=True))
    deltas = [d["delta"]["text"] for n, d in named_sse_events(r.text) if n == "content_block_delta"]
    assert "".join(deltas) == whole["content"][0]["text"] == "Hello world\n\n"


async def test_the_hint_is_captured_as_a_checkpoint_on_the_real_scheduler() -> None:
    """Over FakeSlotPool and the real scheduler: a breakpoint inside a user message becomes a
    HINT capture of exactly the tokens before its end, which a later conversation restores."""
    from types import SimpleNamespace

    from slotserve.scheduler.checkpoint_store import CaptureRule
    from slotserve.scheduler.stats import CheckpointEventKind, NullSink

    class Captures(NullSink):
        def __init__(self) -> None:
            self.seen: list[tuple[Any, int]] = []

        def on_checkpoint(self, e: Any) -> None:
            if e.kind is CheckpointEventKind.CAPTURE:
                self.seen.append((e.rule, e.num_tokens))

    spy = Captures()
    runtime, _ = make_runtime(num_slots=1, metrics=SimpleNamespace(sink=spy))  # type: ignore[arg-type]
    shared = "Here is a long shared document to answer from. " * 2  # > 64 tokens: worth a checkpoint

    def marked(question: str) -> list[dict[str, Any]]:  # no system turn: only the breakpoint hints
        blocks = [{"type": "text", "text": shared, "cache_control": {"type": "ephemeral"}}]
        return [{"role": "user", "content": [*blocks, {"type": "text", "text": question}]}]

    offset = len(ids(f"<|im_start|>user\n{shared}"))
    async with running_app(create_app(runtime, serve_config())) as client:
        first = await client.post("/v1/messages", json=body(marked("Q1?"), temperature=0, max_tokens=4))
        other = await client.post("/v1/messages", json=body([user("b")], temperature=0, max_tokens=4))
        again = await client.post("/v1/messages", json=body(marked("Q2?"), temperature=0, max_tokens=4))
    assert first.status_code == other.status_code == again.status_code == 200
    assert (CaptureRule.HINT, offset) in spy.seen
    assert first.json()["usage"]["cache_creation_input_tokens"] == offset
    # the slot went to the other conversation: the third request restores a checkpoint
    assert again.json()["usage"]["cache_read_input_tokens"] >= offset


async def test_a_claude_code_shaped_request_is_served() -> None:
    """The shape Claude Code sends: system blocks with cache_control, many tools with full JSON
    schemas, metadata, a resent history with tool_use / tool_result, streaming, extra fields
    this server ignores (context_management) and the anthropic-version / -beta headers."""
    bash_tool = {
        "name": "Bash",
        "description": "Executes a given bash command.",
        "input_schema": {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
            "required": ["command"],
            "additionalProperties": False,
        },
    }
    req = {
        "model": MODEL,
        "max_tokens": 32,
        "stream": True,
        "temperature": 1,
        "metadata": {"user_id": "user_abc_session_1"},
        "system": [
            {
                "type": "text",
                "text": "You are an interactive CLI tool.",
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": "Environment: linux.", "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [bash_tool, {**bash_tool, "name": "Read"}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                    {"type": "text", "text": "list files"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls"}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": "a.py\nb.py",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            },
        ],
        "context_management": {"edits": []},
    }
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "interleaved-thinking-2025-05-14"}
    runtime, sched = scripted_runtime(Reply(("Two files: a.py and b.py.",)))
    async with running_app(create_app(runtime, serve_config())) as client:
        r = await client.post("/v1/messages", json=req, headers=headers)
    events = named_sse_events(r.text)
    assert [n for n, _ in events][-2:] == ["message_delta", "message_stop"]
    prompt = TOK.decode(sched.submitted[0].prompt_ids)
    assert "You are an interactive CLI tool.\nEnvironment: linux." in prompt
    assert '"name": "Bash"' in prompt and '"name": "Read"' in prompt  # the tools reached the prompt
    assert '{"name": "Bash", "arguments": {"command": "ls"}}' in prompt
    assert "a.py\nb.py" in prompt
    # marks in the system prompt: the hint is the end of the system turn, tools included
    hint = sched.submitted[0].prefix_hint
    assert hint is not None
    hinted = TOK.decode(sched.submitted[0].prompt_ids[:hint])
    assert hinted.startswith("<|im_start|>system\n") and hinted.endswith("</tool_call><|im_end|>\n")
    assert hinted.count("<|im_start|>") == 1 and '"name": "Read"' in hinted
