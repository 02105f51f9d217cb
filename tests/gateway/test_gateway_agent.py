"""Chat completions for agents over ASGI with exact scripted replies: tool calls parsed whole and
streamed, finish_reason tool_calls, tool_choice none, parallel_tool_calls false, n choices with
per-choice seeds and usage counted once, and --chat-template loading."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from gateway_support import (
    MODEL,
    Reply,
    make_runtime,
    running_app,
    scripted_runtime,
    serve_config,
    sse_events,
)
from slotserve.gateway.app import create_app
from slotserve.gateway.runtime import load_chat_template
from slotserve.gateway.tool_calls import ToolCallFamily
from slotserve.scheduler.request import FinishReason

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL_TEXT = (
    "I'll check. <tool",
    '_call>\n{"name": "get_weather", ',
    '"arguments": {"city": "Paris"}}\n</tool_call>',
)


def body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}], **extra}


async def post(runtime: Any, payload: dict[str, Any]) -> Any:
    async with running_app(create_app(runtime, serve_config())) as client:
        return await client.post("/v1/chat/completions", json=payload)


async def test_tool_call_parsed_into_message_tool_calls() -> None:
    runtime, sched = scripted_runtime(Reply(CALL_TEXT))
    r = await post(runtime, body(tools=TOOLS))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "I'll check."
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    # the template got the tools (the ChatML stand-in renders no tools: the Hermes shim did)
    prompt = runtime.decode(sched.submitted[0].prompt_ids)
    assert "<tools>" in prompt and '"get_weather"' in prompt


async def test_tool_call_streamed_as_openai_deltas() -> None:
    runtime, _ = scripted_runtime(Reply(CALL_TEXT))
    r = await post(runtime, body(tools=TOOLS, stream=True))
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert content == "I'll check."  # the blank before the call is not sent
    # OpenAI's shape: one call entry per chunk, no content once the call started
    first_call = next(i for i, c in enumerate(chunks) if c["choices"][0]["delta"].get("tool_calls"))
    assert all(len(c["choices"][0]["delta"].get("tool_calls") or []) <= 1 for c in chunks)
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks[first_call:])
    deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls") or []]
    assert deltas[0]["index"] == 0 and deltas[0]["id"].startswith("call_") and deltas[0]["type"] == "function"
    assert deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert all("id" not in d and "name" not in d["function"] for d in deltas[1:])
    args = "".join(d["function"].get("arguments", "") for d in deltas)
    assert json.loads(args) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_tool_choice_none_leaves_the_text_alone() -> None:
    runtime, _ = scripted_runtime(Reply(CALL_TEXT))
    r = await post(runtime, body(tools=TOOLS, tool_choice="none"))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == "".join(CALL_TEXT)


async def test_parallel_tool_calls_false_keeps_one_call() -> None:
    two = '<tool_call>{"name": "get_weather", "arguments": {"city": "A"}}</tool_call>' * 2
    runtime, _ = scripted_runtime(Reply((two,)))
    r = await post(runtime, body(tools=TOOLS, parallel_tool_calls=False))
    assert len(r.json()["choices"][0]["message"]["tool_calls"]) == 1


async def test_tool_results_render_back_through_the_template() -> None:
    runtime, sched = scripted_runtime(Reply(("It is sunny.",)))
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = await post(runtime, {"model": MODEL, "messages": messages, "tools": TOOLS})
    assert r.json()["choices"][0]["message"]["content"] == "It is sunny."
    prompt = runtime.decode(sched.submitted[0].prompt_ids)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<|im_start|>tool\n<tool_response>\nsunny\n</tool_response><|im_end|>" in prompt


async def test_n_choices_seeds_and_usage_counted_once() -> None:
    runtime, sched = scripted_runtime(Reply(("a", "b")), Reply(("c",)), Reply(("d", "e", "f")))
    runtime.num_slots = 3
    r = await post(runtime, body(n=3, seed=41))
    got = r.json()
    assert [c["message"]["content"] for c in got["choices"]] == ["ab", "c", "def"]
    assert [c["index"] for c in got["choices"]] == [0, 1, 2]
    assert [g.params.seed for g in sched.submitted] == [41, 42, 43]
    assert len({tuple(g.prompt_ids) for g in sched.submitted}) == 1
    prompt_len = len(sched.submitted[0].prompt_ids)
    assert got["usage"] == {
        "prompt_tokens": prompt_len,
        "completion_tokens": 6,
        "total_tokens": prompt_len + 6,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_n_choices_streamed_with_indexes_and_one_usage_chunk() -> None:
    runtime, _ = scripted_runtime(Reply(("a", "b")), Reply(("c",)))
    runtime.num_slots = 2
    r = await post(runtime, body(n=2, stream=True, stream_options={"include_usage": True}))
    chunks = sse_events(r.text)[:-1]
    text = {0: "", 1: ""}
    finishes = {}
    for c in chunks:
        for ch in c["choices"]:
            text[ch["index"]] += ch["delta"].get("content") or ""
            if ch["finish_reason"]:
                finishes[ch["index"]] = ch["finish_reason"]
    assert text == {0: "ab", 1: "c"} and finishes == {0: "stop", 1: "stop"}
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens"] == 3
    assert chunks[-1]["usage"] == usage[0]  # after every choice finished


async def test_n_over_the_fake_engine_prefills_once() -> None:
    """The real scheduler: n=3 choices share one prefill (WAIT_SHARED then COPY of L-1 rows)."""
    runtime, pool = make_runtime(num_slots=3)
    items: list[tuple[int, int]] = []  # (start_pos, num_tokens) of every batch item fed
    pool.forward_hook = lambda batch: items.extend((it.start_pos, len(it.tokens)) for it in batch)
    r = await post(runtime, body(n=3, max_tokens=4, temperature=1.0, seed=5))
    got = r.json()
    assert len(got["choices"]) == 3
    prompt = got["usage"]["prompt_tokens"]
    # prompt positions computed: the whole prompt once, then 1 (the last) per fork
    computed = sum(max(0, min(start + n, prompt) - start) for start, n in items)
    assert computed == prompt + 2, (computed, prompt, items)


def test_load_chat_template_and_its_tool_family(tmp_path: Path) -> None:
    class Tok:
        token_bytes = [b"<s>", b"</s>"]
        bos_id, eos_id = 0, 1

    path = tmp_path / "t.jinja"
    path.write_text(
        "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}<tool_call>{% endif %}"
    )
    tpl = load_chat_template(str(path), Tok())
    assert tpl.render([{"role": "user", "content": "hi"}]) == "<s>hi"
    runtime, _ = scripted_runtime()
    runtime = type(runtime)(**{**runtime.__dict__, "chat": tpl, "tool_family": None, "renders_tools": None})
    assert runtime.tool_family is ToolCallFamily.HERMES and runtime.renders_tools is True
    with pytest.raises(ValueError, match="--chat-template"):
        load_chat_template(str(tmp_path / "missing.jinja"), Tok())
    (tmp_path / "bad.jinja").write_text("{% for %}")
    with pytest.raises(ValueError, match="--chat-template"):
        load_chat_template(str(tmp_path / "bad.jinja"), Tok())


async def test_n_choices_wait_for_busy_slots_and_all_finish() -> None:
    """2 slots, one held by a long request: n=2 gets one slot at first, the second choice waits
    (first for the shared prefill, then for a slot) and both finish: no deadlock."""
    runtime, pool = make_runtime(num_slots=2)
    pool.forward_hook = lambda batch: time.sleep(0.005)  # the long request runs ~0.3 s
    app = create_app(runtime, serve_config())
    async with running_app(app) as client:
        long = asyncio.create_task(
            client.post("/v1/chat/completions", json=body(max_tokens=60, ignore_eos=True, temperature=0))
        )
        await asyncio.sleep(0.05)
        r = await client.post("/v1/chat/completions", json=body(n=2, max_tokens=5, temperature=0))
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 2
        assert not long.done()  # the choices shared the one free slot while it ran
        assert (await long).status_code == 200


async def test_n_choices_refused_by_a_full_queue_cancel_the_submitted_ones() -> None:
    runtime, _ = make_runtime(num_slots=3, max_queue=1)
    app = create_app(runtime, serve_config())
    async with running_app(app) as client:
        r = await client.post("/v1/chat/completions", json=body(n=3, max_tokens=5))
        assert r.status_code == 429, r.text
    stats = runtime.scheduler.stats()
    assert stats.queue_depth == 0 and not runtime.scheduler.slots()[0].request_id  # nothing left behind


@pytest.mark.parametrize("stream", [False, True])
async def test_bare_json_call_cut_by_max_tokens_is_no_call(stream: bool) -> None:
    """A bare JSON call (what small models write) is a call; cut short by max_tokens it is none:
    `length`, its text the content of a whole reply (a stream sent its header and fragments)."""
    whole = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    cut = '{"name": "get_weather", "arguments": {"city": "Par'
    cases = (
        (whole, FinishReason.STOP, "tool_calls", 1),
        (cut, FinishReason.LENGTH, "length", 0),
        (whole + "\n" + cut, FinishReason.LENGTH, "tool_calls", 1),  # the complete one counts
    )
    for text, finish, reason, n_calls in cases:
        runtime, _ = scripted_runtime(Reply((text[:20], text[20:]), reason=finish))
        r = await post(runtime, body(tools=TOOLS, stream=stream))
        if stream:
            chunks = sse_events(r.text)[:-1]
            assert chunks[-1]["choices"][0]["finish_reason"] == reason
            calls = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls") or []]
            assert calls[0]["function"] == {"name": "get_weather", "arguments": ""}
            assert not any(c["choices"][0]["delta"].get("content") for c in chunks)
        else:
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == reason
            assert len(choice["message"].get("tool_calls") or []) == n_calls
            assert choice["message"]["content"] == (cut if finish is FinishReason.LENGTH else None)
