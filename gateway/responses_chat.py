"""An OpenAI Responses request -> the `ChatInput` every chat request becomes (`to_chat`), and the
conversation a stored response continues with.

Design: `instructions` -> a system message (not kept in the stored conversation: OpenAI does not
carry it over either); input messages as they are (developer -> system); `function_call` items
-> the assistant's tool calls (joining the assistant message before them); `function_call_output`
items -> `role: tool` messages; function tools and tool_choice in chat's spelling; `text.format`
-> the response format; `max_output_tokens`, temperature and top_p as they are. Errors name this
API's fields (`PARAMS`). Messages are built as the chat template reads them, so a stored
conversation is prepended to the next request's input as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import protocol as p
from .agent_output import (
    Block,
    BlockKind,
)
from .chat_input import (
    ChatInput,
    ParamNames,
    ToolChoice,
    function_tool,
    named_tool_choice,
    template_arguments,
    template_message,
    tool_call,
)
from .errors import bad_request
from .json_types import JSON, TemplateMessage
from .responses_protocol import (
    InputContent,
    InputItem,
    ResponsesRequest,
    TextConfig,
)

# the chat fields' names in this API (named by chat_plan's errors). NOTE: a chat message index is
# not an input index (instructions come first, function calls join their message), so an error
# about the messages names `input` as a whole.
PARAMS = ParamNames(messages="input", max_tokens="max_output_tokens", response_format="text.format")


def _text_of(content: str | list[InputContent] | None, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for j, c in enumerate(content):
        if c.type not in ("input_text", "output_text", "text"):
            what = "images" if c.type == "input_image" else "files" if c.type == "input_file" else None
            reason = (
                f"{what} are not supported by this server"
                if what
                else f"content of type {c.type!r} is not supported"
            )
            raise bad_request(f"{where}[{j}]: {reason}; send input_text", param=f"{where}[{j}].type")
        if c.text is None:
            raise bad_request(f"{where}[{j}] needs a string field `text`", param=f"{where}[{j}].text")
        parts.append(c.text)
    return "".join(parts)


def _attach(message: TemplateMessage, pending: list[str]) -> None:
    """Give the reasoning items read so far to `message` if it is the assistant's."""
    if pending and message["role"] == "assistant":
        text = "\n".join(t for t in pending if t)
        if text:
            message["reasoning_content"] = text
        pending.clear()
    elif message["role"] != "assistant":
        pending.clear()  # reasoning with no answer of its own: nothing to render it with


_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def input_messages(items: str | list[InputItem]) -> list[TemplateMessage]:
    """The chat messages of `input` (400 for items not served), as the template reads them."""
    if isinstance(items, str):
        return [template_message("user", items)]
    out: list[TemplateMessage] = []
    pending: list[str] = []  # reasoning items not yet given to an assistant message
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.type or ("message" if item.role is not None else None)
        if kind == "message":
            role = _ROLES.get(item.role or "")
            if role is None:
                raise bad_request(
                    f"{where}.role must be user, assistant, system or developer; got {item.role!r}",
                    param=f"{where}.role",
                )
            out.append(template_message(role, _text_of(item.content, f"{where}.content")))
            _attach(out[-1], pending)
        elif kind == "function_call":
            if not item.call_id or not item.name:
                raise bad_request(f"{where}: a function_call needs call_id and name", param=where)
            call = tool_call(item.call_id, item.name, template_arguments(item.arguments or "{}"))
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # calls after (or beside) its text
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append(template_message("assistant", "", tool_calls=[call]))
            _attach(out[-1], pending)
        elif kind == "function_call_output":
            if not item.call_id:
                raise bad_request(f"{where}: a function_call_output needs call_id", param=f"{where}.call_id")
            out.append(
                template_message("tool", _text_of(item.output, f"{where}.output"), tool_call_id=item.call_id)
            )
        elif kind == "reasoning":
            # NOTE: Codex CLI replays its reasoning items every turn: their text goes to the
            # assistant message they precede (`reasoning_content`, for templates that render it)
            parts = item.content if isinstance(item.content, list) else []
            texts = [c.text or "" for c in parts if c.type == "reasoning_text"]
            texts = texts or [c.text or "" for c in item.summary or [] if c.type == "summary_text"]
            pending.append("\n".join(texts))
        else:
            raise bad_request(
                f"{where}: items of type {kind!r} are not supported; send messages, function_call "
                "and function_call_output items",
                param=f"{where}.type",
            )
    return out


@dataclass(frozen=True)
class ChatPlan:
    chat: ChatInput
    conversation: list[TemplateMessage]  # what a stored response keeps (without instructions)


def _tool_choice(value: JSON, names: list[str]) -> ToolChoice:
    if value is None:
        return None
    if isinstance(value, str) and value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        if value["name"] not in names:
            raise bad_request(
                f"tool_choice names {value['name']!r}, which is not in `tools`", param="tool_choice"
            )
        return named_tool_choice(value["name"])
    raise bad_request(
        "tool_choice must be auto, none, required or {'type': 'function', 'name': ...}", param="tool_choice"
    )


def _response_format(text: TextConfig | None) -> p.ResponseFormat | None:
    fmt = text.format if text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_schema":
        schema = p.JsonSchemaFormat(
            name=fmt.name or "response", schema=fmt.schema or {}, strict=bool(fmt.strict)
        )
        return p.ResponseFormat(type="json_schema", json_schema=schema)
    return p.ResponseFormat(type=fmt.type)


def to_chat(req: ResponsesRequest, history: list[TemplateMessage]) -> ChatPlan:
    """The chat request for `req`, continuing `history` (the previous response's conversation)."""
    if req.background:
        raise bad_request("background responses are not supported by this server", param="background")
    if req.conversation is not None:
        raise bad_request(
            "conversations are not supported by this server; use previous_response_id or resend the input",
            param="conversation",
        )
    conversation = [*history, *input_messages(req.input)]
    if not conversation:
        raise bad_request("input must hold at least one item", param="input")
    tools, names = [], []
    for k, t in enumerate(req.tools or ()):
        if t.type != "function":
            raise bad_request(
                f"tools[{k}]: tools of type {t.type!r} (built-in or server tools) are not supported by "
                "this server; give function tools",
                param=f"tools[{k}].type",
            )
        if not t.name:
            raise bad_request(f"tools[{k}] needs a name", param=f"tools[{k}].name")
        tools.append(function_tool(t.name, t.description, t.parameters, t.strict))
        names.append(t.name)
    tool_choice = _tool_choice(req.tool_choice, names)
    system = [template_message("system", req.instructions)] if req.instructions else []
    chat = ChatInput(
        messages=system + conversation,
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        tools=tools or None,
        tool_choice=tool_choice if tools else None,
        parallel_tool_calls=False if req.parallel_tool_calls is False else None,
        response_format=_response_format(req.text),
        speculative=req.speculative,
        params=PARAMS,
    )
    return ChatPlan(chat, conversation)


def assistant_message(blocks: list[Block]) -> TemplateMessage:
    """The output as the chat message a stored conversation continues with."""
    text = "".join(b.text for b in blocks if b.kind is BlockKind.TEXT)
    calls = [
        tool_call(b.call_id, b.name, template_arguments(b.text))
        for b in blocks
        if b.kind is BlockKind.TOOL_CALL
    ]
    thinking = "".join(b.text for b in blocks if b.kind is BlockKind.THINKING)
    return template_message("assistant", text, tool_calls=calls, reasoning_content=thinking or None)
