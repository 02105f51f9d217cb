"""Scheduler events -> OpenAI response bodies (chat and text completions).

The response half of the OpenAI translation (translate.py builds the requests): finish reasons,
usage and `slotserve` info, errors a finish event stands for, logprobs, tool calls parsed from
the reply, and whole responses; openai_stream.py streams the same as SSE chunks (`ChatStream`,
`CompletionStream`) on these pieces. `OutputSpec` is the one object a translated request hands
over: how its events become its answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..scheduler.divergence import MissReason
from ..scheduler.request import FinishEvent, FinishReason, TokenLogprob
from . import protocol as p
from .errors import APIError
from .prompt_parts import PartKind, PromptSource
from .reasoning import ReasoningFormat, SplitReply, split_reasoning
from .streaming import Collected
from .tool_calls import ParsedOutput, ToolCallFamily, parse_tool_calls


@dataclass(frozen=True)
class OutputSpec:
    """How a request's events become its answer, beyond text: choices, tool calls, logprobs."""

    n: int = 1
    tool_family: ToolCallFamily | None = None  # parse tool calls in this syntax (None: off)
    tool_names: frozenset[str] | None = None  # the functions offered
    max_calls: int | None = None  # parallel_tool_calls=false: 1
    logprobs: int | None = None  # None: off; k: top k per token
    token_bytes: Callable[[int], bytes] | None = None  # id -> bytes, for logprobs
    parts: PromptSource | None = None  # a chat prompt's parts, to place a divergence (None: raw prompt)
    reasoning: ReasoningFormat | None = None  # split a leading <think> block (None: off)
    think_opened: bool = False  # the prompt ends inside <think>: the reply starts thinking
    count_tokens: Callable[[str], int] | None = None  # text -> tokens, for reasoning_tokens

    def split(self, text: str) -> SplitReply | None:
        """The reply's thinking split off (None: reasoning off, or the reply did not think)."""
        if self.reasoning is None:
            return None
        got = split_reasoning(text, opened=self.think_opened, fmt=self.reasoning)
        return got if got.reasoning is not None else None

    def reasoning_tokens(self, thinking_texts: list[str]) -> int | None:
        """reasoning_tokens of usage: the thinking blocks (tags included) as tokens; None if none."""
        if not any(thinking_texts):
            return None
        count = self.count_tokens or len
        return sum(count(t) for t in thinking_texts if t)


def finish_reason(finish: FinishEvent) -> str:
    """OpenAI's finish_reason. NOTE: a timeout that produced tokens reports "length", as llama.cpp
    does when its prediction time limit stops a request: the output was cut short (`failure`
    turns a timeout without any token into an error instead)."""
    if finish.reason is FinishReason.STOP:
        return "stop"
    return "length"


def usage(finish: FinishEvent) -> p.Usage:
    return usage_of([finish])


def usage_of(finishes: list[FinishEvent], reasoning_tokens: int | None = None) -> p.Usage:
    """Usage of a request's choices: the prompt counted once (it was prefilled once and copied),
    completion tokens summed; cached tokens are the first choice's. `reasoning_tokens`: of the
    choices' thinking blocks (completion_tokens_details), None when no choice thought."""
    first = finishes[0]
    cached = first.reuse.reused_tokens if first.reuse is not None else 0
    completion = sum(f.completion_tokens for f in finishes)
    drafted = sum(f.drafted_tokens for f in finishes)
    accepted = sum(f.accepted_tokens for f in finishes)
    thought = min(reasoning_tokens, completion) if reasoning_tokens is not None else 0
    details = (
        p.CompletionTokensDetails(accepted, drafted - accepted, thought)
        if drafted or reasoning_tokens is not None
        else None
    )
    return p.Usage(
        prompt_tokens=first.prompt_tokens,
        completion_tokens=completion,
        total_tokens=first.prompt_tokens + completion,
        prompt_tokens_details=p.PromptTokensDetails(cached_tokens=cached),
        completion_tokens_details=details,
    )


def slotserve_info(
    finish: FinishEvent, spec: OutputSpec | None = None, parts: PromptSource | None = None
) -> p.SlotserveInfo:
    """slotserve's reuse account of a finished request (every route's `slotserve` block); the
    divergence is placed in `parts`, else in the spec's parts."""
    r = finish.reuse
    if parts is None and spec is not None:
        parts = spec.parts
    return p.SlotserveInfo(
        reuse_source=r.source.value if r is not None else "none",
        reused_tokens=r.reused_tokens if r is not None else 0,
        prefilled_tokens=r.prefilled_tokens if r is not None else 0,
        slot=r.slot if r is not None else None,
        timings=dict(finish.timings),
        divergence=divergence_info(finish, parts),
        drafted_tokens=finish.drafted_tokens,
        accepted_tokens=finish.accepted_tokens,
    )


def divergence_info(finish: FinishEvent, parts: PromptSource | None) -> p.DivergenceOut | None:
    """Where the prompt diverged and why, for a request that reused less than all of its prompt
    but the last token; None otherwise (and for a request that never reached a slot)."""
    d = finish.reuse.divergence if finish.reuse is not None else None
    if d is None or d.reason is MissReason.NONE:
        return None
    if parts is not None:
        part = parts.part_at(d.shared_len)
        where = p.PromptPartOut(part.kind.value, part.index, part.role)
        before, after = part.before, part.after
    else:
        where, before, after = p.PromptPartOut(PartKind.PROMPT.value), "", ""
    return p.DivergenceOut(d.shared_len, d.reason.value, where, before, after, d.evicted_len)


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


def _token_str(spec: OutputSpec, tid: int) -> tuple[str, list[int]]:
    assert spec.token_bytes is not None
    raw = spec.token_bytes(tid)
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(spec: OutputSpec, lps: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> p.ChoiceLogprobs:
    content = []
    for lp in lps:
        token, raw = _token_str(spec, lp.token_id)
        top = []
        for tid, value in lp.top:
            t, r = _token_str(spec, tid)
            top.append(p.TopLogprob(token=t, logprob=value, bytes=r))
        content.append(p.TokenLogprobOut(token=token, logprob=lp.logprob, bytes=raw, top_logprobs=top))
    return p.ChoiceLogprobs(content=content)


def completion_logprobs(
    spec: OutputSpec, lps: tuple[TokenLogprob, ...] | list[TokenLogprob], offset: int = 0
) -> p.CompletionLogprobs:
    """The legacy shape; `offset`: characters of this choice's text before these tokens."""
    tokens, values, tops, offsets = [], [], [], []
    for lp in lps:
        token, _ = _token_str(spec, lp.token_id)
        tokens.append(token)
        values.append(lp.logprob)
        tops.append({_token_str(spec, t)[0]: v for t, v in lp.top})
        offsets.append(offset)
        offset += len(token)
    return p.CompletionLogprobs(tokens=tokens, token_logprobs=values, top_logprobs=tops, text_offset=offsets)


def parse_reply(spec: OutputSpec, text: str) -> ParsedOutput:
    """The reply as content and tool calls (no tool parsing: all content)."""
    if spec.tool_family is None:
        return ParsedOutput(text, ())
    parsed = parse_tool_calls(text, spec.tool_family, tool_names=spec.tool_names)
    if spec.max_calls is not None and len(parsed.tool_calls) > spec.max_calls:
        parsed = ParsedOutput(parsed.content, parsed.tool_calls[: spec.max_calls])
    return parsed


def _chat_choice(index: int, got: Collected, spec: OutputSpec) -> p.ChatChoice:
    thought = spec.split(got.text)
    text = thought.content if thought is not None else got.text
    parsed = parse_reply(spec, text)
    reason = finish_reason(got.finish)
    calls = None
    if parsed.tool_calls:
        reason = "tool_calls"  # (a call cut short by max_tokens is content: see tool_stream.py)
        calls = [
            p.ToolCallOut(id=c.id, function=p.FunctionCallOut(name=c.name, arguments=c.arguments))
            for c in parsed.tool_calls
        ]
        content = parsed.content
    else:
        content = text
    return p.ChatChoice(
        index=index,
        message=p.AssistantMessage(
            role="assistant",
            content=content,
            tool_calls=calls,
            reasoning_content=thought.reasoning if thought is not None else None,
        ),
        finish_reason=reason,
        logprobs=chat_logprobs(spec, got.logprobs) if spec.logprobs is not None else None,
    )


def chat_completion(
    request_id: str, model: str, created: int, choices: list[Collected], spec: OutputSpec
) -> p.ChatCompletion:
    thoughts = [spec.split(c.text) for c in choices]
    return p.ChatCompletion(
        id=request_id,
        created=created,
        model=model,
        choices=[_chat_choice(i, got, spec) for i, got in enumerate(choices)],
        usage=usage_of(
            [c.finish for c in choices],
            spec.reasoning_tokens([t.thinking_text if t is not None else "" for t in thoughts]),
        ),
        slotserve=slotserve_info(choices[0].finish, spec),
    )


def completion(
    request_id: str, model: str, created: int, choices: list[Collected], spec: OutputSpec
) -> p.Completion:
    return p.Completion(
        id=request_id,
        object="text_completion",
        created=created,
        model=model,
        choices=[
            p.CompletionChoice(
                index=i,
                text=got.text,
                finish_reason=finish_reason(got.finish),
                logprobs=completion_logprobs(spec, got.logprobs) if spec.logprobs is not None else None,
            )
            for i, got in enumerate(choices)
        ],
        usage=usage_of([c.finish for c in choices]),
        slotserve=slotserve_info(choices[0].finish, spec),
    )
