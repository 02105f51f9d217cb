"""`slotserve bench tools`: its validity check and its stream accumulation (bench/tools.py)."""

from __future__ import annotations

import json

from slotserve.bench.tool_prompts import NEEDS_TOOL, NO_TOOL, TOOLS
from slotserve.bench.tools import _accumulate, args_valid


def test_prompt_sets_name_declared_tools_and_do_not_overlap():
    names = {t["function"]["name"] for t in TOOLS}
    assert {expected for _, expected in NEEDS_TOOL} == names
    assert len(NEEDS_TOOL) >= 40 and len(NO_TOOL) >= 20
    assert not {p for p, _ in NEEDS_TOOL} & set(NO_TOOL)


def test_args_valid_checks_required_keys_and_types():
    assert args_valid("get_weather", '{"city": "Paris"}')
    assert not args_valid("get_weather", '{"town": "Paris"}')
    assert not args_valid("get_weather", '{"city": 3}')
    assert not args_valid("get_weather", '{"city": "Pa')
    assert not args_valid("add_numbers", "{}")
    good = {"amount": 100, "from_currency": "USD", "to_currency": "EUR"}
    assert args_valid("convert_currency", json.dumps(good))
    assert not args_valid("convert_currency", json.dumps({**good, "amount": "100"}))
    assert not args_valid("convert_currency", json.dumps({**good, "amount": True}))


def test_stream_accumulation_as_an_openai_client():
    def chunk(delta):
        return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]})

    lines = [
        chunk({"role": "assistant", "content": ""}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "c0",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        "data: [DONE]",
    ]
    content, calls = _accumulate(lines)
    assert content == "" and calls == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
