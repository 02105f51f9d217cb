"""OpenAI request bodies -> `GenerationRequest`; scheduler events -> OpenAI response bodies.

Every check that needs the server's limits or spans fields lives here and raises `APIError`
(400, with `param` naming the field), so the routes stay thin.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from ..scheduler.request import FinishEvent, FinishReason, GenerationRequest, SamplingParams
from . import protocol as p
from .config import ServeConfig
from .errors import APIError, bad_request
from .runtime import PromptError, Runtime
from .streaming import StreamFormat, sse_data

SEED_MOD = 2**63
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions

_encode = msgspec.json.Encoder().encode


# ------------------------------------------------------------------ requests


def sampling_params(
    req: p.ChatCompletionRequest | p.CompletionRequest,
    config: ServeConfig,
    runtime: Runtime,
    *,
    max_tokens: int | None,
    default_max_tokens: int,
    max_tokens_param: str = "max_tokens",
) -> SamplingParams:
    """Map the sampling fields, enforcing --max-tokens-limit and the unsupported options
    (`max_tokens_param`: the body field `max_tokens` came from, named by its error)."""
    if req.n != 1:
        raise bad_request("Only n=1 is supported; send one request per completion", param="n")
    if req.logprobs not in (None, False, 0):
        raise bad_request("logprobs are not supported by this server", param="logprobs")
    wanted = default_max_tokens if max_tokens is None else max_tokens
    if wanted > config.max_tokens_limit:
        raise bad_request(
            f"{max_tokens_param}={wanted} exceeds this server's limit of {config.max_tokens_limit}",
            param=max_tokens_param,
        )
    if req.stop is None:
        stop: tuple[str, ...] = ()
    elif isinstance(req.stop, str):
        stop = (req.stop,)
    else:
        stop = tuple(req.stop)
    if any(s == "" for s in stop):
        raise bad_request("stop strings must not be empty", param="stop")
    stop_ids = tuple(req.stop_token_ids or ())
    if any(t >= runtime.n_vocab for t in stop_ids):
        raise bad_request(
            f"stop_token_ids must be below the vocabulary size {runtime.n_vocab}", param="stop_token_ids"
        )
    top_k = req.top_k if req.top_k is not None and req.top_k > 0 else 0
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_k=top_k,
        top_p=1.0 if req.top_p is None else req.top_p,
        min_p=0.0 if req.min_p is None else req.min_p,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        seed=None if req.seed is None else req.seed % SEED_MOD,
        max_tokens=wanted,
        stop=stop,
        stop_token_ids=stop_ids,
        ignore_eos=req.ignore_eos,
    )


def _message_dict(i: int, m: p.ChatMessage) -> dict[str, Any]:
    """One message as the chat template expects it: role, content text, and tool fields."""
    if m.role not in CHAT_ROLES:
        raise bad_request(
            f"role must be one of {', '.join(sorted(CHAT_ROLES))}; got {m.role!r}",
            param=f"messages[{i}].role",
        )
    if isinstance(m.content, list):
        texts = []
        for j, part in enumerate(m.content):
            if part.type != "text":
                raise bad_request(
                    f"only text content parts are supported; got type {part.type!r}",
                    param=f"messages[{i}].content[{j}]",
                )
            if part.text is None:
                raise bad_request(
                    "a content part of type 'text' needs a string field `text`",
                    param=f"messages[{i}].content[{j}].text",
                )
            texts.append(part.text)
        content = "".join(texts)
    else:
        content = m.content or ""
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
    if m.name is not None:
        out["name"] = m.name
    if m.tool_calls:
        out["tool_calls"] = msgspec.to_builtins(m.tool_calls)
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def chat_messages(req: p.ChatCompletionRequest | p.TokenizeRequest) -> list[dict[str, Any]]:
    return [_message_dict(i, m) for i, m in enumerate(req.messages or [])]


def chat_request(
    req: p.ChatCompletionRequest, config: ServeConfig, runtime: Runtime, request_id: str
) -> GenerationRequest:
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request(
            f"response_format {req.response_format.type!r} is not supported; only 'text'",
            param="response_format",
        )
    messages = chat_messages(req)
    tools = msgspec.to_builtins(req.tools) if req.tools else None
    try:
        ids, hint = runtime.encode_chat(messages, tools)
    except PromptError as exc:
        raise bad_request(str(exc), param="messages") from None
    if req.max_completion_tokens is not None:
        max_tokens, max_tokens_param = req.max_completion_tokens, "max_completion_tokens"
    else:
        max_tokens, max_tokens_param = req.max_tokens, "max_tokens"
    params = sampling_params(
        req,
        config,
        runtime,
        max_tokens=max_tokens,
        default_max_tokens=config.default_max_tokens,
        max_tokens_param=max_tokens_param,
    )
    return GenerationRequest(prompt_ids=ids, params=params, request_id=request_id, prefix_hint=hint)


def completion_prompt_ids(req: p.CompletionRequest, runtime: Runtime) -> list[int]:
    """The prompt as ids: a string, a list of ids, or a one-element list of either."""
    prompt: Any = req.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # OpenAI's batch form with a single prompt
    if isinstance(prompt, str):
        ids = runtime.encode_prompt(prompt)
    elif all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
        if any(t < 0 or t >= runtime.n_vocab for t in ids):
            raise bad_request(f"prompt token ids must be in 0..{runtime.n_vocab - 1}", param="prompt")
    else:
        raise bad_request(
            "prompt must be one string or one list of token ids; batched prompts are not supported",
            param="prompt",
        )
    if not ids:
        raise bad_request("prompt must not be empty", param="prompt")
    return ids


def completion_request(
    req: p.CompletionRequest, config: ServeConfig, runtime: Runtime, request_id: str
) -> GenerationRequest:
    if req.echo:
        raise bad_request("echo is not supported", param="echo")
    if req.suffix:
        raise bad_request("suffix is not supported", param="suffix")
    if req.best_of not in (None, 1):
        raise bad_request("best_of is not supported", param="best_of")
    ids = completion_prompt_ids(req, runtime)
    params = sampling_params(
        req,
        config,
        runtime,
        max_tokens=req.max_tokens,
        default_max_tokens=min(COMPLETIONS_DEFAULT_MAX_TOKENS, config.max_tokens_limit),
    )
    return GenerationRequest(prompt_ids=ids, params=params, request_id=request_id)


# ------------------------------------------------------------------ responses


def finish_reason(finish: FinishEvent) -> str:
    """OpenAI's finish_reason. NOTE: a timeout that produced tokens reports "length", as llama.cpp
    does when its prediction time limit stops a request: the output was cut short (`failure`
    turns a timeout without any token into an error instead)."""
    if finish.reason is FinishReason.STOP:
        return "stop"
    return "length"


def usage(finish: FinishEvent) -> p.Usage:
    cached = finish.reuse.reused_tokens if finish.reuse is not None else 0
    return p.Usage(
        prompt_tokens=finish.prompt_tokens,
        completion_tokens=finish.completion_tokens,
        total_tokens=finish.prompt_tokens + finish.completion_tokens,
        prompt_tokens_details=p.PromptTokensDetails(cached_tokens=cached),
    )


def slotserve_info(finish: FinishEvent) -> p.SlotserveInfo:
    r = finish.reuse
    return p.SlotserveInfo(
        reuse_source=r.source.value if r is not None else "none",
        reused_tokens=r.reused_tokens if r is not None else 0,
        prefilled_tokens=r.prefilled_tokens if r is not None else 0,
        slot=r.slot if r is not None else None,
        timings=dict(finish.timings),
    )


def failure(finish: FinishEvent) -> APIError | None:
    """The error a finish event stands for, if it is not a normal end of generation."""
    if finish.reason is FinishReason.ERROR:
        return APIError(
            500,
            f"generation failed: {finish.error or 'engine error'}",
            type="server_error",
            code="engine_error",
        )
    if finish.reason is FinishReason.CANCELLED:  # the server cancelled it: drain past its grace period
        return APIError(
            503,
            "the request was cancelled because the server is shutting down",
            type="service_unavailable_error",
            code="cancelled",
        )
    if finish.reason is FinishReason.TIMEOUT and finish.completion_tokens == 0:
        return APIError(
            503,
            "the request reached the server's time limit (--request-timeout) before its first "
            "token; the server is busy or the prompt is long: retry later",
            type="service_unavailable_error",
            code="timeout",
        )
    return None


def chat_completion(
    request_id: str, model: str, created: int, text: str, finish: FinishEvent
) -> p.ChatCompletion:
    return p.ChatCompletion(
        id=request_id,
        created=created,
        model=model,
        choices=[
            p.ChatChoice(
                index=0, message=p.AssistantMessage(content=text), finish_reason=finish_reason(finish)
            )
        ],
        usage=usage(finish),
        slotserve=slotserve_info(finish),
    )


def completion(request_id: str, model: str, created: int, text: str, finish: FinishEvent) -> p.Completion:
    return p.Completion(
        id=request_id,
        object="text_completion",
        created=created,
        model=model,
        choices=[p.CompletionChoice(index=0, text=text, finish_reason=finish_reason(finish))],
        usage=usage(finish),
        slotserve=slotserve_info(finish),
    )


def _error_chunk(err: APIError) -> bytes:
    return sse_data(_encode(err.body()))


class _OpenAIStream(StreamFormat):
    """What chat and text-completion streams share: their ids, and the closing chunks (the
    released text, the finish chunk with `slotserve` info, the optional usage chunk; or one
    error chunk for a failed request)."""

    def __init__(self, request_id: str, model: str, include_usage: bool):
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage

    def _envelope(self, choices: list[Any], **extra: Any) -> msgspec.Struct:
        raise NotImplementedError

    def _finish_chunk(self, reason: str, info: p.SlotserveInfo) -> bytes:
        raise NotImplementedError

    def closing(self, finish: FinishEvent, text: str) -> list[bytes]:
        err = failure(finish)
        if err is not None:
            return [_error_chunk(err)]
        out = [self.delta(text)] if text else []
        out.append(self._finish_chunk(finish_reason(finish), slotserve_info(finish)))
        if self.include_usage:
            out.append(sse_data(_encode(self._envelope([], usage=usage(finish)))))
        return out


class ChatStream(_OpenAIStream):
    """chat.completion.chunk events: role delta, content deltas, finish chunk, optional usage."""

    def _chunk(self, delta: p.Delta, finish: str | None = None, **extra: Any) -> bytes:
        choice = p.ChatChunkChoice(index=0, delta=delta, finish_reason=finish)
        return sse_data(_encode(self._envelope([choice], **extra)))

    def _envelope(self, choices: list[Any], **extra: Any) -> p.ChatCompletionChunk:
        return p.ChatCompletionChunk(
            id=self.request_id,
            object="chat.completion.chunk",
            created=self.created,
            model=self.model,
            choices=choices,
            **extra,
        )

    def _finish_chunk(self, reason: str, info: p.SlotserveInfo) -> bytes:
        return self._chunk(p.Delta(), reason, slotserve=info)

    def opening(self) -> list[bytes]:
        return [self._chunk(p.Delta(role="assistant", content=""))]

    def delta(self, text: str) -> bytes:
        return self._chunk(p.Delta(content=text))


class CompletionStream(_OpenAIStream):
    """text_completion events: text deltas, finish chunk, optional usage."""

    def _chunk(self, text: str, finish: str | None = None, **extra: Any) -> bytes:
        choice = p.CompletionChoice(index=0, text=text, finish_reason=finish)
        return sse_data(_encode(self._envelope([choice], **extra)))

    def _envelope(self, choices: list[Any], **extra: Any) -> p.Completion:
        return p.Completion(
            id=self.request_id,
            object="text_completion",
            created=self.created,
            model=self.model,
            choices=choices,
            **extra,
        )

    def _finish_chunk(self, reason: str, info: p.SlotserveInfo) -> bytes:
        return self._chunk("", reason, slotserve=info)

    def delta(self, text: str) -> bytes:
        return self._chunk(text)
