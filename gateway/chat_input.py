"""One chat request as `translate.chat_plan` takes it, whichever API it came in through.

Design: OpenAI's chat completions (`translate.chat_input`), Anthropic's Messages
(`anthropic_api.to_chat`) and OpenAI's Responses (`responses_api.to_chat`) each translate their
body into one `ChatInput`: the messages already as the chat template reads them, tools,
tool_choice, response format and the sampling fields, plus `ParamNames`, the request's own names
of the fields `chat_plan`'s errors name (so a Responses request hears about `max_output_tokens`
and `input`, an Anthropic one about `stop_sequences`, at the source). Nothing is decoded twice:
the front doors build the typed values directly with the constructors below.

Message dicts keep the key order the templates have always been given (role, content, name,
tool_calls, tool_call_id; a call as function {name, arguments}, id, type), since a template that
writes `tool_call | tojson` renders them in that order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypeAlias

import msgspec

from . import protocol as p
from .json_types import JSON, JSONObject, TemplateMessage, TemplateTool

# OpenAI's spelling: "none" | "auto" | "required" | {"type": "function", "function": {"name": N}}
ToolChoice: TypeAlias = str | JSONObject | None


@dataclass(frozen=True, slots=True)
class ParamNames:
    """What the request calls the fields that `chat_plan`'s errors name (OpenAI's names by default)."""

    messages: str = "messages"
    max_tokens: str = "max_tokens"
    stop: str = "stop"
    response_format: str = "response_format"


OPENAI_PARAMS = ParamNames()


class ChatInput(p.SamplingFields, frozen=True, kw_only=True):
    """A chat request, typed and ready for `chat_plan` (module docstring)."""

    messages: list[TemplateMessage]  # as the template reads them (`template_message`)
    tools: list[p.ToolDef] | None = None
    tool_choice: ToolChoice = None
    parallel_tool_calls: bool | None = None  # False: at most one call
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    params: ParamNames = OPENAI_PARAMS

    def template_tools(self) -> list[TemplateTool] | None:
        """The tools as the template reads them (None without tools)."""
        if not self.tools:
            return None
        tools: list[TemplateTool] = [to_json(t) for t in self.tools]
        return tools


def to_json(value: object) -> JSON:
    """`value` (Structs, dataclasses, containers of them) as plain JSON values."""
    return msgspec.to_builtins(value)


def template_message(
    role: str,
    content: str,
    *,
    name: str | None = None,
    tool_calls: list[JSONObject] | None = None,
    tool_call_id: str | None = None,
    reasoning_content: str | None = None,
) -> TemplateMessage:
    """A message in the template's shape (keys in the order templates have always seen)."""
    out: TemplateMessage = {"role": role, "content": content}
    if name is not None:
        out["name"] = name
    if tool_calls:
        out["tool_calls"] = tool_calls
    if tool_call_id is not None:
        out["tool_call_id"] = tool_call_id
    if reasoning_content is not None:  # Qwen3's template renders it (for the current turn's calls)
        out["reasoning_content"] = reasoning_content
    return out


def template_arguments(arguments: str) -> JSON:
    """A call's arguments as the template wants them: the JSON object its text holds.

    NOTE: templates write `tool_call.arguments | tojson`, which wants the object, not OpenAI's
    JSON text (transformers' convention; vLLM converts likewise); text that is not a JSON object
    stays text."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def tool_call(call_id: str | None, name: str, arguments: JSON) -> JSONObject:
    """One call of an assistant message, in the template's shape (`arguments`: an object)."""
    return {"function": {"name": name, "arguments": arguments}, "id": call_id, "type": "function"}


def function_tool(
    name: str, description: str | None, parameters: JSONObject | None, strict: bool | None
) -> p.ToolDef:
    """A function tool offered to the model; no `parameters`: any object. `strict`: calls are held
    to `parameters` by constrained decoding."""
    return p.ToolDef(
        function=p.FunctionDef(
            name=name,
            description=description,
            parameters=parameters or {"type": "object"},
            strict=True if strict else None,
        )
    )


def named_tool_choice(name: str) -> JSONObject:
    """tool_choice forcing a call of function `name`, in OpenAI's spelling."""
    return {"type": "function", "function": {"name": name}}
