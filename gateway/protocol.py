"""Request and response bodies as msgspec Structs.

Design: decoding a request validates it (types and ranges via `Meta`), and unknown fields are
ignored, because OpenAI clients send many we do not use. Checks that span fields or need the
server's limits (max_tokens against --max-tokens-limit, n against the slots, supported content
parts, OpenAI fields accepted but not honoured) live in `translate.py`. Responses are Structs too, so what goes on the wire is written down here.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

from .json_types import JSON, JSONObject

# ------------------------------------------------------------------ shared request pieces

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
PositiveInt = Annotated[int, Meta(ge=1)]
TokenId = Annotated[int, Meta(ge=0)]
Seed = int  # any int64; the gateway folds it into 0..2**63-1
TopK = Annotated[int, Meta(ge=-1)]  # -1 and 0 both mean "off" (vLLM and llama.cpp spellings)
StopList = Annotated[list[str], Meta(max_length=16)]


class StreamOptions(Struct):
    include_usage: bool = False


class ContentPart(Struct):
    type: str  # only "text" is served
    text: str | None = None


class FunctionCall(Struct):
    name: str
    arguments: str = ""


class ToolCall(Struct):
    function: FunctionCall
    id: str | None = None
    type: str = "function"


class ChatMessage(Struct):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None  # an assistant turn's thinking, for templates that render it


class FunctionDef(Struct, omit_defaults=True):  # None fields stay out of the rendered tools
    name: str
    description: str | None = None
    parameters: JSONObject | None = None  # a JSON schema
    strict: bool | None = None  # True: calls are held to `parameters` by constrained decoding


class ToolDef(Struct):
    function: FunctionDef
    type: str = "function"


class JsonSchemaFormat(Struct):
    name: str = "response"
    schema: JSONObject | None = None  # None: any JSON object
    description: str | None = None
    strict: bool | None = None  # accepted either way: the schema is always enforced


class ResponseFormat(Struct):
    type: str  # "text" | "json_object" | "json_schema"
    json_schema: JsonSchemaFormat | None = None


TopLogprobs = Annotated[int, Meta(ge=0, le=20)]


class SamplingFields(Struct, frozen=True, kw_only=True):
    """Fields shared by chat and text completions (OpenAI's, plus vLLM/llama.cpp extensions)."""

    model: str | None = None
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: Probability | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: str | StopList | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    speculative: bool = True  # slotserve's: false opts this request out of speculative decoding
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_progress: bool = False  # streamed: prefill progress chunks until the first token (llama.cpp's)
    n: Annotated[int, Meta(ge=1, le=128)] = 1  # choices; at most the number of slots
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    response_format: ResponseFormat | None = None
    user: str | None = None  # a session key (endpoint.session_key) when prompt_cache_key is absent
    prompt_cache_key: str | None = None  # keeps the conversation on its slot (policy.Affinity)
    # OpenAI fields this server does not honour: any value but the inert one is a 400 naming it
    # (translate.UNHONOURED); any JSON decodes, so that the 400 says so instead of a type error.
    functions: JSON = None
    function_call: JSON = None
    audio: JSON = None
    modalities: JSON = None
    prediction: JSON = None
    web_search_options: JSON = None
    reasoning_effort: JSON = None
    service_tier: JSON = None
    store: JSON = None


class ChatCompletionRequest(SamplingFields, frozen=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    tools: list[ToolDef] | None = None
    tool_choice: JSON = None  # "none" | "auto" | "required" | {"type": "function", "function": {"name": N}}
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None


class CompletionRequest(SamplingFields, frozen=True):
    # a string, a list of token ids, or a one-element list of either (OpenAI's batch form)
    prompt: str | list[str | int | list[int]]
    logprobs: TopLogprobs | None = None  # k: the sampled token's logprob and the k best
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


class TokenizeRequest(Struct):
    """llama.cpp (`content`) and vLLM (`prompt` or `messages`) spellings are both accepted."""

    model: str | None = None
    content: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # BOS in front (when the model has one): llama.cpp's name, then vLLM's. When neither is given,
    # `prompt` is tokenized as /v1/completions would (BOS if the model asks for it), `content`
    # without BOS (llama.cpp's default).
    add_special: bool | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True  # with `messages`


class DetokenizeRequest(Struct):
    tokens: list[TokenId]
    model: str | None = None


# ------------------------------------------------------------------ responses


class PromptTokensDetails(Struct):
    cached_tokens: int  # prompt tokens reused from a slot or checkpoint (not computed)


class CompletionTokensDetails(Struct):
    """Details of completion_tokens, each present when any is: OpenAI's predicted-output counts
    (here the speculative draft tokens taken from the conversation itself, confirmed by the model
    or not) and the reply's thinking block (gateway/reasoning.py)."""

    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    reasoning_tokens: int = 0


class Usage(Struct, omit_defaults=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    # only when speculative decoding drafted for the request (--speculative) or the reply thought
    completion_tokens_details: CompletionTokensDetails | None = None


class PromptPartOut(Struct, omit_defaults=True):
    """A rendered part of the prompt (gateway/prompt_parts.py)."""

    kind: str  # system | tools | message | generation_prompt | prompt
    index: int | None = None  # the message's index in the request (message, system)
    role: str | None = None


class DivergenceOut(Struct):
    """Where the prompt left what the server held, and why less was reused (scheduler/divergence.py)."""

    offset: int  # prompt tokens shared with the best source held (the divergence's token offset)
    reason: str  # none | prompt_changed | cold | window | recurrent | busy | evicted | budget | reuse_off
    part: PromptPartOut  # the rendered part the offset falls in
    text_before: str  # the prompt's own text just before the offset
    text_after: str  # ... and from it on
    evicted_tokens: int  # evicted | budget: how much of it the server held once


class SlotserveInfo(Struct):
    """slotserve's own account of the request: where its prompt prefix came from."""

    reuse_source: str  # none | rewind | copy | checkpoint_memory | checkpoint_disk
    reused_tokens: int
    prefilled_tokens: int
    slot: int | None
    timings: dict[str, float]
    divergence: DivergenceOut | None = None  # present when less than the prompt (but 1) was reused
    drafted_tokens: int = 0  # speculative draft tokens verified (every route; usage only on OpenAI's)
    accepted_tokens: int = 0  # of those, confirmed by the model


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprobOut(Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Struct):
    content: list[TokenLogprobOut] | None


class FunctionCallOut(Struct):
    name: str
    arguments: str  # a JSON object, as text


class ToolCallOut(Struct):
    id: str
    function: FunctionCallOut
    type: str = "function"


class AssistantMessage(Struct, omit_defaults=True):
    # NOTE: no defaults on the fields that must always be sent (omit_defaults drops defaults)
    role: str  # "assistant"
    content: str | None  # None when the reply is only tool calls
    tool_calls: list[ToolCallOut] | None = None
    reasoning_content: str | None = None  # the thinking block (--reasoning-format deepseek/auto)


class ChatChoice(Struct):
    index: int
    message: AssistantMessage
    finish_reason: str
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    slotserve: SlotserveInfo
    object: str = "chat.completion"
    system_fingerprint: str | None = None


class FunctionDelta(Struct, omit_defaults=True):
    name: str | None = None
    arguments: str | None = None


class ToolCallDeltaOut(Struct, omit_defaults=True):
    index: int
    id: str | None = None
    type: str | None = None  # "function" on a call's first delta
    function: FunctionDelta | None = None


class Delta(Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDeltaOut] | None = None


class ChatChunkChoice(Struct):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class PromptProgress(Struct):
    """Prefill progress of a streamed request that asked for it (`return_progress`, as
    llama.cpp's): prompt tokens in all, reused from the cache, processed so far (reused
    included), milliseconds since the request was accepted."""

    total: int
    cache: int
    processed: int
    time_ms: int


class ChatCompletionChunk(Struct, omit_defaults=True, kw_only=True):
    # NOTE: no defaults on the fields that must always be sent (omit_defaults drops defaults)
    id: str
    object: str  # "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None  # only on the last chunk, with stream_options.include_usage
    slotserve: SlotserveInfo | None = None  # on the chunk that carries finish_reason
    prompt_progress: PromptProgress | None = None  # return_progress: chunks with no choices


class CompletionLogprobs(Struct):
    """The legacy completions shape: parallel lists, one entry per generated token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(Struct):
    index: int
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None


class Completion(Struct, omit_defaults=True, kw_only=True):
    id: str
    object: str  # "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    slotserve: SlotserveInfo | None = None
    prompt_progress: PromptProgress | None = None  # streamed, with return_progress


class ModelCard(Struct, kw_only=True):
    """One served model, in OpenAI's shape plus Anthropic's (`type`, `display_name`,
    `created_at`), so both SDKs' `models.list()` read it."""

    id: str
    created: int
    max_model_len: int
    created_at: str  # RFC 3339 spelling of `created` (Anthropic's field)
    object: str = "model"
    owned_by: str = "slotserve"
    type: str = "model"  # Anthropic's
    display_name: str = ""  # Anthropic's; the id


class ModelList(Struct, kw_only=True):
    data: list[ModelCard]
    object: str = "list"
    # Anthropic's page fields: one page holds every served name
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None


class TokenizeResponse(Struct):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeResponse(Struct):
    content: str  # llama.cpp's name
    prompt: str  # vLLM's name; same text
