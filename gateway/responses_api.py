"""OpenAI's Responses API (`POST /v1/responses`) over the chat path.

Design: as `anthropic_api.py`: the request becomes the `ChatInput` every chat request becomes
(`to_chat`: `instructions` -> a system message, input messages as they are, `function_call`
items -> an assistant's tool calls, `function_call_output` items -> `role: tool` messages,
function tools and tool_choice in chat's spelling, `text.format` -> the response format; errors
name this API's fields), planned by `translate.chat_plan` and run by `endpoint.py`'s skeleton; the answer is assembled by `agent_output` into `message` and
`function_call` output items, as one response object or the Responses event stream:

    response.created  response.in_progress
    (output_item.added  content_part.added  output_text.delta...  output_text.done
       content_part.done  output_item.done)                                   a message
    (output_item.added  function_call_arguments.delta...  function_call_arguments.done
       output_item.done)                                                      a function call
    response.completed | response.incomplete | response.failed

`previous_response_id` continues a stored conversation: `ResponseStore` keeps, for each response
created with `store` true (the default), the chat messages it ended with (its input without
`instructions`, which OpenAI does not carry over either, plus its output), in memory, bounded
by `response_store.py`'s bounds, least recently used out first. An unknown or
evicted id is a 404 naming it. `store: false` keeps nothing (the client resends the whole
conversation, as Codex CLI does). Errors are OpenAI's JSON, params named as this API names them.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec
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
    TextDelta,
    ToolSpec,
    split_output,
)
from .chat_input import (
    JSON,
    ChatInput,
    ParamNames,
    TemplateMessage,
    ToolChoice,
    function_tool,
    named_tool_choice,
    template_arguments,
    template_message,
    tool_call,
)
from .endpoint import FrontDoor, Generation
from .errors import APIError, bad_request
from .response_store import ResponseStore
from .responses_protocol import (
    ErrorInfo,
    FunctionCallItem,
    IncompleteDetails,
    InputContent,
    InputItem,
    InputTokensDetails,
    MessageItem,
    OutputItem,
    OutputText,
    OutputTokensDetails,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
    TextConfig,
)
from .state import Gateway
from .streaming import Collected, StreamFormat, sse_event

_encode = msgspec.json.Encoder().encode

# ------------------------------------------------------------------ request translation

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


_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def input_messages(items: str | list[InputItem]) -> list[TemplateMessage]:
    """The chat messages of `input` (400 for items not served), as the template reads them."""
    if isinstance(items, str):
        return [template_message("user", items)]
    out: list[TemplateMessage] = []
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
        elif kind == "function_call":
            if not item.call_id or not item.name:
                raise bad_request(f"{where}: a function_call needs call_id and name", param=where)
            call = tool_call(item.call_id, item.name, template_arguments(item.arguments or "{}"))
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # calls after (or beside) its text
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append(template_message("assistant", "", tool_calls=[call]))
        elif kind == "function_call_output":
            if not item.call_id:
                raise bad_request(f"{where}: a function_call_output needs call_id", param=f"{where}.call_id")
            out.append(
                template_message("tool", _text_of(item.output, f"{where}.output"), tool_call_id=item.call_id)
            )
        elif kind == "reasoning":
            raise bad_request(
                f"{where}: reasoning items are not supported by this server", param=f"{where}.type"
            )
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
    if value is None or value in ("auto", "none", "required"):
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
        params=PARAMS,
    )
    return ChatPlan(chat, conversation)


# ------------------------------------------------------------------ answers


def usage(finish: FinishEvent) -> ResponseUsage:
    cached = finish.reuse.reused_tokens if finish.reuse is not None else 0
    return ResponseUsage(
        input_tokens=finish.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached),
        output_tokens=finish.completion_tokens,
        output_tokens_details=OutputTokensDetails(),
        total_tokens=finish.prompt_tokens + finish.completion_tokens,
    )


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def output_items(blocks: list[Block], status: str, ids: dict[int, str] | None = None) -> list[OutputItem]:
    """Blocks as output items; `ids` gives the item id of block i (streaming), else fresh ids."""
    out: list[OutputItem] = []
    for i, b in enumerate(blocks):
        if b.kind is BlockKind.TEXT:
            item_id = ids[i] if ids else _item_id("msg")
            out.append(MessageItem(id=item_id, status=status, content=[OutputText(text=b.text)]))
        else:
            item_id = ids[i] if ids else _item_id("fc")
            out.append(
                FunctionCallItem(
                    id=item_id, call_id=b.call_id, name=b.name, arguments=b.text, status="completed"
                )
            )
    return out


def assistant_message(blocks: list[Block]) -> TemplateMessage:
    """The output as the chat message a stored conversation continues with."""
    text = "".join(b.text for b in blocks if b.kind is BlockKind.TEXT)
    calls = [
        tool_call(b.call_id, b.name, template_arguments(b.text))
        for b in blocks
        if b.kind is BlockKind.TOOL_CALL
    ]
    return template_message("assistant", text, tool_calls=calls)


def status_of(finish: FinishEvent) -> tuple[str, IncompleteDetails | None]:
    if finish.reason is FinishReason.STOP:
        return "completed", None
    return "incomplete", IncompleteDetails("max_output_tokens")  # length, or a timeout after tokens


@dataclass
class _Answer:
    """What every response object of one request shares, and how it ends."""

    req: ResponsesRequest
    plan: ChatPlan
    response_id: str
    model: str
    created_at: int
    store: ResponseStore

    def response(
        self,
        status: str,
        output: list[OutputItem],
        usage: ResponseUsage | None,
        *,
        error: ErrorInfo | None = None,
        incomplete: IncompleteDetails | None = None,
    ) -> ResponseObject:
        req = self.req
        return ResponseObject(
            id=self.response_id,
            created_at=self.created_at,
            model=self.model,
            status=status,
            output=output,
            usage=usage,
            error=error,
            incomplete_details=incomplete,
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            previous_response_id=req.previous_response_id,
            temperature=req.temperature,
            top_p=req.top_p,
            tool_choice=req.tool_choice if req.tool_choice is not None else "auto",
            tools=msgspec.to_builtins(req.tools or []),
            parallel_tool_calls=req.parallel_tool_calls is not False,
            text=msgspec.to_builtins(req.text) if req.text is not None else {"format": {"type": "text"}},
            store=req.store,
            metadata=req.metadata or {},
        )

    def keep(self, blocks: list[Block]) -> None:
        if self.req.store:
            self.store.put(self.response_id, [*self.plan.conversation, assistant_message(blocks)])


class ResponsesStream(StreamFormat):
    """The Responses API event stream for one request."""

    terminator = b""  # response.completed (or .incomplete / .failed) ends it

    def __init__(self, answer: _Answer, tools: ToolSpec | None):
        self.answer = answer
        self.blocks = BlockAssembler(tools)
        self.seq = 0
        self.item_ids: dict[int, str] = {}

    def _event(self, name: str, body: dict[str, Any]) -> bytes:
        data = _encode({"type": name, "sequence_number": self.seq, **body})
        self.seq += 1
        return sse_event(name, data)

    def opening(self) -> list[bytes]:
        start = self.answer.response("in_progress", [], None)
        return [
            self._event("response.created", {"response": start}),
            self._event("response.in_progress", {"response": start}),
        ]

    def _spell(self, events: list[Any], status: str = "completed") -> bytes:
        out = []
        for ev in events:
            i = ev.index
            if isinstance(ev, BlockStart):
                if ev.kind is BlockKind.TEXT:
                    self.item_ids[i] = _item_id("msg")
                    item: Any = MessageItem(id=self.item_ids[i], status="in_progress", content=[])
                    out.append(self._event("response.output_item.added", {"output_index": i, "item": item}))
                    part = OutputText(text="")
                    out.append(
                        self._event(
                            "response.content_part.added",
                            {
                                "item_id": self.item_ids[i],
                                "output_index": i,
                                "content_index": 0,
                                "part": part,
                            },
                        )
                    )
                else:
                    self.item_ids[i] = _item_id("fc")
                    item = FunctionCallItem(
                        id=self.item_ids[i],
                        call_id=ev.call_id,
                        name=ev.name,
                        arguments="",
                        status="in_progress",
                    )
                    out.append(self._event("response.output_item.added", {"output_index": i, "item": item}))
            elif isinstance(ev, TextDelta):
                body = {
                    "item_id": self.item_ids[i],
                    "output_index": i,
                    "content_index": 0,
                    "delta": ev.text,
                    "logprobs": [],
                }
                out.append(self._event("response.output_text.delta", body))
            elif isinstance(ev, ArgsDelta):
                body = {"item_id": self.item_ids[i], "output_index": i, "delta": ev.text}
                out.append(self._event("response.function_call_arguments.delta", body))
            else:
                assert isinstance(ev, BlockStop)
                block = self.blocks.blocks[i]
                item_id = self.item_ids[i]
                if block.kind is BlockKind.TEXT:
                    where = {"item_id": item_id, "output_index": i, "content_index": 0}
                    out.append(
                        self._event(
                            "response.output_text.done", {**where, "text": block.text, "logprobs": []}
                        )
                    )
                    out.append(
                        self._event(
                            "response.content_part.done", {**where, "part": OutputText(text=block.text)}
                        )
                    )
                else:
                    body = {"item_id": item_id, "output_index": i, "arguments": block.text}
                    out.append(self._event("response.function_call_arguments.done", body))
                (done,) = output_items([block], status, {0: item_id})
                out.append(self._event("response.output_item.done", {"output_index": i, "item": done}))
        return b"".join(out)

    def delta(self, text: str) -> bytes:
        return self._spell(self.blocks.feed(text))

    def closing(self, finish: FinishEvent, text: str) -> list[bytes]:
        err = openai_reply.failure(finish)
        status, incomplete = status_of(finish) if err is None else ("failed", None)
        out = [self._spell(self.blocks.finish(text), "incomplete" if status == "incomplete" else "completed")]
        output = output_items(
            self.blocks.blocks, "completed" if status == "completed" else "incomplete", self.item_ids
        )
        if err is not None:
            info = ErrorInfo(err.code or "server_error", err.message)
            failed = self.answer.response("failed", output, usage(finish), error=info)
            out.append(self._event("response.failed", {"response": failed}))
        else:
            self.answer.keep(self.blocks.blocks)
            final = self.answer.response(status, output, usage(finish), incomplete=incomplete)
            out.append(self._event(f"response.{status}", {"response": final}))
        return [b for b in out if b]


# ------------------------------------------------------------------ routes


class ResponsesGeneration(Generation):
    """A Responses request, planned: one choice, answered as a response object or its stream."""

    def __init__(self, gen: GenerationRequest, answer: _Answer, tools: ToolSpec | None):
        super().__init__([gen], {"X-Request-Id": answer.response_id})
        self.answer_of = answer
        self.tools = tools

    def stream_format(self) -> StreamFormat:
        return ResponsesStream(self.answer_of, self.tools)

    def answer(self, choices: list[Collected]) -> object:
        (got,) = choices
        blocks = split_output(got.text, self.tools)
        status, incomplete = status_of(got.finish)
        self.answer_of.keep(blocks)
        return self.answer_of.response(
            status, output_items(blocks, status), usage(got.finish), incomplete=incomplete
        )


def plan_response(
    gw: Gateway, req: ResponsesRequest, model: str, store: ResponseStore
) -> ResponsesGeneration:
    """The generation request of a Responses request, continuing its previous response (404 for
    one not stored)."""
    history: list[TemplateMessage] = []
    if req.previous_response_id is not None:
        found = store.get(req.previous_response_id)
        if found is None:
            raise APIError(
                404,
                f"Previous response with id '{req.previous_response_id}' not found: it was created with "
                f"store=false, or evicted (this server keeps the last {store.max_responses} stored "
                "responses in memory, and none across restarts)",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        history = found
    rid = _item_id("resp")
    plan = to_chat(req, history)
    planned = translate.chat_plan(plan.chat, gw.config, gw.runtime, rid)
    tools = ToolSpec.from_plan(planned.spec, new_call_id)
    answer = _Answer(req, plan, rid, model, int(time.time()), store)
    return ResponsesGeneration(planned.gen, answer, tools)


def routes(gw: Gateway) -> list[Route]:
    """POST /v1/responses, with its own store for previous_response_id."""
    store = ResponseStore()

    def plan(gw: Gateway, req: ResponsesRequest, model: str) -> ResponsesGeneration:
        return plan_response(gw, req, model, store)

    door = FrontDoor("create_response", ResponsesRequest, "input", plan)
    return [gw.route("/v1/responses", endpoint.handler(door), ["POST"])]
