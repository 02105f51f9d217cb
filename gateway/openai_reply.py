"""Scheduler events -> OpenAI response bodies and SSE chunks (chat and text completions).

The response half of the OpenAI translation (translate.py builds the requests): finish reasons,
usage and `slotserve` info, errors a finish event stands for, logprobs, tool calls parsed from
the reply, whole responses, and the two stream formats (`ChatStream`, `CompletionStream`).
`OutputSpec` is the one object a translated request hands over: how its events become its answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import msgspec

from ..scheduler.divergence import MissReason
from ..scheduler.request import FinishEvent, FinishReason, PrefillProgress, TokenEvent, TokenLogprob
from . import protocol as p
from .errors import APIError
from .prompt_parts import PartKind, PromptSource
from .reasoning import ReasoningFormat, ReasoningSplitter, SplitReply, split_reasoning
from .streaming import Collected, StreamFormat, progress_object, sse_data
from .tool_calls import ParsedOutput, ToolCallFamily, parse_tool_calls
from .tool_stream import StreamingToolParser, ToolCallDelta

_encode = msgspec.json.Encoder().encode


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


def _error_chunk(err: APIError) -> bytes:
    return sse_data(_encode(err.body()))


Choice = TypeVar("Choice", p.ChatChunkChoice, p.CompletionChoice)


class _OpenAIStream(StreamFormat, Generic[Choice]):
    """What chat and text-completion streams share: their ids, the per-choice finish chunks
    (with `slotserve` info; one error chunk for a failed choice), and the usage chunk after
    every choice finished (stream_options.include_usage)."""

    def __init__(self, request_id: str, model: str, include_usage: bool, spec: OutputSpec | None = None):
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage
        self.spec = spec or OutputSpec()
        self._finishes: list[FinishEvent | None] = [None] * self.spec.n

    def _envelope(
        self,
        choices: list[Choice],
        *,
        usage: p.Usage | None = None,
        slotserve: p.SlotserveInfo | None = None,
        prompt_progress: p.PromptProgress | None = None,
    ) -> msgspec.Struct:
        """One chunk's envelope (fields left None are not sent)."""
        raise NotImplementedError

    def _finish_chunk(self, index: int, reason: str, info: p.SlotserveInfo) -> bytes:
        raise NotImplementedError

    def _text_chunks(
        self, index: int, text: str, logprobs: tuple[TokenLogprob, ...], final: bool
    ) -> list[bytes]:
        """Chunks for released text (and its tokens' logprobs) of choice `index`."""
        raise NotImplementedError

    def _reason(self, index: int, finish: FinishEvent) -> str:
        return finish_reason(finish)

    def delta(self, text: str) -> bytes:
        return b"".join(self._text_chunks(0, text, (), False))

    def on_token(self, index: int, event: TokenEvent) -> list[bytes]:
        lps = event.logprobs if self.spec.logprobs is not None else ()
        return self._text_chunks(index, event.text, lps, False)

    def on_finish(self, index: int, finish: FinishEvent) -> list[bytes]:
        self._finishes[index] = finish
        err = failure(finish)
        if err is not None:
            return [_error_chunk(err)]
        out = self._text_chunks(index, finish.text, (), True)
        out.append(self._finish_chunk(index, self._reason(index, finish), slotserve_info(finish, self.spec)))
        return out

    def closing(self, finish: FinishEvent, text: str) -> list[bytes]:
        return self.on_finish(0, finish) + self.ending()

    def progress(self, progress: PrefillProgress, time_ms: int) -> bytes:
        """A chunk with no choices carrying `prompt_progress` (llama.cpp's shape)."""
        pp = p.PromptProgress(**progress_object(progress, time_ms))
        return sse_data(_encode(self._envelope([], prompt_progress=pp)))

    def ending(self) -> list[bytes]:
        done = [f for f in self._finishes if f is not None]
        if not self.include_usage or len(done) != len(self._finishes) or any(failure(f) for f in done):
            return []
        return [sse_data(_encode(self._envelope([], usage=usage_of(done, self._reasoning_tokens()))))]

    def _reasoning_tokens(self) -> int | None:
        return None


class ChatStream(_OpenAIStream[p.ChatChunkChoice]):
    """chat.completion.chunk events: role delta per choice, content / tool-call deltas (with
    logprobs when asked), finish chunk per choice, optional usage."""

    def __init__(self, request_id: str, model: str, include_usage: bool, spec: OutputSpec | None = None):
        super().__init__(request_id, model, include_usage, spec)
        s = self.spec
        self._parsers = (
            [StreamingToolParser(s.tool_family, tool_names=s.tool_names) for _ in range(s.n)]
            if s.tool_family is not None
            else None
        )
        self._thinkers = (
            [ReasoningSplitter(opened=s.think_opened, fmt=s.reasoning) for _ in range(s.n)]
            if s.reasoning is not None
            else None
        )

    def _reasoning_tokens(self) -> int | None:
        if self._thinkers is None:
            return None
        return self.spec.reasoning_tokens([t.thinking_text for t in self._thinkers])

    def _chunk(
        self,
        index: int,
        delta: p.Delta,
        finish: str | None = None,
        logprobs: p.ChoiceLogprobs | None = None,
        slotserve: p.SlotserveInfo | None = None,
    ) -> bytes:
        choice = p.ChatChunkChoice(index=index, delta=delta, finish_reason=finish, logprobs=logprobs)
        return sse_data(_encode(self._envelope([choice], slotserve=slotserve)))

    def _envelope(
        self,
        choices: list[p.ChatChunkChoice],
        *,
        usage: p.Usage | None = None,
        slotserve: p.SlotserveInfo | None = None,
        prompt_progress: p.PromptProgress | None = None,
    ) -> p.ChatCompletionChunk:
        return p.ChatCompletionChunk(
            id=self.request_id,
            object="chat.completion.chunk",
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage,
            slotserve=slotserve,
            prompt_progress=prompt_progress,
        )

    def _finish_chunk(self, index: int, reason: str, info: p.SlotserveInfo) -> bytes:
        return self._chunk(index, p.Delta(), reason, slotserve=info)

    def _reason(self, index: int, finish: FinishEvent) -> str:
        if self._parsers is not None and self._parsers[index].tool_calls:
            return "tool_calls"
        return finish_reason(finish)

    def opening(self) -> list[bytes]:
        return [self._chunk(i, p.Delta(role="assistant", content="")) for i in range(self.spec.n)]

    def _text_chunks(
        self, index: int, text: str, logprobs: tuple[TokenLogprob, ...], final: bool
    ) -> list[bytes]:
        deltas: list[ToolCallDelta] = []
        reasoning = ""
        if self._thinkers is not None:
            thinker = self._thinkers[index]
            reasoning, text = thinker.feed(text)
            if final:
                more_r, more_c = thinker.finish()
                reasoning, text = reasoning + more_r, text + more_c
            if self.spec.reasoning is ReasoningFormat.DEEPSEEK_LEGACY:
                reasoning = ""  # streamed, the block stays in the content
        if self._parsers is not None:
            parser = self._parsers[index]
            text, deltas = parser.feed(text)
            if final:
                more, tail = parser.finish()
                text, deltas = text + more, deltas + tail
            if self.spec.max_calls is not None:
                deltas = [d for d in deltas if d.index < self.spec.max_calls]
        lp = chat_logprobs(self.spec, logprobs) if logprobs else None
        if not text and not deltas and lp is None and not reasoning:
            return []
        out = []
        if reasoning:
            out.append(self._chunk(index, p.Delta(reasoning_content=reasoning), logprobs=lp))
            lp = None
        if not text and not deltas and lp is None:
            return out
        # NOTE: as OpenAI streams calls: one entry per chunk, the header (id, name, empty
        # arguments) apart from the fragments; consecutive fragments of a call merge
        entries: list[p.ToolCallDeltaOut] = []
        for d in deltas:
            last = entries[-1] if entries else None
            if (
                d.id is None
                and last is not None
                and last.id is None
                and last.index == d.index
                and last.function
            ):
                last.function.arguments = (last.function.arguments or "") + d.arguments
                continue
            entries.append(
                p.ToolCallDeltaOut(
                    index=d.index,
                    id=d.id,
                    type="function" if d.id is not None else None,
                    function=p.FunctionDelta(name=d.name, arguments=d.arguments),
                )
            )
        if text or not entries:
            out.append(self._chunk(index, p.Delta(content=text), logprobs=lp))
            lp = None
        for e in entries:
            out.append(self._chunk(index, p.Delta(tool_calls=[e]), logprobs=lp))
            lp = None
        return out


class CompletionStream(_OpenAIStream[p.CompletionChoice]):
    """text_completion events: text deltas (with logprobs when asked), finish chunk per choice,
    optional usage."""

    def __init__(self, request_id: str, model: str, include_usage: bool, spec: OutputSpec | None = None):
        super().__init__(request_id, model, include_usage, spec)
        self._offsets = [0] * self.spec.n  # characters streamed per choice (logprobs text_offset)

    def _chunk(
        self,
        index: int,
        text: str,
        finish: str | None = None,
        logprobs: p.CompletionLogprobs | None = None,
        slotserve: p.SlotserveInfo | None = None,
    ) -> bytes:
        choice = p.CompletionChoice(index=index, text=text, finish_reason=finish, logprobs=logprobs)
        return sse_data(_encode(self._envelope([choice], slotserve=slotserve)))

    def _envelope(
        self,
        choices: list[p.CompletionChoice],
        *,
        usage: p.Usage | None = None,
        slotserve: p.SlotserveInfo | None = None,
        prompt_progress: p.PromptProgress | None = None,
    ) -> p.Completion:
        return p.Completion(
            id=self.request_id,
            object="text_completion",
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage,
            slotserve=slotserve,
            prompt_progress=prompt_progress,
        )

    def _finish_chunk(self, index: int, reason: str, info: p.SlotserveInfo) -> bytes:
        return self._chunk(index, "", reason, slotserve=info)

    def _text_chunks(
        self, index: int, text: str, logprobs: tuple[TokenLogprob, ...], final: bool
    ) -> list[bytes]:
        if not text and not logprobs:
            return []
        lp = completion_logprobs(self.spec, logprobs, self._offsets[index]) if logprobs else None
        self._offsets[index] += len(text)
        return [self._chunk(index, text, logprobs=lp)]
