"""OpenAI's Responses API (`POST /v1/responses`) over the chat path.

Design: as `anthropic_api.py`: `responses_chat.to_chat` translates the request into the
`ChatInput` every chat request becomes, planned by `translate.chat_plan` and run by
`endpoint.py`'s skeleton; the answer is assembled by `agent_output` into `message` and
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
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from starlette.routing import Route

from ..scheduler.request import FinishEvent, FinishReason, GenerationRequest
from . import endpoint, openai_reply, translate
from .agent_output import (
    ArgsDelta,
    Block,
    BlockAssembler,
    BlockEvent,
    BlockKind,
    BlockStart,
    BlockStop,
    TextDelta,
    ThinkSpec,
    ToolSpec,
    split_output,
)
from .endpoint import FrontDoor, Generation
from .errors import APIError
from .json_types import TemplateMessage
from .prompt_parts import PromptSource
from .reasoning import split_reasoning
from .response_store import ResponseStore
from .responses_chat import ChatPlan, assistant_message, to_chat
from .responses_protocol import (
    ErrorInfo,
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    MessageItem,
    OutputItem,
    OutputText,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from .state import Gateway
from .streaming import Collected, StreamFormat, sse_event

_encode = msgspec.json.Encoder().encode

# ------------------------------------------------------------------ request translation

# ------------------------------------------------------------------ answers


def usage(finish: FinishEvent, reasoning_tokens: int = 0) -> ResponseUsage:
    cached = finish.reuse.reused_tokens if finish.reuse is not None else 0
    return ResponseUsage(
        input_tokens=finish.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached),
        output_tokens=finish.completion_tokens,
        output_tokens_details=OutputTokensDetails(min(reasoning_tokens, finish.completion_tokens)),
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
        elif b.kind is BlockKind.THINKING:
            item_id = ids[i] if ids else _item_id("rs")
            out.append(ReasoningItem(id=item_id, summary=[], content=[ReasoningText(b.text)], status=status))
        else:
            item_id = ids[i] if ids else _item_id("fc")
            out.append(
                FunctionCallItem(
                    id=item_id, call_id=b.call_id, name=b.name, arguments=b.text, status="completed"
                )
            )
    return out


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
    count_tokens: Callable[[str], int] = len  # text -> tokens (reasoning_tokens)

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

    def __init__(
        self,
        answer: _Answer,
        tools: ToolSpec | None,
        thinking: ThinkSpec | None = None,
        parts: PromptSource | None = None,
    ):
        self.parts = parts  # to place the divergence of the final response's slotserve block
        self.answer = answer
        self.blocks = BlockAssembler(tools, thinking)
        self.seq = 0
        self.item_ids: dict[int, str] = {}

    def _event(self, name: str, body: dict[str, object]) -> bytes:
        data = _encode({"type": name, "sequence_number": self.seq, **body})
        self.seq += 1
        return sse_event(name, data)

    def opening(self) -> list[bytes]:
        start = self.answer.response("in_progress", [], None)
        return [
            self._event("response.created", {"response": start}),
            self._event("response.in_progress", {"response": start}),
        ]

    def _spell(self, events: list[BlockEvent], status: str = "completed") -> bytes:
        out = []
        for ev in events:
            i = ev.index
            if isinstance(ev, BlockStart) and ev.kind is BlockKind.THINKING:
                self.item_ids[i] = _item_id("rs")
                thinking = ReasoningItem(id=self.item_ids[i], summary=[], content=[], status="in_progress")
                out.append(self._event("response.output_item.added", {"output_index": i, "item": thinking}))
            elif isinstance(ev, TextDelta) and self.blocks.blocks[i].kind is BlockKind.THINKING:
                where = {"item_id": self.item_ids[i], "output_index": i, "content_index": 0}
                out.append(self._event("response.reasoning_text.delta", {**where, "delta": ev.text}))
            elif isinstance(ev, BlockStart):
                if ev.kind is BlockKind.TEXT:
                    self.item_ids[i] = _item_id("msg")
                    item: MessageItem | FunctionCallItem = MessageItem(
                        id=self.item_ids[i], status="in_progress", content=[]
                    )
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
                if block.kind is BlockKind.THINKING:
                    where = {"item_id": item_id, "output_index": i, "content_index": 0}
                    out.append(self._event("response.reasoning_text.done", {**where, "text": block.text}))
                elif block.kind is BlockKind.TEXT:
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

    def _usage(self, finish: FinishEvent) -> ResponseUsage:
        thought = self.blocks.thinking_text
        return usage(finish, self.answer.count_tokens(thought) if thought else 0)

    def closing(self, finish: FinishEvent, text: str) -> list[bytes]:
        err = openai_reply.failure(finish)
        status, incomplete = status_of(finish) if err is None else ("failed", None)
        out = [self._spell(self.blocks.finish(text), "incomplete" if status == "incomplete" else "completed")]
        output = output_items(
            self.blocks.blocks, "completed" if status == "completed" else "incomplete", self.item_ids
        )
        if err is not None:
            info = ErrorInfo(err.code or "server_error", err.message)
            failed = self.answer.response("failed", output, self._usage(finish), error=info)
            out.append(self._event("response.failed", {"response": failed}))
        else:
            self.answer.keep(self.blocks.blocks)
            final = self.answer.response(status, output, self._usage(finish), incomplete=incomplete)
            final = msgspec.structs.replace(
                final, slotserve=openai_reply.slotserve_info(finish, parts=self.parts)
            )
            out.append(self._event(f"response.{status}", {"response": final}))
        return [b for b in out if b]


# ------------------------------------------------------------------ routes


class ResponsesGeneration(Generation):
    """A Responses request, planned: one choice, answered as a response object or its stream."""

    def __init__(
        self,
        gen: GenerationRequest,
        answer: _Answer,
        tools: ToolSpec | None,
        thinking: ThinkSpec | None = None,
        parts: PromptSource | None = None,
    ):
        super().__init__([gen], {"X-Request-Id": answer.response_id}, parts)
        self.answer_of = answer
        self.tools = tools
        self.thinking = thinking

    def stream_format(self) -> StreamFormat:
        return ResponsesStream(self.answer_of, self.tools, self.thinking, self.parts)

    def answer(self, choices: list[Collected]) -> object:
        (got,) = choices
        blocks = split_output(got.text, self.tools, self.thinking)
        status, incomplete = status_of(got.finish)
        self.answer_of.keep(blocks)
        thought = (
            split_reasoning(got.text, opened=self.thinking.opened).thinking_text if self.thinking else ""
        )
        reasoning_tokens = self.answer_of.count_tokens(thought) if thought else 0
        out = self.answer_of.response(
            status, output_items(blocks, status), usage(got.finish, reasoning_tokens), incomplete=incomplete
        )
        return msgspec.structs.replace(
            out, slotserve=openai_reply.slotserve_info(got.finish, parts=self.parts)
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
    count = planned.spec.count_tokens or len
    answer = _Answer(req, plan, rid, model, int(time.time()), store, count)
    return ResponsesGeneration(
        planned.gen, answer, tools, ThinkSpec.from_plan(planned.spec), planned.spec.parts
    )


def routes(gw: Gateway) -> list[Route]:
    """POST /v1/responses, with its own store for previous_response_id."""
    store = ResponseStore()

    def plan(gw: Gateway, req: ResponsesRequest, model: str) -> ResponsesGeneration:
        return plan_response(gw, req, model, store)

    door = FrontDoor("create_response", ResponsesRequest, "input", plan)
    return [gw.route("/v1/responses", endpoint.handler(door), ["POST"])]
