"""Constrained decoding (gateway/structured.py) with the default model's tokenizer: schemas and
tool-call grammars accept what they should, refuse what they should, and end with eos."""

from __future__ import annotations

import json

import numpy as np
import pytest
from slotserve.gateway.structured import GrammarCompiler, GrammarError
from slotserve.gateway.tool_calls import ToolCallFamily, parse_tool_calls

pytestmark = pytest.mark.real_model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    },
]


@pytest.fixture(scope="module")
def tok(real_model_file):
    from slotserve.engine_ext.tokenizer import Tokenizer

    return Tokenizer.from_model_file(real_model_file)


@pytest.fixture(scope="module")
def compiler(tok):
    c = GrammarCompiler.for_tokenizer(tok)
    yield c
    c.close()


def walk(grammar, tok, text: str) -> tuple[bool, np.ndarray]:
    """Feed `text`'s tokens through a fresh sequence, checking each is allowed first; returns
    (all allowed, the mask after them)."""
    seq = grammar.start()
    for t in tok.encode(text):
        if not seq.allowed()[t]:
            return False, seq.allowed()
        seq.accept(t)
    return True, seq.allowed()


def test_json_schema_accepts_valid_refuses_invalid_and_ends_with_eos(compiler, tok):
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    g = compiler.json_schema(schema)
    ok, mask = walk(g, tok, '{"a": 12, "b": "y"}')
    ends = sorted(tok.eos_token_ids | {tok.eos_id})
    assert ok and np.flatnonzero(mask).tolist() == ends  # complete: the end-of-generation ids only
    ok, mask = walk(g, tok, '{"a": 12')
    assert ok and not mask[tok.eos_id]  # incomplete: eos not allowed
    assert not walk(g, tok, '{"a": "12"')[0]  # a string where an integer goes
    assert not walk(g, tok, '{"c": 1')[0]  # an unknown key
    assert not walk(g, tok, '{"a":12')[0]  # the fixed layout: a space after ':'
    assert walk(compiler.json_schema(None), tok, '{"anything": [1, 2]}')[1][tok.eos_id]


def test_bad_schema_is_a_grammar_error(compiler):
    with pytest.raises(GrammarError):
        compiler.json_schema({"type": "object", "properties": {"a": {"type": "strin"}}})


@pytest.mark.parametrize(
    "family,text",
    [
        (
            ToolCallFamily.HERMES,
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        ),
        (ToolCallFamily.LLAMA3, '{"name": "get_time", "parameters": {}}'),
        (ToolCallFamily.MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]'),
    ],
)
def test_tool_call_grammar_per_family_parses_back(compiler, tok, family, text):
    g = compiler.tool_calls(family, TOOLS, parallel=False, allow_text=False)
    ok, mask = walk(g, tok, text)
    assert ok and mask[tok.eos_id]
    assert len(parse_tool_calls(text, family, tool_names={"get_weather", "get_time"}).tool_calls) == 1
    assert not walk(g, tok, text.replace("get_", "set_"))[0]  # a function not offered
    assert not walk(g, tok, "Sure, here you go")[0]  # text where a call is required
    # the fixed JSON layout holds inside calls too: no run of blank space, no missing space
    assert not walk(g, tok, text.replace('": ', '":  ', 1))[0]
    assert not walk(g, tok, text.replace('": ', '":', 1))[0]


def test_hermes_parallel_and_strict_auto(compiler, tok):
    call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    one = compiler.tool_calls(ToolCallFamily.HERMES, TOOLS, parallel=False, allow_text=False)
    ok, mask = walk(one, tok, call)
    assert ok and set(np.flatnonzero(mask).tolist()) == tok.eos_token_ids | {tok.eos_id}  # then only the end
    many = compiler.tool_calls(ToolCallFamily.HERMES, TOOLS, parallel=True, allow_text=False)
    assert walk(many, tok, call + "\n" + call)[1][tok.eos_id]
    auto = compiler.tool_calls(ToolCallFamily.HERMES, TOOLS, parallel=True, allow_text=True)
    assert walk(auto, tok, "The time is noon.")[1][tok.eos_id]  # plain text is allowed
    assert walk(auto, tok, call)[1][tok.eos_id]
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {}}'  # "city" is required
    assert not walk(auto, tok, bad + "\n</tool_call>")[0]


def test_arguments_render_back_as_generated(compiler, tok):
    """The constrained layout equals json.dumps' (the Hermes shim's rendering of a call)."""
    args = {"city": "Paris"}
    text = "<tool_call>\n" + json.dumps({"name": "get_weather", "arguments": args}) + "\n</tool_call>"
    g = compiler.tool_calls(ToolCallFamily.HERMES, TOOLS, parallel=False, allow_text=False)
    assert walk(g, tok, text)[1][tok.eos_id]


@pytest.mark.parametrize(
    "text",
    [
        "The capital of France is Paris.",  # no call: free text, eos allowed at the end
        'Sure. {"name": "get_weather", "arguments": {"city": "Paris"}} Anything after.',
        '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```',
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
        '{"name": "add_numbers", "arguments": {"a": 1}}',  # nobody declared it: left free, text
    ],
)
def test_lazy_tool_grammar_leaves_text_free_and_accepts_calls(compiler, tok, text):
    ok, mask = walk(compiler.lazy_tool_calls(TOOLS, parallel=True), tok, text)
    assert ok and mask[tok.eos_id]


@pytest.mark.parametrize(
    "prefix,refused",
    [
        ('{"name": "get_weather", "arguments": {"city": ', "3"),  # the schema wants a string
        ('{"name": "get_weather", "arguments": {"city": "Paris"}', ', "x": 1'),  # closes the call
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}', " text"),
        ('{"name": "get_time", "arguments": ', "[1]"),  # arguments are an object
        ("Hi. " + '{"name": "get_weather", "arguments": {"city"', ": 1"),  # after text too
    ],
)
def test_lazy_tool_grammar_holds_a_started_call_to_the_schema(compiler, tok, prefix, refused):
    grammar = compiler.lazy_tool_calls(TOOLS, parallel=True)
    ok, _ = walk(grammar, tok, prefix)
    assert ok
    whole, _ = walk(grammar, tok, prefix + refused)
    assert not whole


def test_lazy_tool_grammar_one_call_when_not_parallel(compiler, tok):
    one = '{"name": "get_time", "arguments": {}}'
    grammar = compiler.lazy_tool_calls(TOOLS, parallel=False)
    free = one + " " + '{"name": "get_weather", "arguments": {"city": 1}}'
    assert walk(grammar, tok, free)[0]
    assert not walk(compiler.lazy_tool_calls(TOOLS, parallel=True), tok, free)[0]


def test_special_marker_texts_are_recognised(compiler, tok):
    """A family whose call marker is a special token gets no lazy grammar (its free text could
    not let the token through): the check the gateway makes before building one."""
    assert not compiler.is_special("<tool_call>")  # text in this vocabulary
    eos_text = tok.token_bytes[tok.eos_id].decode()
    assert compiler.is_special(eos_text)
