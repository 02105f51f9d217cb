"""OpenAI's Responses API bodies as msgspec Structs (`responses_api.py` serves them).

Decoding validates types and ranges; unknown fields are ignored (Codex and the Agents SDK send
many: `reasoning`, `include`, `prompt_cache_key`, ...). Input items and content parts of every
type decode into one Struct each, so that `responses_api.to_chat` can refuse the types it does not
serve with a 400 naming them.
"""

from __future__ import annotations

import msgspec
from msgspec import Struct

from . import protocol as p
from .json_types import JSON, JSONObject

# ------------------------------------------------------------------ request bodies


class InputContent(Struct, kw_only=True):
    type: str  # input_text | output_text (others are refused)
    text: str | None = None


class InputItem(Struct, kw_only=True):
    """Any input item; `type` (or a `role` without one: a message) decides which fields count."""

    type: str | None = None  # message | function_call | function_call_output (others are refused)
    role: str | None = None  # message: user | assistant | system | developer
    content: str | list[InputContent] | None = None  # message
    call_id: str | None = None  # function_call, function_call_output
    name: str | None = None  # function_call
    arguments: str | None = None  # function_call
    output: str | list[InputContent] | None = None  # function_call_output
    id: str | None = None
    status: str | None = None
    summary: list[InputContent] | None = None  # reasoning: summary_text parts
    encrypted_content: str | None = None  # reasoning (not decrypted here: ignored)


class FunctionTool(Struct, kw_only=True):
    type: str  # only "function" is served
    name: str | None = None
    description: str | None = None
    parameters: JSONObject | None = None
    strict: bool | None = None


class TextFormat(Struct, kw_only=True):
    type: str  # text | json_object | json_schema
    name: str | None = None
    schema: JSONObject | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(Struct, kw_only=True):
    format: TextFormat | None = None
    verbosity: str | None = None  # accepted, not used


class ResponsesRequest(Struct, kw_only=True):
    input: str | list[InputItem]
    model: str | None = None
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: JSON = None  # auto | none | required | {"type": "function", "name": N}
    parallel_tool_calls: bool | None = None  # false: at most one function_call item
    max_output_tokens: p.PositiveInt | None = None
    temperature: p.Temperature | None = None
    top_p: p.TopP | None = None
    text: TextConfig | None = None
    store: bool = True
    stream: bool = False
    return_progress: bool = False  # streamed: prefill progress comments until the first token
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    background: bool = False  # refused when true
    conversation: JSON = None  # refused when given
    prompt_cache_key: str | None = None  # keeps the conversation on its slot (policy.Affinity)
    user: str | None = None  # the same, when prompt_cache_key is absent
    speculative: bool = True  # slotserve's: false opts this request out of speculative decoding
    # accepted and not used: reasoning (no model here reasons), include, truncation,
    # service_tier, ... (unknown fields are ignored)


# ------------------------------------------------------------------ response bodies


class OutputText(Struct, tag="output_text", tag_field="type", kw_only=True):
    text: str
    annotations: list[JSON] = msgspec.field(default_factory=list)
    logprobs: list[JSON] = msgspec.field(default_factory=list)


class MessageItem(Struct, tag="message", tag_field="type", kw_only=True):
    id: str
    status: str  # in_progress | completed | incomplete
    content: list[OutputText]
    role: str = "assistant"


class FunctionCallItem(Struct, tag="function_call", tag_field="type", kw_only=True):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


class ReasoningText(Struct, tag="reasoning_text", tag_field="type"):
    text: str


class ReasoningItem(Struct, tag="reasoning", tag_field="type", kw_only=True):
    id: str
    summary: list[JSONObject]  # no summaries are written: []
    content: list[ReasoningText]  # the thinking as generated
    status: str


OutputItem = MessageItem | FunctionCallItem | ReasoningItem


class InputTokensDetails(Struct):
    cached_tokens: int  # prompt tokens reused from a slot or checkpoint


class OutputTokensDetails(Struct):
    reasoning_tokens: int = 0


class ResponseUsage(Struct):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ErrorInfo(Struct):
    code: str
    message: str


class IncompleteDetails(Struct):
    reason: str  # max_output_tokens


class ResponseObject(Struct, kw_only=True):
    id: str
    created_at: int
    model: str
    status: str  # in_progress | completed | incomplete | failed
    output: list[OutputItem]
    usage: ResponseUsage | None
    error: ErrorInfo | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    tool_choice: JSON = "auto"
    tools: list[JSON] = msgspec.field(default_factory=list)
    slotserve: p.SlotserveInfo | msgspec.UnsetType = msgspec.UNSET  # the reuse account (at the end)
    parallel_tool_calls: bool = True
    text: JSON = None
    store: bool = True
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    truncation: str = "disabled"
    object: str = "response"
