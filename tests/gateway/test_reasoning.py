"""Thinking split from the answer (gateway/reasoning.py), whole and streamed, and on the chat
completions route: reasoning_content (whole and streamed), reasoning_tokens, --reasoning-format,
a template that opens the block in its prompt, and thinking rendered back by a Qwen3-style
template. The replies are forced (ScriptedScheduler)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gateway_support import (
    MODEL,
    ByteTokenizer,
    Reply,
    named_sse_events,
    running_app,
    scripted_runtime,
    serve_config,
    sse_events,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from slotserve.gateway.app import create_app
from slotserve.gateway.reasoning import (
    ReasoningFormat,
    ReasoningSplitter,
    prompt_opens_thinking,
    split_reasoning,
)
from slotserve.gateway.runtime import load_chat_template

# Qwen3's template in small: thinking of assistant turns after the last user message is
# rendered, earlier turns' is dropped; enable_thinking false closes an empty block in the prompt.
QWEN3_STYLE = (
    "{%- set ns = namespace(last_user=0) -%}"
    "{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "<|im_start|>assistant\n"
    "{%- if m.reasoning_content and loop.index0 > ns.last_user -%}"
    "<think>\n{{ m.reasoning_content.strip() }}\n</think>\n\n"
    "{%- endif -%}"
    "{{ m.content }}<|im_end|>\n"
    "{%- else -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif -%}"
    "{%- endif -%}"
)
R1_STYLE = (  # the DeepSeek-R1 distills open the block in the generation prompt
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}"
)
THOUGHT = "<think>\nThe user asks for France's capital. It is Paris.\n</think>\n\n"


def test_split_whole_replies():
    got = split_reasoning(THOUGHT + "Paris.", opened=False)
    assert (got.reasoning, got.content) == ("\nThe user asks for France's capital. It is Paris.\n", "Paris.")
    assert got.thinking_text == THOUGHT.rstrip()
    assert split_reasoning("Paris. <think>x</think>", opened=False).reasoning is None  # not at the start
    assert split_reasoning("  Paris.", opened=False).content == "  Paris."
    opened = split_reasoning("hmm\n</think>\nParis.", opened=True)
    assert (opened.reasoning, opened.content) == ("hmm\n", "Paris.")
    cut = split_reasoning("<think>still thinking", opened=False)  # max_tokens inside the block
    assert (cut.reasoning, cut.content) == ("still thinking", "")
    legacy = split_reasoning(THOUGHT + "Paris.", opened=False, fmt=ReasoningFormat.DEEPSEEK_LEGACY)
    assert legacy.content == THOUGHT + "Paris." and legacy.reasoning is not None
    assert prompt_opens_thinking("<|assistant|><think>\n") and not prompt_opens_thinking(
        "<think>\n\n</think>\n\n"
    )


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(
        st.sampled_from(["<think>", "</think>", "<th", "ink>", "</", "a", " ", "\n", "<"]), max_size=10
    ),
    cuts=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    opened=st.booleans(),
)
def test_streamed_pieces_join_to_the_whole_split(parts, cuts, opened):
    text = "".join(parts)
    whole = split_reasoning(text, opened=opened)
    s = ReasoningSplitter(opened=opened)
    rs, cs, i, k = [], [], 0, 0
    while i < len(text):
        r, c = s.feed(text[i : i + cuts[k % len(cuts)]])
        rs.append(r)
        cs.append(c)
        i, k = i + cuts[k % len(cuts)], k + 1
    r, c = s.finish()
    assert "".join(cs) + c == whole.content
    assert ("".join(rs) + r if s.thought else None) == whole.reasoning


def _runtime(template: str, *replies: Reply, tmp_path: Path) -> tuple[Any, Any]:
    runtime, sched = scripted_runtime(*replies)
    path = tmp_path / "t.jinja"
    path.write_text(template)

    class Tok:  # what load_chat_template reads of a tokenizer
        token_bytes = [b"<s>", b"</s>"]
        bos_id, eos_id = 0, 1

    chat = load_chat_template(str(path), Tok())
    return type(runtime)(
        **{**runtime.__dict__, "chat": chat, "tool_family": None, "renders_tools": None}
    ), sched


async def _post(runtime: Any, fmt: str = "auto", **body: Any) -> Any:
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "Capital of France?"}], **body}
    async with running_app(create_app(runtime, serve_config(reasoning_format=fmt))) as client:
        return await client.post("/v1/chat/completions", json=payload)


def _pieces(text: str, n: int = 3) -> tuple[str, ...]:
    return tuple(text[i : i + n] for i in range(0, len(text), n))


async def test_reasoning_content_whole_and_streamed(tmp_path: Path) -> None:
    reply = Reply(_pieces(THOUGHT + "Paris.", 1))  # one byte a token, as the byte tokenizer counts
    runtime, _ = _runtime(QWEN3_STYLE, reply, reply, tmp_path=tmp_path)
    body = (await _post(runtime)).json()
    msg = body["choices"][0]["message"]
    assert (
        msg["content"] == "Paris."
        and msg["reasoning_content"].strip() == "The user asks for France's capital. It is Paris."
    )
    thinking_tokens = len(ByteTokenizer().encode(THOUGHT.rstrip()))  # the block, tags included
    assert thinking_tokens < body["usage"]["completion_tokens"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == thinking_tokens
    r = await _post(runtime, stream=True, stream_options={"include_usage": True})
    chunks = [c for c in sse_events(r.text)[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == (msg["reasoning_content"], "Paris.")
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert not any(d.get("reasoning_content") for d in deltas[first_content:])  # thinking first
    assert chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == thinking_tokens


async def test_a_reply_without_thinking_has_no_reasoning_fields(tmp_path: Path) -> None:
    runtime, _ = _runtime(QWEN3_STYLE, Reply(("Paris.",)), tmp_path=tmp_path)
    body = (await _post(runtime)).json()
    assert "reasoning_content" not in body["choices"][0]["message"]
    assert "completion_tokens_details" not in body["usage"]


@pytest.mark.parametrize(
    "fmt,content,reasoning",
    [
        ("none", THOUGHT + "Paris.", None),
        ("deepseek", "Paris.", "\nThe user asks for France's capital. It is Paris.\n"),
        ("deepseek-legacy", THOUGHT + "Paris.", "\nThe user asks for France's capital. It is Paris.\n"),
    ],
)
async def test_reasoning_format(tmp_path: Path, fmt: str, content: str, reasoning: str | None) -> None:
    runtime, _ = _runtime(QWEN3_STYLE, Reply(_pieces(THOUGHT + "Paris.")), tmp_path=tmp_path)
    msg = (await _post(runtime, fmt)).json()["choices"][0]["message"]
    assert msg["content"] == content and msg.get("reasoning_content") == reasoning


async def test_a_template_that_opens_the_block_in_the_prompt(tmp_path: Path) -> None:
    runtime, sched = _runtime(
        R1_STYLE, Reply(_pieces("France... Paris.\n</think>\n\nParis.")), tmp_path=tmp_path
    )
    msg = (await _post(runtime)).json()["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == ("France... Paris.\n", "Paris.")
    assert runtime.decode(sched.submitted[0].prompt_ids).endswith("<|assistant|><think>\n")


async def test_thinking_then_a_tool_call(tmp_path: Path) -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    runtime, _ = _runtime(
        QWEN3_STYLE, Reply(_pieces("<think>I need the weather.</think>\n\n" + call)), tmp_path=tmp_path
    )
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    choice = (await _post(runtime, tools=tools)).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["reasoning_content"] == "I need the weather."
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


async def test_thinking_of_the_current_turn_renders_back_earlier_turns_drop_it(tmp_path: Path) -> None:
    runtime, sched = _runtime(QWEN3_STYLE, Reply(("ok",)), Reply(("ok",)), tmp_path=tmp_path)
    turn = [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "It is Paris."},
    ]
    await _post(runtime, messages=turn)  # the assistant turn is the last: its thinking renders
    await _post(runtime, messages=[*turn, {"role": "user", "content": "And Italy?"}])
    first, second = (runtime.decode(g.prompt_ids) for g in sched.submitted)
    assert "<think>\nIt is Paris.\n</think>" in first
    assert "<think>" not in second and "Paris.<|im_end|>" in second


# ------------------------------------------------------------------ /v1/messages


async def _messages(runtime: Any, **body: Any) -> Any:
    payload = {
        "model": MODEL,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Capital of France?"}],
    }
    async with running_app(create_app(runtime, serve_config())) as client:
        return await client.post("/v1/messages", json={**payload, **body})


async def test_messages_thinking_blocks_whole_and_streamed(tmp_path: Path) -> None:
    reply = Reply(_pieces(THOUGHT + "Paris."))
    runtime, _ = _runtime(QWEN3_STYLE, reply, reply, tmp_path=tmp_path)
    whole = (await _messages(runtime, thinking={"type": "enabled", "budget_tokens": 1024})).json()
    thinking, text = whole["content"]
    assert thinking == {
        "type": "thinking",
        "thinking": split_reasoning(THOUGHT, opened=False).reasoning,
        "signature": "",
    }
    assert text == {"type": "text", "text": "Paris."}
    events = named_sse_events((await _messages(runtime, stream=True)).text)
    starts = [e["content_block"]["type"] for n, e in events if n == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [e["delta"] for n, e in events if n == "content_block_delta"]
    assert (
        "".join(d.get("thinking", "") for d in deltas if d["type"] == "thinking_delta")
        == thinking["thinking"]
    )
    assert "".join(d.get("text", "") for d in deltas if d["type"] == "text_delta") == "Paris."
    first_text = next(i for i, d in enumerate(deltas) if d["type"] == "text_delta")
    assert all(d["type"] == "text_delta" for d in deltas[first_text:])


async def test_messages_replayed_thinking_reaches_the_template(tmp_path: Path) -> None:
    runtime, sched = _runtime(QWEN3_STYLE, Reply(("ok",)), tmp_path=tmp_path)
    turns = [
        {"role": "user", "content": "Capital of France?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "It is Paris.", "signature": "sig"},
                {"type": "text", "text": "Paris."},
            ],
        },
    ]
    r = await _messages(runtime, messages=turns)
    assert r.status_code == 200, r.text
    assert "<think>\nIt is Paris.\n</think>" in runtime.decode(sched.submitted[0].prompt_ids)


# ------------------------------------------------------------------ /v1/responses


async def _responses(runtime: Any, **body: Any) -> Any:
    async with running_app(create_app(runtime, serve_config())) as client:
        return await client.post(
            "/v1/responses", json={"model": MODEL, "input": "Capital of France?", **body}
        )


async def test_responses_reasoning_item_whole_and_streamed(tmp_path: Path) -> None:
    reply = Reply(_pieces(THOUGHT + "Paris.", 1))
    runtime, _ = _runtime(QWEN3_STYLE, reply, reply, tmp_path=tmp_path)
    whole = (await _responses(runtime)).json()
    reasoning, message = whole["output"]
    thought = split_reasoning(THOUGHT, opened=False).reasoning
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    assert (
        reasoning["content"] == [{"type": "reasoning_text", "text": thought}] and reasoning["summary"] == []
    )
    assert message["type"] == "message" and message["content"][0]["text"] == "Paris."
    thinking_tokens = len(ByteTokenizer().encode(THOUGHT.rstrip()))
    assert whole["usage"]["output_tokens_details"] == {"reasoning_tokens": thinking_tokens}
    events = named_sse_events((await _responses(runtime, stream=True)).text)
    names = [n for n, _ in events]
    assert "".join(e["delta"] for n, e in events if n == "response.reasoning_text.delta") == thought
    assert names.index("response.reasoning_text.done") < names.index("response.output_text.delta")
    final = events[-1][1]["response"]
    assert [o["type"] for o in final["output"]] == ["reasoning", "message"]
    assert final["usage"]["output_tokens_details"] == {"reasoning_tokens": thinking_tokens}


async def test_responses_accepts_replayed_reasoning_items(tmp_path: Path) -> None:
    """Codex CLI's replay: each turn resends its reasoning items before the calls they led to."""
    runtime, sched = _runtime(QWEN3_STYLE, Reply(("It is sunny.",)), tmp_path=tmp_path)
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Call it."}],
        },
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    r = await _responses(runtime, input=items)
    assert r.status_code == 200, r.text
    assert "<think>\nCall it.\n</think>" in runtime.decode(sched.submitted[0].prompt_ids)


def test_no_lazy_tool_grammar_for_a_thinking_template_or_a_special_marker():
    from types import SimpleNamespace

    from slotserve.gateway.tool_calls import ToolCallFamily
    from slotserve.gateway.translate import _lazy_tool_grammar

    class Grammars:
        special = False

        def is_special(self, text: str) -> bool:
            return self.special

        def lazy_tool_calls(self, tools: Any, *, parallel: bool, tag: bool) -> str:
            return "lazy"

    g = Grammars()
    plain = SimpleNamespace(grammars=g, chat=SimpleNamespace(source="<|im_start|>{{ m.content }}"))
    thinking = SimpleNamespace(grammars=g, chat=SimpleNamespace(source=QWEN3_STYLE))
    H = ToolCallFamily.HERMES
    assert _lazy_tool_grammar(plain, H, [], True) == "lazy"  # type: ignore[arg-type]
    assert _lazy_tool_grammar(thinking, H, [], True) is None  # type: ignore[arg-type]
    assert _lazy_tool_grammar(plain, ToolCallFamily.LLAMA3, [], True) is None  # type: ignore[arg-type]
    g.special = True
    assert _lazy_tool_grammar(plain, H, [], True) is None  # type: ignore[arg-type]
