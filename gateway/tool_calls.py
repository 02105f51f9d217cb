"""Tool calls in generated text: the syntax of each template family, parsed whole or streamed.

Design: a model calls a tool by writing text in the syntax its chat template taught it. Three
families cover the common templates (`ToolCallFamily`); `family_for_template` picks one from the
template's source. Everything here is plain text in, plain data out, with no scheduler or HTTP
types, so every front door (chat completions, /v1/messages, /v1/responses) shares it:

    parsed = parse_tool_calls(text, family, tool_names={"get_weather"})
    parsed.content, parsed.tool_calls          # str | None, tuple[ToolCall, ...]

    parser = StreamingToolParser(family, tool_names={"get_weather"})
    for piece in texts:                         # the TokenEvent texts, in order
        content, deltas = parser.feed(piece)    # content to stream now; ToolCallDelta list
    content, deltas = parser.finish()           # at the FinishEvent (its text fed first)
    parser.tool_calls                           # every call, as parse_tool_calls would give

A call whose text is not valid JSON, or names a function the request did not offer, stays in the
content: nothing the model wrote is dropped. Arguments are re-serialised compactly as a JSON
object text (OpenAI's `function.arguments` is a string). The scanner is tool_stream.py's: the
whole-text parse runs it over the whole text, so streamed and whole replies split alike.

    family    what the model writes                                        templates
    hermes    <tool_call>{"name": N, "arguments": {...}}</tool_call> ...   Hermes, Qwen 2.5/3, the built-in shim
    llama3    [<|python_tag|>]{"name": N, "parameters": {...}}[; {...}]    Llama 3.1-3.3
    mistral   [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]           Mistral, Mixtral
    any       {"name": N, "arguments": {...}}, a list of them, or either   what small models write
              in a ```json fence, anywhere in the reply                    instead (Qwen2.5-Coder-0.5B)
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from .json_types import TemplateMessage, TemplateTool
from .tool_stream import (
    HERMES_CLOSE,
    HERMES_OPEN,
    LLAMA3_TAG,
    MISTRAL_TAG,
    StreamingToolParser,
    ToolCall,
    new_call_id,
)


class ToolCallFamily(str, enum.Enum):
    HERMES = "hermes"  # <tool_call> JSON </tool_call> blocks, anywhere in the text
    LLAMA3 = "llama3"  # the whole reply is JSON call(s), optionally after <|python_tag|>
    MISTRAL = "mistral"  # [TOOL_CALLS] then a JSON array of calls


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    content: str | None  # the text outside the calls (stripped); None when nothing is left
    tool_calls: tuple[ToolCall, ...]


def family_for_template(source: str | None) -> tuple[ToolCallFamily, bool]:
    """(family, renders_tools) for a chat template's jinja source. `renders_tools` is False when
    the template never reads `tools`: the gateway then renders tools itself (`hermes_shim`)."""
    src = source or ""
    renders_tools = "tools" in src
    if MISTRAL_TAG in src:
        return ToolCallFamily.MISTRAL, renders_tools
    if LLAMA3_TAG in src or ("<|start_header_id|>" in src and renders_tools and HERMES_OPEN not in src):
        return ToolCallFamily.LLAMA3, renders_tools
    return ToolCallFamily.HERMES, renders_tools and HERMES_OPEN in src


def parse_tool_calls(
    text: str,
    family: ToolCallFamily,
    *,
    tool_names: Collection[str] | None = None,
    new_id: Callable[[], str] = new_call_id,
) -> ParsedOutput:
    """Split a complete generated `text` into content and tool calls (see the module docstring).
    `tool_names`: the functions offered (None accepts any name)."""
    parser = StreamingToolParser(family, tool_names, new_id)
    content = parser.feed(text)[0] + parser.finish()[0]
    if parser.cut_text:  # a call cut short by the end of the text: what was written
        content = f"{content.rstrip()}\n{parser.cut_text}" if content.strip() else parser.cut_text
    return ParsedOutput(content.strip() or None, tuple(parser.tool_calls))


# ------------------------------------------------------------------ rendering for templates without tools


HERMES_SYSTEM = (
    "You are a function calling AI model. You may call one or more functions to assist with the "
    "user query. Here are the available tools: <tools>\n{tools}\n</tools>\nFor each function call, "
    "return a JSON object with the function name and arguments within <tool_call></tool_call> tags:"
    '\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def hermes_shim(
    messages: Sequence[TemplateMessage], tools: Sequence[TemplateTool] | None
) -> list[TemplateMessage]:
    """Messages rewritten for a template that does not render tools (SmolLM2's, for one): the
    tool list joins the system message (one is added in front if there is none), an assistant's
    `tool_calls` become `<tool_call>` blocks in its content, and a `tool` message's content is
    wrapped in `<tool_response>`. The template then renders plain role/content messages.

    Deterministic in its input, so a conversation resent with one more turn renders to the same
    prefix (prefix reuse keeps working through a tool loop)."""
    out: list[TemplateMessage] = []
    for m in messages:
        role = m.get("role")
        content = m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            blocks = []
            for tc in m["tool_calls"]:
                fn = tc.get("function", tc)
                args = fn.get("arguments", "{}")
                try:
                    args_obj = json.loads(args) if isinstance(args, str) else args
                except ValueError:
                    args_obj = args
                call = json.dumps({"name": fn.get("name"), "arguments": args_obj}, ensure_ascii=False)
                blocks.append(f"{HERMES_OPEN}\n{call}\n{HERMES_CLOSE}")
            content = "\n".join([content, *blocks] if content else blocks)
            out.append({"role": "assistant", "content": content})
        elif role == "tool":
            out.append({"role": "tool", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
        if role == "assistant" and m.get("reasoning_content") is not None:
            out[-1]["reasoning_content"] = m["reasoning_content"]  # for templates that render it
    if tools:
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        system = HERMES_SYSTEM.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{system}"}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out
