"""What the agent front doors share: generated text as ordered output blocks (text, tool call),
whole or streamed, and the prompt offset of a client's cache breakpoint.

Design: /v1/messages and /v1/responses both answer with a list of typed blocks (Anthropic's
`text` / `tool_use` content blocks, the Responses API's `message` / `function_call` output items).
`ToolSpec.from_plan` takes from the chat path whether a request's output is parsed for tool
calls at all (tools offered and tool_choice not "none"), in which syntax, and how many calls;
`split_output` turns a whole text into blocks, and `BlockAssembler` turns the stream of released
texts into block events that each front door spells in its own SSE vocabulary:

    BlockStart(i, THINKING)  TextDelta(i, s)...                 BlockStop(i)   (first, if any)
    BlockStart(i, TEXT)  TextDelta(i, s)...                     BlockStop(i)
    BlockStart(i, TOOL_CALL, call_id, name)  ArgsDelta(i, s)... BlockStop(i)

Tool-call syntax is `tool_calls.py`'s (per template family); nothing here knows HTTP.

`breakpoint_offset` maps a cache breakpoint (the end of one chat message, or a cut inside its
content) to a token offset of the prompt, for the scheduler's checkpoint hint.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .json_types import TemplateMessage, TemplateTool
from .openai_reply import OutputSpec
from .reasoning import ReasoningFormat, ReasoningSplitter, split_reasoning
from .runtime import PromptError, Runtime
from .tool_calls import ToolCallFamily, parse_tool_calls
from .tool_stream import StreamingToolParser, ToolCall, ToolCallDelta

# A breakpoint's rendering may end with the template's end-of-turn tokens (and one token merged
# across the cut) that the whole prompt does not have there; more than this many is a mismatch.
BREAKPOINT_TAIL_SLACK = 8


class BlockKind(str, enum.Enum):
    TEXT = "text"  # generated prose
    TOOL_CALL = "tool_call"  # a call the model wrote in its template family's syntax
    THINKING = "thinking"  # the reply's leading <think> block (reasoning.py), before the others


@dataclass(frozen=True, slots=True)
class ThinkSpec:
    """Whether a request's reply may open with a thinking block, split off into a THINKING block."""

    opened: bool = False  # the prompt ended inside <think>

    @classmethod
    def from_plan(cls, spec: OutputSpec) -> ThinkSpec | None:
        """From the chat path's OutputSpec: None when thinking stays in the text (format none or
        deepseek-legacy)."""
        if spec.reasoning is None or spec.reasoning is ReasoningFormat.DEEPSEEK_LEGACY:
            return None
        return cls(spec.think_opened)


@dataclass(slots=True)
class Block:
    """One finished output block."""

    kind: BlockKind
    text: str = ""  # TEXT: the text; TOOL_CALL: the arguments (JSON object text)
    call_id: str = ""  # TOOL_CALL only
    name: str = ""  # TOOL_CALL only


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """How to find tool calls in one request's output."""

    family: ToolCallFamily
    names: frozenset[str]  # the functions the request offered (other names stay text)
    new_id: Callable[[], str]  # call ids in the front door's spelling ("toolu_...", "call_...")
    max_calls: int | None = None  # parallel tool calls off: 1 (later calls are dropped)

    @classmethod
    def from_plan(cls, spec: OutputSpec, new_id: Callable[[], str]) -> ToolSpec | None:
        """From the chat path's `openai_reply.OutputSpec`; None when the output is not parsed (no
        tools offered, or tool_choice "none")."""
        if spec.tool_family is None:
            return None
        return cls(spec.tool_family, frozenset(spec.tool_names or ()), new_id, spec.max_calls)


def split_output(text: str, tools: ToolSpec | None, thinking: ThinkSpec | None = None) -> list[Block]:
    """A whole generated text as blocks: the thinking (if any), the text (if any), then each tool
    call."""
    if thinking is not None:
        got = split_reasoning(text, opened=thinking.opened)
        if got.reasoning is not None:
            return [Block(BlockKind.THINKING, got.reasoning), *split_output(got.content, tools)]
    if tools is None:
        return [Block(BlockKind.TEXT, text)] if text else []
    parsed = parse_tool_calls(text, tools.family, tool_names=tools.names, new_id=tools.new_id)
    out = [Block(BlockKind.TEXT, parsed.content)] if parsed.content else []
    out += [_call_block(c) for c in parsed.tool_calls[: tools.max_calls]]
    return out


def _call_block(call: ToolCall) -> Block:
    return Block(BlockKind.TOOL_CALL, call.arguments, call.id, call.name)


# ------------------------------------------------------------------ streamed blocks


@dataclass(frozen=True, slots=True)
class BlockStart:
    index: int
    kind: BlockKind
    call_id: str = ""
    name: str = ""


@dataclass(frozen=True, slots=True)
class TextDelta:
    index: int
    text: str


@dataclass(frozen=True, slots=True)
class ArgsDelta:
    index: int
    text: str  # a fragment of the call's arguments JSON


@dataclass(frozen=True, slots=True)
class BlockStop:
    index: int


BlockEvent = BlockStart | TextDelta | ArgsDelta | BlockStop


@dataclass(slots=True)
class BlockAssembler:
    """Released texts in, block events out; `blocks` holds every block, finished or open.

    Contract: `feed` each TokenEvent's text in order, then `finish` once with the FinishEvent's
    text. Every BlockStart is matched by one BlockStop before the next block starts, and
    `finish` closes the last block. Without a ToolSpec, all text is one TEXT block.
    """

    tools: ToolSpec | None
    thinking: ThinkSpec | None = None
    blocks: list[Block] = field(default_factory=list)
    _open: bool = False  # the last block in `blocks` is still open
    _held: str = ""  # whitespace not yet streamed (see `_text`)
    _parser: StreamingToolParser | None = None
    _thinker: ReasoningSplitter | None = None

    def __post_init__(self) -> None:
        if self.tools is not None:
            self._parser = StreamingToolParser(self.tools.family, self.tools.names, self.tools.new_id)
        if self.thinking is not None:
            self._thinker = ReasoningSplitter(opened=self.thinking.opened)

    @property
    def thinking_text(self) -> str:
        """The thinking block as generated, tags included ("" when the reply did not think)."""
        return self._thinker.thinking_text if self._thinker is not None else ""

    def feed(self, text: str) -> list[BlockEvent]:
        out: list[BlockEvent] = []
        if self._thinker is not None:
            reasoning, text = self._thinker.feed(text)
            out += self._think(reasoning)
        return out + self._content(text)

    def _content(self, text: str) -> list[BlockEvent]:
        if self._parser is None:
            return self._text(text)
        content, deltas = self._parser.feed(text)
        return self._text(content) + self._calls(deltas)

    def _think(self, reasoning: str) -> list[BlockEvent]:
        if not reasoning:
            return []
        out: list[BlockEvent] = []
        if not (self._open and self.blocks[-1].kind is BlockKind.THINKING):
            out += self._close()
            self.blocks.append(Block(BlockKind.THINKING))
            self._open = True
            out.append(BlockStart(len(self.blocks) - 1, BlockKind.THINKING))
        self.blocks[-1].text += reasoning
        out.append(TextDelta(len(self.blocks) - 1, reasoning))
        return out

    def finish(self, text: str) -> list[BlockEvent]:
        out = self.feed(text) if text else []
        if self._thinker is not None:
            reasoning, rest = self._thinker.finish()
            out += self._think(reasoning) + self._content(rest)
        if self._parser is not None:
            content, deltas = self._parser.finish()
            out += self._text(content) + self._calls(deltas)
        return out + self._close()

    @property
    def has_tool_calls(self) -> bool:
        return any(b.kind is BlockKind.TOOL_CALL for b in self.blocks)

    def _close(self) -> list[BlockEvent]:
        if not self._open:
            return []
        self._open = False
        return [BlockStop(len(self.blocks) - 1)]

    def _text(self, text: str) -> list[BlockEvent]:
        # NOTE: with tools, whitespace is held until text follows it: whitespace between or after calls
        # (the newline between two <tool_call> blocks) opens no block of its own, as the whole
        # text's parse strips it; a call or the end drops what is held
        if self.tools is not None and not text.strip():
            self._held += text
            return []
        if not text:
            return []
        text, self._held = self._held + text, ""
        out: list[BlockEvent] = []
        if not (self._open and self.blocks[-1].kind is BlockKind.TEXT):
            out += self._close()
            self.blocks.append(Block(BlockKind.TEXT))
            self._open = True
            out.append(BlockStart(len(self.blocks) - 1, BlockKind.TEXT))
        self.blocks[-1].text += text
        out.append(TextDelta(len(self.blocks) - 1, text))
        return out

    def _calls(self, deltas: Sequence[ToolCallDelta]) -> list[BlockEvent]:
        out: list[BlockEvent] = []
        for d in deltas:
            if (
                self.tools is not None
                and self.tools.max_calls is not None
                and d.index >= self.tools.max_calls
            ):
                continue
            if d.id is not None:  # a new call: its header
                self._held = ""
                out += self._close()
                self.blocks.append(Block(BlockKind.TOOL_CALL, "", d.id, d.name or ""))
                self._open = True
                out.append(BlockStart(len(self.blocks) - 1, BlockKind.TOOL_CALL, d.id, d.name or ""))
            if d.arguments:
                self.blocks[-1].text += d.arguments
                out.append(ArgsDelta(len(self.blocks) - 1, d.arguments))
        return out


# ------------------------------------------------------------------ cache breakpoints


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """A client's cache breakpoint in the chat messages a request became."""

    message: int  # index into the chat messages
    cut: int | None = None  # keep this many characters of that message's content; None: all of it


def breakpoint_offset(
    runtime: Runtime,
    messages: list[TemplateMessage],
    tools: list[TemplateTool] | None,
    bp: Breakpoint,
    prompt_ids: Sequence[int],
) -> int | None:
    """The prompt token offset where `bp` ends, or None if it cannot be placed exactly. The
    offset is always a proper prefix of the prompt (0 < offset < len(prompt_ids)).

    The end of a message: the messages up to it are rendered alone (no generation prompt)
    through the same `encode_chat` as the prompt; the offset is the common token prefix with
    the prompt, accepted only when what the partial rendering has beyond it is at most an
    end-of-turn's few tokens (a longer tail: the template renders a cut conversation otherwise).

    A cut inside a message: a marker is put at the cut and the whole conversation rendered as
    the prompt was (`render_chat`: the same template and tool rewriting); the text before the
    marker, tokenized, must be a prefix of the prompt's tokens but for the one token that may
    merge across the cut.
    """
    if bp.message >= len(messages):
        return None
    if bp.cut is None:
        try:
            ids, _ = runtime.encode_chat(
                [dict(m) for m in messages[: bp.message + 1]], tools, add_generation_prompt=False
            )
        except PromptError:
            return None
        n = _common_len(ids, prompt_ids)
        tail_ok = len(ids) - n <= BREAKPOINT_TAIL_SLACK
    else:
        marked = [dict(m) for m in messages]
        content = str(marked[bp.message].get("content") or "")
        marked[bp.message]["content"] = content[: bp.cut] + _MARKER + content[bp.cut :]
        try:
            text = runtime.render_chat(marked, tools)
            plain = runtime.render_chat(messages, tools)
        except ValueError:  # PromptError, or the template's own error
            return None
        at = text.find(_MARKER)
        if at < 0 or text.replace(_MARKER, "", 1) != plain:
            return None
        ids = runtime.encode_text(text[:at])
        n = _common_len(ids, prompt_ids)
        tail_ok = len(ids) - n <= 1
    if n == 0 or n >= len(prompt_ids) or not tail_ok:
        return None
    return n


_MARKER = "\ue000slotserve-breakpoint\ue001"  # private-use characters: never in a real prompt


def _common_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
