"""Anthropic's Messages request -> the `ChatInput` every chat request becomes (`to_chat`).

Design: system -> a system message; text blocks of one turn joined by newlines; `tool_use`
blocks -> the assistant's tool calls (arguments as the object the template reads);
`tool_result` blocks -> `role: tool` messages (an error result prefixed "Error: "); client tools
-> function tools; tool_choice auto/any/tool/none -> auto/required/{function}/none;
`output_config.format` -> a json_schema response format; `stop_sequences`, `max_tokens` and the
sampling fields as they are. Errors name Anthropic's fields (`PARAMS`). Images, documents,
thinking and server tools are refused with a 400 naming them.

`cache_control` marks become one `Breakpoint` in the chat messages (anthropic_api.py's docstring
says which one and why); anthropic_api.py maps it to a prompt offset.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import protocol as p
from .agent_output import (
    Breakpoint,
)
from .anthropic_protocol import (
    ContentBlock,
    CountTokensRequest,
    MessagesRequest,
)
from .chat_input import (
    ChatInput,
    ParamNames,
    ToolChoice,
    function_tool,
    named_tool_choice,
    template_message,
    tool_call,
)
from .errors import APIError, bad_request
from .json_types import JSON, TemplateMessage

_REFUSED_BLOCKS = {
    "image": "images are not supported by this server",
    "document": "documents are not supported by this server",
    "thinking": "thinking blocks are accepted only in assistant turns",
    "redacted_thinking": "redacted thinking blocks are not supported by this server (it cannot decrypt them)",
    "server_tool_use": "server tools are not supported by this server",
    "web_search_tool_result": "server tools are not supported by this server",
    "search_result": "search result blocks are not supported by this server",
}


def _refuse_block(block: ContentBlock, where: str) -> APIError:
    reason = _REFUSED_BLOCKS.get(block.type)
    if reason is None:
        reason = f"content blocks of type {block.type!r} are not supported; send text, tool_use, tool_result"
    return bad_request(f"{where}: {reason}", param=where)


def _block_text(block: ContentBlock, where: str) -> str:
    if block.text is None:
        raise bad_request(f"{where}: a text block needs a string field `text`", param=where)
    return block.text


def _tool_result_text(block: ContentBlock, where: str) -> str:
    if block.content is None:
        return ""
    if isinstance(block.content, str):
        return block.content
    parts = []
    for k, inner in enumerate(block.content):
        if inner.type != "text":
            raise _refuse_block(inner, f"{where}.content[{k}]")
        parts.append(_block_text(inner, f"{where}.content[{k}]"))
    return "\n".join(parts)


# the chat fields' names in this API (named by chat_plan's errors)
PARAMS = ParamNames(stop="stop_sequences", response_format="output_config.format")


@dataclass(frozen=True)
class ChatPlan:
    """A Messages request as the chat path takes it, plus what the answer needs."""

    chat: ChatInput
    breakpoint: Breakpoint | None  # the hinted cache_control (module docstring), in chat-message terms


class _Builder:
    """Chat messages built from Anthropic's turns, tracking the first cache breakpoint marked."""

    SEP = "\n"  # between text blocks of one message

    def __init__(self) -> None:
        self.messages: list[TemplateMessage] = []
        self.breakpoint: Breakpoint | None = None
        self._texts: list[str] = []  # text blocks of the message being built
        self._cut_at: int | None = None  # a breakpoint inside it: characters kept

    def text(self, text: str, marked: bool) -> None:
        self._texts.append(text)
        if marked and self._cut_at is None:
            self._cut_at = len(self.SEP.join(self._texts))

    def flush(
        self, role: str, tool_calls: list[dict[str, JSON]] | None = None, reasoning_content: str | None = None
    ) -> None:
        """End the message being built (emitted when it has text or tool calls)."""
        content = self.SEP.join(self._texts)
        if self._texts or tool_calls:
            self.messages.append(
                template_message(role, content, tool_calls=tool_calls, reasoning_content=reasoning_content)
            )
            if self._cut_at is not None:
                end = self._cut_at >= len(content) and not tool_calls
                self._mark(Breakpoint(len(self.messages) - 1, None if end else self._cut_at))
        self._texts, self._cut_at = [], None

    def whole(self, message: TemplateMessage, marked: bool) -> None:
        self.messages.append(message)
        if marked:
            self._mark(Breakpoint(len(self.messages) - 1))

    def mark_last(self) -> None:
        if self.messages:
            self._mark(Breakpoint(len(self.messages) - 1))

    def _mark(self, bp: Breakpoint) -> None:
        if self.breakpoint is None:  # the first one marked is the hint (module docstring)
            self.breakpoint = bp


def _add_user(b: _Builder, i: int, content: list[ContentBlock]) -> None:
    for j, block in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        marked = block.cache_control is not None
        if block.type == "text":
            b.text(_block_text(block, where), marked)
        elif block.type == "tool_result":
            if not block.tool_use_id:
                raise bad_request(f"{where}: a tool_result block needs `tool_use_id`", param=where)
            b.flush("user")
            text = _tool_result_text(block, where)
            if block.is_error:
                text = f"Error: {text}"
            b.whole(template_message("tool", text, tool_call_id=block.tool_use_id), marked)
        else:
            raise _refuse_block(block, where)
    b.flush("user")


def _add_assistant(b: _Builder, i: int, content: list[ContentBlock]) -> None:
    calls: list[dict[str, JSON]] = []
    marked_call = False
    thinking: list[str] = []
    for j, block in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        if block.type == "text":
            b.text(_block_text(block, where), block.cache_control is not None)
        elif block.type == "thinking":  # replayed: the template renders it where it wants it
            thinking.append(block.thinking or "")
        elif block.type == "tool_use":
            if not block.id or not block.name:
                raise bad_request(f"{where}: a tool_use block needs `id` and `name`", param=where)
            args = block.input if block.input is not None else {}
            if not isinstance(args, dict):
                raise bad_request(f"{where}.input must be an object", param=f"{where}.input")
            calls.append(tool_call(block.id, block.name, args))
            marked_call = marked_call or block.cache_control is not None
        else:
            raise _refuse_block(block, where)
    reasoning = "\n".join(thinking) if thinking else None
    if calls:
        b.flush("assistant", calls, reasoning)
        if marked_call:
            b.mark_last()
    else:
        b.flush("assistant", reasoning_content=reasoning)


def _tool_choice(req: CountTokensRequest) -> ToolChoice:
    tc = req.tool_choice
    if tc is None:
        return None
    if tc.type == "auto":
        return "auto"
    if tc.type == "any":
        return "required"
    if tc.type == "none":
        return "none"
    if tc.type == "tool":
        if not tc.name:
            raise bad_request("tool_choice of type 'tool' needs `name`", param="tool_choice.name")
        if not any(t.name == tc.name for t in req.tools or ()):
            raise bad_request(f"tool_choice names {tc.name!r}, which is not in `tools`", param="tool_choice")
        return named_tool_choice(tc.name)
    raise bad_request(
        f"tool_choice type must be auto, any, tool or none; got {tc.type!r}", param="tool_choice.type"
    )


def to_chat(req: CountTokensRequest) -> ChatPlan:
    """The chat request a Messages request stands for (400 for what is not served)."""
    if req.thinking is not None and req.thinking.type not in ("enabled", "disabled", "adaptive"):
        raise bad_request(
            f"thinking type must be enabled or disabled; got {req.thinking.type!r}", param="thinking"
        )
    if req.mcp_servers:
        raise bad_request("MCP servers (server tools) are not supported by this server", param="mcp_servers")
    if isinstance(req, MessagesRequest) and req.container is not None:
        raise bad_request("containers (server tools) are not supported by this server", param="container")
    b = _Builder()
    if req.system is not None:
        if isinstance(req.system, str):
            b.text(req.system, False)
        else:
            for j, block in enumerate(req.system):
                if block.type != "text":
                    raise _refuse_block(block, f"system[{j}]")
                b.text(_block_text(block, f"system[{j}]"), False)
        b.flush("system")
        # a breakpoint anywhere in the system prompt or on a tool: the end of the system turn,
        # which holds both (a checkpoint there also serves every shorter prefix)
        system_marks = [] if isinstance(req.system, str) else [x.cache_control for x in req.system]
        if b.messages and any(
            m is not None for m in [*system_marks, *(t.cache_control for t in req.tools or ())]
        ):
            b.mark_last()
    for i, m in enumerate(req.messages):
        if m.role not in ("user", "assistant"):
            raise bad_request(
                f"messages[{i}].role must be 'user' or 'assistant' (system goes in `system`); got {m.role!r}",
                param=f"messages[{i}].role",
            )
        blocks = [ContentBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        (_add_user if m.role == "user" else _add_assistant)(b, i, blocks)
    tools = []
    for k, t in enumerate(req.tools or ()):
        if t.type not in (None, "custom"):
            raise bad_request(
                f"tools[{k}]: server tools (type {t.type!r}) are not supported by this server; "
                "give client tools with name, description and input_schema",
                param=f"tools[{k}].type",
            )
        tools.append(function_tool(t.name, t.description, t.input_schema, t.strict))
    if req.cache_control is not None:  # Anthropic: "the last cacheable block": the last message
        b.mark_last()
    tool_choice = _tool_choice(req)
    fmt = req.output_config.format if req.output_config is not None else None
    response_format = None
    if fmt is not None:
        if fmt.type != "json_schema":
            raise bad_request(
                f"output_config.format type must be 'json_schema'; got {fmt.type!r}",
                param="output_config.format",
            )
        schema = p.JsonSchemaFormat(name="output", schema=fmt.schema or {"type": "object"}, strict=True)
        response_format = p.ResponseFormat(type="json_schema", json_schema=schema)
    sampling = req if isinstance(req, MessagesRequest) else None  # count_tokens has none
    chat = ChatInput(
        messages=b.messages,
        tools=tools or None,
        tool_choice=tool_choice if tools else None,
        parallel_tool_calls=(
            False if req.tool_choice is not None and req.tool_choice.disable_parallel_tool_use else None
        ),
        response_format=response_format,
        max_tokens=sampling.max_tokens if sampling else None,
        temperature=sampling.temperature if sampling else None,
        top_p=sampling.top_p if sampling else None,
        top_k=sampling.top_k if sampling else None,
        stop=sampling.stop_sequences if sampling else None,
        speculative=sampling.speculative if sampling else True,
        params=PARAMS,
    )
    return ChatPlan(chat, b.breakpoint)
