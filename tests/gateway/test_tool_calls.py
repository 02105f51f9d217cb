"""Tool-call parsing per template family, whole and streamed (gateway/tool_calls.py)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slotserve.gateway.tool_calls import (
    ToolCallFamily,
    family_for_template,
    hermes_shim,
    parse_tool_calls,
)
from slotserve.gateway.tool_stream import StreamingToolParser

H, L, M = ToolCallFamily.HERMES, ToolCallFamily.LLAMA3, ToolCallFamily.MISTRAL


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def test_hermes_two_calls_and_content():
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    out = parse_tool_calls(text, H, new_id=ids())
    assert out.content == "Let me check."
    assert [(c.id, c.name, c.arguments) for c in out.tool_calls] == [
        ("call_0", "get_weather", '{"city":"Paris"}'),
        ("call_1", "get_time", "{}"),
    ]


def test_hermes_unclosed_last_call_and_string_arguments():
    out = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}', H)
    assert out.content is None and out.tool_calls[0].arguments == '{"x":1}'


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
    ],
)
def test_hermes_invalid_calls_stay_content(text):
    out = parse_tool_calls(text, H, tool_names={"f"})
    assert out.tool_calls == () and out.content == text


def test_llama3_forms():
    out = parse_tool_calls(
        '<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}', L
    )
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("f", '{"a":1}'), ("g", "{}")]
    prose = parse_tool_calls("The answer is {1, 2}.", L)
    assert prose.tool_calls == () and prose.content == "The answer is {1, 2}."


def test_mistral_array():
    out = parse_tool_calls('ok [TOOL_CALLS][{"name": "f", "arguments": {"q": "x"}}]', M)
    assert out.content == "ok" and out.tool_calls[0].arguments == '{"q":"x"}'


BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.mark.parametrize("family", list(ToolCallFamily))
@pytest.mark.parametrize(
    "text,content",
    [
        (BARE, None),  # Qwen2.5-Coder-0.5B's answer with tools offered
        ("```json\n" + BARE.replace(", ", ",\n  ") + "\n```", None),  # llama.cpp's, fenced
        ("I will look it up.\n```json\n" + BARE + "\n```\nOne moment.", "I will look it up.\nOne moment."),
        ("[" + BARE + ", " + BARE + "]", None),
        ("```\n[" + BARE + "]\n```", None),
    ],
)
def test_bare_and_fenced_json_calls_of_offered_tools(family, text, content):
    out = parse_tool_calls(text, family, tool_names={"get_weather"}, new_id=ids())
    assert out.content == content
    assert out.tool_calls and all(
        (c.name, c.arguments) == ("get_weather", '{"city":"Paris"}') for c in out.tool_calls
    )


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "add_numbers", "arguments": {"a": 1}}',  # a function nobody offered
        '```json\n{"name": "get_weather", "arguments": [1]}\n```',
        'The JSON {"name": "get_weather"} is not a call.',
        'function f() { return {"a": 1}; }',
    ],
)
def test_json_that_is_no_call_of_an_offered_tool_stays_content(text):
    for family in ToolCallFamily:
        out = parse_tool_calls(text, family, tool_names={"get_weather"})
        assert out.tool_calls == () and out.content == text


def test_streamed_call_goes_out_as_openai_sends_it():
    """Fed a token at a time: the header (id, name, empty arguments) as soon as the arguments
    open, then fragments as they arrive; no content at all, not even the newline between calls."""
    text = (
        "<tool_call>\n"
        + BARE
        + "\n</tool_call>\n<tool_call>\n"
        + BARE.replace("Paris", "Rome")
        + "\n</tool_call>"
    )
    parser = StreamingToolParser(H, tool_names={"get_weather"}, new_id=ids())
    content, events = [], []
    for i in range(0, len(text), 3):
        c, d = parser.feed(text[i : i + 3])
        content.append(c)
        events.append(d)
    c, d = parser.finish()
    content.append(c)
    events.append(d)
    assert "".join(content) == ""
    deltas = [dl for ev in events for dl in ev]
    headers = [dl for dl in deltas if dl.id is not None]
    assert [(h.index, h.id, h.name, h.arguments) for h in headers] == [
        (0, "call_0", "get_weather", ""),
        (1, "call_1", "get_weather", ""),
    ]
    frags = [dl for dl in deltas if dl.id is None]
    assert all(dl.name is None and dl.arguments for dl in frags)
    assert len([dl for dl in frags if dl.index == 0]) > 3  # streamed as generated, not at the end
    assert "".join(dl.arguments for dl in frags if dl.index == 1) == '{"city": "Rome"}'
    # the header came out in the feed that completed `"arguments": {`, before the arguments' end
    first = next(i for i, ev in enumerate(events) if any(dl.id for dl in ev))
    assert text[: 3 * (first + 1)].endswith(('"arguments": {', '"arguments": {"', '"arguments": {"c'))


def test_family_for_template():
    assert family_for_template("{% if tools %}<tool_call>{% endif %}") == (H, True)
    assert family_for_template("<|im_start|>{{ m.content }}") == (H, False)
    assert family_for_template("<|start_header_id|>{% if tools %}<|python_tag|>{% endif %}")[0] is L
    assert family_for_template("[TOOL_CALLS]{{ tools }}")[0] is M
    assert family_for_template(None) == (H, False)


CASES = [
    (H, 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": "<b>"}}\n</tool_call>\nDone <tool'),
    (
        H,
        '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call><tool_call>{"name": "f", "arguments": {}}',
    ),
    (H, "no calls here, only a < sign and <tool_c"),
    (L, '  {"name": "f", "parameters": {"a": [1, 2]}}'),
    (L, "Plain prose {with braces}"),
    (M, 'x[TOOL_CALLS][{"name": "f", "arguments": {"k": true}}]'),
    (H, "<tool_call>{broken</tool_call> tail"),
    (H, 'Hi <tool_call>{"name": "f", "arguments": {"a": [1, {"b": "}'),  # cut by max_tokens
]


def _streamed_content(content: str, parser: StreamingToolParser) -> str | None:
    """What a whole reply's content is for a stream: a call cut by the end is content there."""
    if parser.cut_text:
        content = f"{content.rstrip()}\n{parser.cut_text}" if content.strip() else parser.cut_text
    return content.strip() or None


@pytest.mark.parametrize("family,text", CASES)
@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_streaming_matches_whole_parse(family, text, step):
    whole = parse_tool_calls(text, family, tool_names={"f"}, new_id=ids())
    parser = StreamingToolParser(family, tool_names={"f"}, new_id=ids())
    content, deltas = [], []
    for i in range(0, len(text), step):
        c, d = parser.feed(text[i : i + step])
        content.append(c)
        deltas.extend(d)
    c, d = parser.finish()
    content.append(c)
    deltas.extend(d)
    assert _streamed_content("".join(content), parser) == whole.content
    assert tuple(parser.tool_calls) == whole.tool_calls
    # deltas rebuild the calls the way an OpenAI client accumulates them
    rebuilt: dict[int, dict] = {}
    for dl in deltas:
        slot = rebuilt.setdefault(dl.index, {"id": None, "name": None, "arguments": ""})
        slot["id"] = slot["id"] or dl.id
        slot["name"] = slot["name"] or dl.name
        slot["arguments"] += dl.arguments
    # (fragments are the text the model wrote: the same JSON value as the compact arguments)
    # (a call cut by the end streamed its start: it is not among the calls)
    kept = [v for i, v in sorted(rebuilt.items()) if i < len(whole.tool_calls)]
    assert len(rebuilt) - len(kept) == (1 if parser.cut_text else 0)
    assert [(v["id"], v["name"], json.loads(v["arguments"])) for v in kept] == [
        (c.id, c.name, json.loads(c.arguments)) for c in whole.tool_calls
    ]


def test_hermes_shim_renders_calls_results_and_tools_stably():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    turn1 = [{"role": "user", "content": "hi"}]
    call = {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    turn2 = turn1 + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": "42"},
    ]
    r1, r2 = hermes_shim(turn1, tools), hermes_shim(turn2, tools)
    assert r2[: len(r1)] == r1  # the resent conversation keeps its prefix
    assert r1[0]["role"] == "system" and json.dumps(tools[0]) in r1[0]["content"]
    assert r2[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
    }
    assert r2[3] == {"role": "tool", "content": "<tool_response>\n42\n</tool_response>"}
    parsed = parse_tool_calls(r2[2]["content"], H)
    assert parsed.tool_calls[0].name == "f"


PIECES = [
    "<tool_call>",
    "</tool_call>",
    '{"name": "f", "arguments": {"a": 1}}',
    '{"name": "g", "parameters": {}}',
    '{"name": "f"',
    "[TOOL_CALLS]",
    '[{"name": "f", "arguments": {}}]',
    "<|python_tag|>",
    "```json\n",
    "```",
    "]",
    "text ",
    "<",
    "{",
    "}",
    "\n",
    " ",
    ";",
]


@settings(max_examples=300, deadline=None)
@given(
    family=st.sampled_from(list(ToolCallFamily)),
    parts=st.lists(st.sampled_from(PIECES), max_size=10),
    cuts=st.lists(st.integers(1, 9), min_size=1, max_size=5),
)
def test_streaming_equals_whole_parse_on_random_texts(family, parts, cuts):
    text = "".join(parts)
    whole = parse_tool_calls(text, family, tool_names={"f", "g"}, new_id=ids())
    parser = StreamingToolParser(family, tool_names={"f", "g"}, new_id=ids())
    out, i, k = [], 0, 0
    while i < len(text):
        step = cuts[k % len(cuts)]
        out.append(parser.feed(text[i : i + step])[0])
        i, k = i + step, k + 1
    out.append(parser.finish()[0])
    assert _streamed_content("".join(out), parser) == whole.content
    assert tuple(parser.tool_calls) == whole.tool_calls


@pytest.mark.parametrize(
    "text",
    [
        '<|python_tag|>[{"name": "f", "arguments": {}}]',
        ' <|python_tag|>; {"name": "g", "parameters": {}}',
    ],
)
def test_llama3_text_after_the_tag_parses_alike_whole_and_streamed(text):
    # the streaming parser commits to calls at the tag; the whole-text parse must agree
    whole = parse_tool_calls(text, ToolCallFamily.LLAMA3, tool_names={"f", "g"}, new_id=ids())
    parser = StreamingToolParser(ToolCallFamily.LLAMA3, tool_names={"f", "g"}, new_id=ids())
    streamed = "".join(parser.feed(text[i : i + 4])[0] for i in range(0, len(text), 4)) + parser.finish()[0]
    assert whole.content is None and streamed.strip() == ""
    assert [c.name for c in whole.tool_calls] == [c.name for c in parser.tool_calls] != []


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet='{}[]"\\ab:,', max_size=40),
    cuts=st.lists(st.integers(1, 6), min_size=1, max_size=4),
)
def test_json_extent_found_incrementally_as_in_one_pass(text, cuts):
    """The scanner reads each call's text once (arguments streamed token by token stay linear):
    advancing over the text as it grows finds the same end as one pass over the whole."""
    from slotserve.gateway.tool_stream import _json_end, _JsonEnd

    text = "{" + text
    scan, i, k, got = _JsonEnd(0), 0, 0, None
    while i < len(text) and got is None:
        i += cuts[k % len(cuts)]
        k += 1
        got = scan.advance(text[:i])
    assert got == _json_end(text, 0)
