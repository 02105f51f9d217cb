"""Scheduler events -> OpenAI SSE chunks: the two stream formats, `ChatStream`
(chat.completion.chunk) and `CompletionStream` (text_completion), on openai_reply.py's pieces
(finish reasons, usage, `slotserve` info, errors of a finish, logprobs, `OutputSpec`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar, Generic, TypeVar

import msgspec

from ..scheduler.request import FinishEvent, PrefillProgress, TokenEvent, TokenLogprob
from . import protocol as p
from .errors import APIError
from .openai_reply import (
    OutputSpec,
    chat_logprobs,
    completion_logprobs,
    failure,
    finish_reason,
    slotserve_info,
    usage_of,
)
from .reasoning import ReasoningFormat, ReasoningSplitter
from .streaming import StreamFormat, progress_object, sse_data
from .tool_stream import StreamingToolParser, ToolCallDelta

_encode = msgspec.json.Encoder().encode


def _error_chunk(err: APIError) -> bytes:
    return sse_data(_encode(err.body()))


Choice = TypeVar("Choice", p.ChatChunkChoice, p.CompletionChoice)


class _OpenAIStream(StreamFormat, Generic[Choice]):
    """What chat and text-completion streams share: their ids, the chunk envelope (`_ENVELOPE`
    with `object` `_OBJECT`), the per-choice finish chunks (with `slotserve` info; one error
    chunk for a failed choice), and the usage chunk after every choice finished
    (stream_options.include_usage)."""

    _ENVELOPE: ClassVar[Callable[..., msgspec.Struct]]  # the chunk Struct, taking list[Choice]
    _OBJECT: ClassVar[str]

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
        return self._ENVELOPE(
            id=self.request_id,
            object=self._OBJECT,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage,
            slotserve=slotserve,
            prompt_progress=prompt_progress,
        )

    def _choice_chunk(self, choice: Choice, slotserve: p.SlotserveInfo | None) -> bytes:
        """One chunk of one choice."""
        return sse_data(_encode(self._envelope([choice], slotserve=slotserve)))

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

    _ENVELOPE = p.ChatCompletionChunk
    _OBJECT = "chat.completion.chunk"

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
        return self._choice_chunk(choice, slotserve)

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

    _ENVELOPE = p.Completion
    _OBJECT = "text_completion"

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
        return self._choice_chunk(choice, slotserve)

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
