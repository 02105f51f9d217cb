"""Thinking in generated text: `<think>...</think>` split from the answer, whole or streamed.

Design: reasoning models (Qwen3, the DeepSeek-R1 distills) write their thinking first, between
`<think>` and `</think>`, then the answer. Some templates open the block in the prompt (the
DeepSeek-R1 distills' generation prompt ends with `<think>\\n`): the reply then starts inside it
and only `</think>` is generated. `--reasoning-format` (llama.cpp's names) says what to do:

    none             leave everything in the content
    deepseek, auto   the thinking goes to `reasoning_content` (streamed as its own deltas), the
                     content is what follows `</think>` (its leading blank stripped)
    deepseek-legacy  the content keeps the `<think>` block as written; `reasoning_content` is
                     filled as well (whole replies; streamed, the block stays in the content)

Only a block at the very start of the reply counts (after leading whitespace): a `<think>` later
in an answer is text. A reply cut before `</think>` is all thinking. Plain text in, plain data
out, shared by every front door (reasoning_content, Anthropic thinking blocks, Responses
reasoning items).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_WS = " \t\r\n"


class ReasoningFormat(str, enum.Enum):
    NONE = "none"
    DEEPSEEK = "deepseek"
    DEEPSEEK_LEGACY = "deepseek-legacy"
    AUTO = "auto"  # as deepseek


def prompt_opens_thinking(prompt_text: str) -> bool:
    """Does the rendered prompt end inside an open `<think>` block (the reply starts thinking)?"""
    tail = prompt_text.rstrip(_WS)
    return tail.endswith(THINK_OPEN)


@dataclass(frozen=True, slots=True)
class SplitReply:
    reasoning: str | None  # the thinking (None: the reply did not think)
    content: str  # the answer (with the block, for deepseek-legacy)
    thinking_text: str = ""  # the thinking as generated, tags included (for token counts)


def split_reasoning(text: str, *, opened: bool, fmt: ReasoningFormat = ReasoningFormat.AUTO) -> SplitReply:
    """A whole reply split (see the module docstring). `opened`: the prompt opened the block."""
    splitter = ReasoningSplitter(opened=opened, fmt=fmt)
    r1, c1 = splitter.feed(text)
    r2, c2 = splitter.finish()
    reasoning = r1 + r2
    return SplitReply(reasoning if splitter.thought else None, c1 + c2, splitter.thinking_text)


@dataclass(slots=True)
class ReasoningSplitter:
    """Released text in, (reasoning, content) out, in order.

    Contract: feed() every released text, then finish() once; the pieces joined equal
    `split_reasoning` on the whole text. With fmt none or deepseek-legacy everything is content
    (legacy: `split_reasoning` fills the reasoning of a whole reply; a stream keeps it inline)."""

    opened: bool = False
    fmt: ReasoningFormat = ReasoningFormat.AUTO
    thought: bool = False  # a thinking block was seen (or the prompt opened one)
    thinking_text: str = ""  # the block as generated, tags included
    _state: str = "start"  # start (undecided) | think | answer_start (strip blank) | answer
    _buf: str = ""

    def __post_init__(self) -> None:
        if self.opened:
            self._state, self.thought = "think", True

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning: list[str] = []
        content: list[str] = []
        while self._buf:
            if self._state == "start":
                head = self._buf.lstrip(_WS)
                if head.startswith(THINK_OPEN):
                    self.thought = True
                    self.thinking_text += self._buf[: len(self._buf) - len(head) + len(THINK_OPEN)]
                    self._buf = head[len(THINK_OPEN) :]
                    self._state = "think"
                    if self._legacy:
                        content.append(self.thinking_text)
                    continue
                if not head or THINK_OPEN.startswith(head):
                    break  # undecided: blank, or the tag arriving
                self._state = "answer"
                continue
            if self._state == "think":
                at = self._buf.find(THINK_CLOSE)
                if at >= 0:
                    piece, self._buf = self._buf[:at], self._buf[at + len(THINK_CLOSE) :]
                    self.thinking_text += piece + THINK_CLOSE
                    reasoning.append(piece)
                    if self._legacy:
                        content.append(piece + THINK_CLOSE)
                    self._state = "answer_start"
                    continue
                keep = _held_prefix_len(self._buf, THINK_CLOSE)
                piece, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
                self.thinking_text += piece
                reasoning.append(piece)
                if self._legacy:
                    content.append(piece)
                break
            if self._state == "answer_start":
                head = self._buf.lstrip(_WS)
                if not head:
                    if self._legacy:
                        content.append(self._buf)
                    self._buf = ""
                    break
                if self._legacy:
                    content.append(self._buf[: len(self._buf) - len(head)])
                self._buf, self._state = head, "answer"
                continue
            content.append(self._buf)
            self._buf = ""
        return self._out(reasoning, content)

    def finish(self) -> tuple[str, str]:
        """End of the reply: an undecided start is content, a thinking block cut short ends here."""
        buf, self._buf = self._buf, ""
        if self._state == "think":
            self.thinking_text += buf
            return self._out([buf], [buf] if self._legacy else [])
        if self._state == "answer_start":
            return self._out([], [buf] if self._legacy else [])
        return self._out([], [buf])

    @property
    def _legacy(self) -> bool:
        return self.fmt is ReasoningFormat.DEEPSEEK_LEGACY

    def _out(self, reasoning: list[str], content: list[str]) -> tuple[str, str]:
        return "".join(reasoning), "".join(content)


def _held_prefix_len(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0
