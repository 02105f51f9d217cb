"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) over the chat path.

Design: a request is decoded into the Structs of `anthropic_protocol.py`, translated by
`anthropic_chat.to_chat` into the `ChatInput` every chat request becomes, and planned by
`translate.chat_plan`, the very function the chat route uses: same template, limits and
sampling checks; the route runs `endpoint.py`'s skeleton. The answer is assembled from the
generated text by `agent_output` (text and `tool_use` blocks) and spelled as a `message` object
or Anthropic's event stream:

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
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace

import msgspec
from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..scheduler.request import FinishEvent, FinishReason, GenerationRequest, PrefillProgress
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
    breakpoint_offset,
    split_output,
)
from .anthropic_chat import to_chat
from .anthropic_protocol import (
    CountTokensRequest,
    DiagnosticsOut,
    ErrorBody,
    ErrorEnvelope,
    Message,
    MessagesRequest,
    TextBlockOut,
    ThinkingBlockOut,
    ToolUseBlockOut,
    Usage,
)
from .cache_diagnostics import CacheMissReason, Fingerprint, FingerprintStore, diagnose, fingerprint
from .client_quirks import NORMALIZED_HEADER, Normalization, normalize_messages
from .endpoint import FrontDoor, Generation
from .errors import APIError, json_response
from .json_types import JSONObject
from .prompt_parts import PromptSource
from .state import Gateway
from .streaming import Collected, StreamFormat, progress_object, sse_event

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


def _tool_input(arguments: str) -> JSONObject:
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def content_blocks(blocks: list[Block]) -> list[TextBlockOut | ToolUseBlockOut | ThinkingBlockOut]:
    out: list[TextBlockOut | ToolUseBlockOut | ThinkingBlockOut] = []
    for b in blocks:
        if b.kind is BlockKind.TEXT:
            out.append(TextBlockOut(b.text))
        elif b.kind is BlockKind.THINKING:
            out.append(ThinkingBlockOut(b.text))
        else:
            out.append(ToolUseBlockOut(b.call_id, b.name, _tool_input(b.text)))
    return out


class MessagesStream(StreamFormat):
    """Anthropic's event stream for one request."""

    terminator = b""  # message_stop ends it

    def __init__(
        self,
        message_id: str,
        model: str,
        prompt_tokens: int,
        tools: ToolSpec | None,
        hint: int | None,
        thinking: ThinkSpec | None = None,
        watch: DiagnosticsWatch | None = None,
        parts: PromptSource | None = None,
    ):
        self.parts = parts  # to place the divergence of message_delta's slotserve block
        self.message_id = message_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.hint = hint
        self.watch = watch
        self.blocks = BlockAssembler(tools, thinking)

    @staticmethod
    def _event(name: str, body: dict[str, object]) -> bytes:
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
            diagnostics=self.watch.out() if self.watch is not None else UNSET,
        )
        return [self._event("message_start", {"message": start}), self._event("ping", {})]

    def _spell(self, events: list[BlockEvent]) -> bytes:
        out = []
        for ev in events:
            if isinstance(ev, BlockStart):
                block: JSONObject
                if ev.kind is BlockKind.TEXT:
                    block = {"type": "text", "text": ""}
                elif ev.kind is BlockKind.THINKING:
                    block = {"type": "thinking", "thinking": "", "signature": ""}
                else:
                    block = {"type": "tool_use", "id": ev.call_id, "name": ev.name, "input": {}}
                out.append(self._event("content_block_start", {"index": ev.index, "content_block": block}))
            elif isinstance(ev, TextDelta) and self.blocks.blocks[ev.index].kind is BlockKind.THINKING:
                delta = {"type": "thinking_delta", "thinking": ev.text}
                out.append(self._event("content_block_delta", {"index": ev.index, "delta": delta}))
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

    def keepalive(self) -> bytes:
        return self._event("ping", {})

    def progress(self, progress: PrefillProgress, time_ms: int) -> bytes:
        """A `ping` event that also carries `prompt_progress` (clients skip pings)."""
        return self._event("ping", {"prompt_progress": progress_object(progress, time_ms)})

    def closing(self, finish: FinishEvent, text: str) -> list[bytes]:
        err = openai_reply.failure(finish)
        if err is None and self.watch is not None:
            self.watch.done(finish)
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
        info = openai_reply.slotserve_info(finish, parts=self.parts)
        out.append(
            self._event(
                "message_delta", {"delta": delta, "usage": usage(finish, self.hint), "slotserve": info}
            )
        )
        out.append(self._event("message_stop", {}))
        return out


# ------------------------------------------------------------------ routes


@dataclass
class DiagnosticsWatch:
    """A request that carried `diagnostics`: its diagnosis, and its fingerprint to keep under its
    message id once it is answered (cache_diagnostics.py)."""

    store: FingerprintStore
    message_id: str
    fingerprint: Fingerprint
    reason: CacheMissReason | None

    def out(self) -> DiagnosticsOut:
        return DiagnosticsOut(self.reason.to_json() if self.reason is not None else None)

    def done(self, finish: FinishEvent) -> None:
        self.store.put(self.message_id, replace(self.fingerprint, output_tokens=finish.completion_tokens))


def watch_diagnostics(
    req: MessagesRequest, model: str, prompt_ids: list[int], message_id: str, store: FingerprintStore
) -> DiagnosticsWatch | None:
    """The diagnosis of a request that opted in with `diagnostics` (None if it did not)."""
    if req.diagnostics is None:
        return None
    fp = fingerprint(
        model=model,
        system=req.system,
        tools=req.tools,
        messages=req.messages,
        other=(req.tool_choice, req.thinking, req.output_config),
        prompt_ids=prompt_ids,
    )
    prev_id = req.diagnostics.previous_message_id
    reason = diagnose(store.get(prev_id), fp) if prev_id is not None else None
    return DiagnosticsWatch(store, message_id, fp, reason)


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
        thinking: ThinkSpec | None = None,
        parts: PromptSource | None = None,
        watch: DiagnosticsWatch | None = None,
    ):
        super().__init__([gen], {"X-Request-Id": message_id, "request-id": message_id}, parts)
        self.watch = watch
        self.gen = gen
        self.ctx_len = ctx_len  # tokens per slot (named by the refusal of a long prompt)
        self.message_id = message_id
        self.model = model
        self.tools = tools
        self.hint = hint
        self.thinking = thinking

    def refused(self, err: APIError) -> APIError:
        if err.code == "context_length_exceeded":  # Anthropic's spelling, which agents act on
            limit = self.ctx_len - 1
            err.message = (
                f"prompt is too long: {len(self.gen.prompt_ids)} tokens > {limit} maximum ({err.message})"
            )
            err.param = None  # the message must start as Anthropic's does
        return err

    def stream_format(self) -> StreamFormat:
        return MessagesStream(
            self.message_id,
            self.model,
            len(self.gen.prompt_ids),
            self.tools,
            self.hint,
            self.thinking,
            self.watch,
            self.parts,
        )

    def answer(self, choices: list[Collected]) -> object:
        (got,) = choices
        blocks = split_output(got.text, self.tools, self.thinking)
        has_calls = any(b.kind is BlockKind.TOOL_CALL for b in blocks)
        if self.watch is not None:
            self.watch.done(got.finish)
        return Message(
            id=self.message_id,
            model=self.model,
            content=content_blocks(blocks),
            stop_reason=stop_reason(got.finish, has_calls),
            stop_sequence=got.finish.stop_sequence,
            usage=usage(got.finish, self.hint),
            diagnostics=self.watch.out() if self.watch is not None else UNSET,
            slotserve=openai_reply.slotserve_info(got.finish, parts=self.parts),
        )


def plan_message(
    gw: Gateway, req: MessagesRequest, model: str, store: FingerprintStore | None = None
) -> MessagesGeneration:
    """The generation request, tool-call parsing and cache_control hint of a Messages request."""
    rid = f"msg_{uuid.uuid4().hex}"
    active = frozenset(Normalization(n) for n in gw.config.normalize)
    normalized, applied = normalize_messages(req, active)
    assert isinstance(normalized, MessagesRequest)
    req = normalized
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
    thinking = ThinkSpec.from_plan(planned.spec)
    watch = watch_diagnostics(req, model, gen.prompt_ids, rid, store) if store is not None else None
    out = MessagesGeneration(
        gen, rid, model, tools, hint, gw.runtime.ctx_len, thinking, planned.spec.parts, watch
    )
    if applied:
        out.headers[NORMALIZED_HEADER] = ", ".join(applied)
    return out


async def count_tokens(gw: Gateway, request: Request) -> Response:
    req = await gw.read_body(request, CountTokensRequest)
    gw.check_model(req.model)
    gen = translate.chat_plan(to_chat(req).chat, gw.config, gw.runtime, "count_tokens").gen
    return json_response({"input_tokens": len(gen.prompt_ids)})


def routes(gw: Gateway) -> list[Route]:
    """POST /v1/messages and /v1/messages/count_tokens, with Anthropic's error shape."""
    store = FingerprintStore()  # diagnostics.previous_message_id

    def plan(gw: Gateway, req: MessagesRequest, model: str) -> MessagesGeneration:
        return plan_message(gw, req, model, store)

    door = FrontDoor("create_message", MessagesRequest, "messages", plan)
    return [
        gw.route("/v1/messages", endpoint.handler(door), ["POST"], render_error=error_response),
        gw.route("/v1/messages/count_tokens", count_tokens, ["POST"], render_error=error_response),
    ]
