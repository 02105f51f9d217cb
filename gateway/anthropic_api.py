"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) over the chat path.

Design: a request is decoded into the Structs of `anthropic_protocol.py`, translated into the
`ChatInput` every chat request becomes (`to_chat`: system -> a system message, `tool_use` blocks
-> an assistant's tool calls, `tool_result` blocks -> `role: tool` messages, tools -> function
tools, tool_choice auto/any/tool/none -> auto/required/{function}/none, `output_config.format`
-> a json_schema response format; errors name Anthropic's fields), and planned by
`translate.chat_plan`, the very function the chat route uses: same template, limits and
sampling checks. The route runs `endpoint.py`'s skeleton. The answer is assembled from the generated text by `agent_output` (text and
`tool_use` blocks) and spelled as a `message` object or Anthropic's event stream:

    message_start  ping  (content_block_start  content_block_delta...  content_block_stop)...
    message_delta (stop_reason, usage)  message_stop

`cache_control` on a block (or at the top level: on the last message) is a checkpoint hint: the
scheduler snapshots the prompt's KV at the breakpoint (`agent_output.breakpoint_offset`). One
hint per request: the end of the system turn if any system block or tool is marked, else the
earliest breakpoint in `messages`. NOTE: clients mark the shared prefix (system, tools) and the
conversation's latest turn; the shared prefix is what other conversations reuse, while the
conversation itself stays in its slot (and is saved when the slot is given away), so
snapshotting it again at every turn would only churn the checkpoint memory. Usage follows Anthropic's
accounting: input_tokens + cache_read_input_tokens + cache_creation_input_tokens is the prompt;
cache_read counts the tokens reused from a slot or checkpoint, cache_creation the tokens computed
up to the breakpoint. Errors use Anthropic's shape and status codes (`error_response`).
Images, documents, thinking and server tools are refused with a 400 naming them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..scheduler.request import FinishEvent, FinishReason, GenerationRequest
from . import endpoint, openai_reply, translate
from . import protocol as p
from .agent_output import (
    ArgsDelta,
    Block,
    BlockAssembler,
    BlockKind,
    BlockStart,
    BlockStop,
    Breakpoint,
    TextDelta,
    ToolSpec,
    breakpoint_offset,
    split_output,
)
from .anthropic_protocol import (
    ContentBlock,
    CountTokensRequest,
    ErrorBody,
    ErrorEnvelope,
    Message,
    MessagesRequest,
    TextBlockOut,
    ToolUseBlockOut,
    Usage,
)
from .chat_input import (
    JSON,
    ChatInput,
    ParamNames,
    TemplateMessage,
    ToolChoice,
    function_tool,
    named_tool_choice,
    template_message,
    tool_call,
)
from .endpoint import FrontDoor, Generation
from .errors import APIError, bad_request, json_response
from .state import Gateway
from .streaming import Collected, StreamFormat, sse_event

_encode = msgspec.json.Encoder().encode

# ------------------------------------------------------------------ errors

# APIError status -> Anthropic's (status, error type)
_ERROR_TYPES = {
    400: (400, "invalid_request_error"),
    401: (401, "authentication_error"),
    403: (403, "permission_error"),
    404: (404, "not_found_error"),
    408: (408, "invalid_request_error"),  # the body did not arrive in time
    413: (413, "request_too_large"),
    415: (415, "invalid_request_error"),  # the body is not declared application/json
    429: (429, "rate_limit_error"),
    500: (500, "api_error"),
    503: (529, "overloaded_error"),  # draining, not ready, timed out before the first token
}


def anthropic_error(err: APIError) -> tuple[int, ErrorEnvelope]:
    status, kind = _ERROR_TYPES.get(err.status, (err.status, "api_error"))
    message = err.message
    if err.param and err.param not in message:  # Anthropic's shape has no `param`: name it in the text
        message = f"{err.param}: {message}"
    return status, ErrorEnvelope("error", ErrorBody(kind, message))


def error_response(err: APIError) -> Response:
    """`{"type": "error", "error": {"type", "message"}}` with Anthropic's status code."""
    status, body = anthropic_error(err)
    return json_response(body, status, err.headers)


# ------------------------------------------------------------------ request translation


def new_tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


_REFUSED_BLOCKS = {
    "image": "images are not supported by this server",
    "document": "documents are not supported by this server",
    "thinking": "thinking blocks are not supported by this server (its models do not think)",
    "redacted_thinking": "thinking blocks are not supported by this server (its models do not think)",
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

    def flush(self, role: str, tool_calls: list[dict[str, JSON]] | None = None) -> None:
        """End the message being built (emitted when it has text or tool calls)."""
        content = self.SEP.join(self._texts)
        if self._texts or tool_calls:
            self.messages.append(template_message(role, content, tool_calls=tool_calls))
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
    for j, block in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        if block.type == "text":
            b.text(_block_text(block, where), block.cache_control is not None)
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
    if calls:
        b.flush("assistant", calls)
        if marked_call:
            b.mark_last()
    else:
        b.flush("assistant")


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
    if req.thinking is not None and req.thinking.type != "disabled":
        raise bad_request(
            "extended thinking is not supported by this server; omit `thinking` or set its type to 'disabled'",
            param="thinking",
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
        params=PARAMS,
    )
    return ChatPlan(chat, b.breakpoint)


# ------------------------------------------------------------------ answers


def stop_reason(finish: FinishEvent, has_tool_calls: bool) -> str:
    if has_tool_calls:
        return "tool_use"
    if finish.reason is FinishReason.STOP:
        return "stop_sequence" if finish.stop_sequence is not None else "end_turn"
    return "max_tokens"  # length, or a timeout after some tokens (as the chat route's "length")


def usage(finish: FinishEvent, hint: int | None) -> Usage:
    """Anthropic's split of the prompt; `hint` is the cache_control offset the request carried."""
    read = finish.reuse.reused_tokens if finish.reuse is not None else 0
    created = max(0, hint - read) if hint is not None else 0
    return Usage(
        input_tokens=finish.prompt_tokens - read - created,
        output_tokens=finish.completion_tokens,
        cache_creation_input_tokens=created,
        cache_read_input_tokens=read,
    )


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def content_blocks(blocks: list[Block]) -> list[TextBlockOut | ToolUseBlockOut]:
    return [
        TextBlockOut(b.text)
        if b.kind is BlockKind.TEXT
        else ToolUseBlockOut(b.call_id, b.name, _tool_input(b.text))
        for b in blocks
    ]


class MessagesStream(StreamFormat):
    """Anthropic's event stream for one request."""

    terminator = b""  # message_stop ends it

    def __init__(
        self, message_id: str, model: str, prompt_tokens: int, tools: ToolSpec | None, hint: int | None
    ):
        self.message_id = message_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.hint = hint
        self.blocks = BlockAssembler(tools)

    @staticmethod
    def _event(name: str, body: dict[str, Any]) -> bytes:
        return sse_event(name, _encode({"type": name, **body}))

    def opening(self) -> list[bytes]:
        # NOTE: reuse is known only once the request has a slot: message_start reports the whole
        # prompt as input_tokens, and message_delta's usage (cumulative, as Anthropic's) corrects it.
        start = Message(
            id=self.message_id,
            model=self.model,
            content=[],
            stop_reason=None,
            stop_sequence=None,
            usage=Usage(self.prompt_tokens, 0, 0, 0),
        )
        return [self._event("message_start", {"message": start}), self._event("ping", {})]

    def _spell(self, events: list[Any]) -> bytes:
        out = []
        for ev in events:
            if isinstance(ev, BlockStart):
                block: Any = (
                    {"type": "text", "text": ""}
                    if ev.kind is BlockKind.TEXT
                    else {"type": "tool_use", "id": ev.call_id, "name": ev.name, "input": {}}
                )
                out.append(self._event("content_block_start", {"index": ev.index, "content_block": block}))
            elif isinstance(ev, TextDelta):
                delta = {"type": "text_delta", "text": ev.text}
                out.append(self._event("content_block_delta", {"index": ev.index, "delta": delta}))
            elif isinstance(ev, ArgsDelta):
                delta = {"type": "input_json_delta", "partial_json": ev.text}
                out.append(self._event("content_block_delta", {"index": ev.index, "delta": delta}))
            else:
                assert isinstance(ev, BlockStop)
                out.append(self._event("content_block_stop", {"index": ev.index}))
        return b"".join(out)

    def delta(self, text: str) -> bytes:
        return self._spell(self.blocks.feed(text))

    def closing(self, finish: FinishEvent, text: str) -> list[bytes]:
        err = openai_reply.failure(finish)
        closed = self._spell(self.blocks.finish(text))
        if err is not None:
            _, body = anthropic_error(err)
            return (
                [closed, sse_event("error", _encode(body))] if closed else [sse_event("error", _encode(body))]
            )
        delta = {
            "stop_reason": stop_reason(finish, self.blocks.has_tool_calls),
            "stop_sequence": finish.stop_sequence,
        }
        out = [closed] if closed else []
        out.append(self._event("message_delta", {"delta": delta, "usage": usage(finish, self.hint)}))
        out.append(self._event("message_stop", {}))
        return out


# ------------------------------------------------------------------ routes


class MessagesGeneration(Generation):
    """A Messages request, planned: one choice, answered as a `message` or Anthropic's stream."""

    def __init__(
        self,
        gen: GenerationRequest,
        message_id: str,
        model: str,
        tools: ToolSpec | None,
        hint: int | None,
        ctx_len: int,
    ):
        super().__init__([gen], {"X-Request-Id": message_id, "request-id": message_id})
        self.gen = gen
        self.ctx_len = ctx_len  # tokens per slot (named by the refusal of a long prompt)
        self.message_id = message_id
        self.model = model
        self.tools = tools
        self.hint = hint

    def refused(self, err: APIError) -> APIError:
        if err.code == "context_length_exceeded":  # Anthropic's spelling, which agents act on
            limit = self.ctx_len - 1
            err.message = (
                f"prompt is too long: {len(self.gen.prompt_ids)} tokens > {limit} maximum ({err.message})"
            )
            err.param = None  # the message must start as Anthropic's does
        return err

    def stream_format(self) -> StreamFormat:
        return MessagesStream(self.message_id, self.model, len(self.gen.prompt_ids), self.tools, self.hint)

    def answer(self, choices: list[Collected]) -> object:
        (got,) = choices
        blocks = split_output(got.text, self.tools)
        has_calls = any(b.kind is BlockKind.TOOL_CALL for b in blocks)
        return Message(
            id=self.message_id,
            model=self.model,
            content=content_blocks(blocks),
            stop_reason=stop_reason(got.finish, has_calls),
            stop_sequence=got.finish.stop_sequence,
            usage=usage(got.finish, self.hint),
        )


def plan_message(gw: Gateway, req: MessagesRequest, model: str) -> MessagesGeneration:
    """The generation request, tool-call parsing and cache_control hint of a Messages request."""
    rid = f"msg_{uuid.uuid4().hex}"
    plan = to_chat(req)
    planned = translate.chat_plan(plan.chat, gw.config, gw.runtime, rid)
    gen = planned.gen
    hint = None
    if plan.breakpoint is not None:
        chat = plan.chat
        hint = breakpoint_offset(
            gw.runtime, chat.messages, chat.template_tools(), plan.breakpoint, gen.prompt_ids
        )
        if hint is not None:
            gen.prefix_hint = hint
    tools = ToolSpec.from_plan(planned.spec, new_tool_use_id)
    return MessagesGeneration(gen, rid, model, tools, hint, gw.runtime.ctx_len)


MESSAGES = FrontDoor("create_message", MessagesRequest, "messages", plan_message)


async def count_tokens(gw: Gateway, request: Request) -> Response:
    req = await gw.read_body(request, CountTokensRequest)
    gw.check_model(req.model)
    gen = translate.chat_plan(to_chat(req).chat, gw.config, gw.runtime, "count_tokens").gen
    return json_response({"input_tokens": len(gen.prompt_ids)})


def routes(gw: Gateway) -> list[Route]:
    """POST /v1/messages and /v1/messages/count_tokens, with Anthropic's error shape."""
    return [
        gw.route("/v1/messages", endpoint.handler(MESSAGES), ["POST"], render_error=error_response),
        gw.route("/v1/messages/count_tokens", count_tokens, ["POST"], render_error=error_response),
    ]
