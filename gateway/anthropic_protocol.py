"""Anthropic's Messages API bodies as msgspec Structs (`anthropic_api.py` serves them).

Decoding validates types and ranges; unknown fields are ignored (clients send many: `betas`,
`context_management`, ...). Content blocks of every type decode into one `ContentBlock`, so that
`anthropic_api.to_chat` can refuse the types it does not serve with a 400 naming them.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import UNSET, Meta, Struct, UnsetType

from . import protocol as p
from .json_types import JSON, JSONObject

# ------------------------------------------------------------------ request bodies


class CacheControl(Struct, kw_only=True):
    type: str = "ephemeral"
    ttl: str | None = None  # accepted; a checkpoint lives as long as the store keeps it


class ContentBlock(Struct, kw_only=True):
    """Any request content block; `type` decides which fields count (checked in `to_chat`)."""

    type: str  # text | tool_use | tool_result | thinking (assistant turns; others are refused)
    text: str | None = None  # text
    thinking: str | None = None  # thinking (its `signature` is ignored)
    id: str | None = None  # tool_use
    name: str | None = None  # tool_use
    input: JSON = None  # tool_use: the arguments object
    tool_use_id: str | None = None  # tool_result
    content: str | list[ContentBlock] | None = None  # tool_result: text or text blocks
    is_error: bool = False  # tool_result
    cache_control: CacheControl | None = None


class MessageParam(Struct):
    role: str  # user | assistant
    content: str | list[ContentBlock]


class ToolParam(Struct, kw_only=True):
    name: str
    description: str | None = None
    input_schema: JSONObject | None = None
    type: str | None = None  # None or "custom": a client tool; anything else is a server tool
    strict: bool | None = None  # true: calls are held to input_schema
    cache_control: CacheControl | None = None


class ToolChoiceParam(Struct, kw_only=True):
    type: str  # auto | any | tool | none
    name: str | None = None  # with type "tool"
    disable_parallel_tool_use: bool | None = None  # true: at most one tool_use block


class ThinkingParam(Struct, kw_only=True):
    type: str  # enabled | disabled (a thinking model thinks either way; the budget is not enforced)
    budget_tokens: int | None = None


class OutputFormat(Struct, kw_only=True):
    type: str  # json_schema
    schema: JSONObject | None = None


class OutputConfig(Struct, kw_only=True):
    format: OutputFormat | None = None  # structured output (the chat route's json_schema)
    effort: str | None = None  # accepted, not used


class CountTokensRequest(Struct, kw_only=True):
    """The body of /v1/messages/count_tokens, and the base of a Messages request."""

    model: str
    messages: Annotated[list[MessageParam], Meta(min_length=1)]
    system: str | list[ContentBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    cache_control: CacheControl | None = None  # top level: a breakpoint on the last block
    output_config: OutputConfig | None = None
    mcp_servers: JSON = None  # refused when given


class DiagnosticsParam(Struct, kw_only=True):
    """`diagnostics`: the id of this client's previous message (null on a first turn: opt in)."""

    previous_message_id: str | None = None


class MessagesRequest(CountTokensRequest, kw_only=True):
    max_tokens: p.PositiveInt  # required, as Anthropic requires it
    stop_sequences: p.StopList | None = None
    stream: bool = False
    return_progress: bool = False  # streamed: prefill progress in ping events until the first token
    # NOTE: temperature, top_p and top_k are gone from Anthropic's current SDK but older clients
    # send them; they are served (temperature in Anthropic's range 0..1)
    temperature: p.Probability | None = None
    top_p: p.TopP | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    metadata: JSONObject | None = None  # metadata.user_id: a session key (endpoint.session_key)
    diagnostics: DiagnosticsParam | None = None  # cache diagnostics (gateway/cache_diagnostics.py)
    speculative: bool = True  # slotserve's: false opts this request out of speculative decoding
    container: JSON = None  # refused when given


# ------------------------------------------------------------------ response bodies


class Usage(Struct):
    input_tokens: int  # prompt tokens neither reused nor written at a cache breakpoint
    output_tokens: int
    cache_creation_input_tokens: int  # computed up to the request's cache_control breakpoint
    cache_read_input_tokens: int  # reused from a slot or checkpoint


class TextBlockOut(Struct, tag="text", tag_field="type"):
    text: str


class ThinkingBlockOut(Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str = ""  # nothing to verify: the thinking is replayed as the client sends it


class ToolUseBlockOut(Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: JSONObject


class DiagnosticsOut(Struct):
    """Why this request missed the previous one's cache; cache_miss_reason null: it did not."""

    cache_miss_reason: JSONObject | None


class Message(Struct, kw_only=True):
    id: str
    model: str
    content: list[TextBlockOut | ToolUseBlockOut | ThinkingBlockOut]
    stop_reason: str | None  # end_turn | max_tokens | stop_sequence | tool_use (None in message_start)
    stop_sequence: str | None
    usage: Usage
    type: str = "message"
    role: str = "assistant"
    # present only when the request carried `diagnostics` (UNSET fields are not encoded)
    diagnostics: DiagnosticsOut | UnsetType = UNSET
    slotserve: p.SlotserveInfo | UnsetType = UNSET  # the reuse account (streamed: in message_delta)


class ErrorBody(Struct):
    type: str
    message: str


class ErrorEnvelope(Struct):
    type: str  # "error"
    error: ErrorBody
