"""Which rendered part of a chat prompt a token offset falls in: where a prompt missed the cache.

Design: the scheduler says how many prompt tokens matched the best source it held
(`Divergence.shared_len`); a user needs to know what that is in their conversation: the system
prompt, the tools, message i (and its role), or the generation prompt after the last message.
Only the template knows, so the part is found by rendering: the renderings of messages[:i]
(without a generation prompt) are text prefixes of the prompt's, growing with i, and a binary
search finds the last one that ends at or before the offset's byte: the offset is in message i.
Inside the system turn, the tools are the span where the system turn rendered with and without
tools differ. Cost: O(log messages) renderings, and only for a request that missed (the gateway
asks after the finish).

A template whose renderings are not prefixes of one another (one that rewrites earlier turns,
e.g. drops past reasoning) still gets an answer: the search then names the first message whose
rendering stops being a prefix, which is where the prompt stops matching the previous turn's.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from .json_types import TemplateMessage, TemplateTool
from .runtime import Runtime

CONTEXT_CHARS = 40  # text shown on each side of the divergence


class PartKind(str, enum.Enum):
    """The rendered part of a chat prompt (label of slotserve_prefix_divergence_total)."""

    SYSTEM = "system"  # the system turn (or the template's preamble before the first message)
    TOOLS = "tools"  # the tool declarations the template renders
    MESSAGE = "message"  # a user, assistant or tool message
    GENERATION_PROMPT = "generation_prompt"  # after the last message: the assistant header
    PROMPT = "prompt"  # a raw prompt (completions): no parts


@dataclass(frozen=True, slots=True)
class PromptPart:
    kind: PartKind
    index: int | None  # the message's index in the request's messages (MESSAGE, SYSTEM)
    role: str | None
    before: str  # the prompt's text just before the offset
    after: str  # ... and from it on


class PromptSource:
    """A chat request's prompt as the gateway planned it, to locate a divergence later
    (memoised: the first answer is kept, so a request is located at most once per offset)."""

    def __init__(
        self,
        runtime: Runtime,
        messages: list[TemplateMessage],
        tools: list[TemplateTool] | None,
        prompt_ids: Sequence[int],
    ) -> None:
        self.runtime = runtime
        self.messages = messages
        self.tools = tools
        self.prompt_ids = prompt_ids
        self._found: dict[int, PromptPart] = {}

    def part_at(self, offset: int) -> PromptPart:
        part = self._found.get(offset)
        if part is None:
            part = self._found[offset] = locate(
                self.runtime, self.messages, self.tools, self.prompt_ids, offset
            )
        return part


def _byte_offset(token_bytes: Sequence[bytes], ids: Sequence[int], n: int) -> int:
    return sum(len(token_bytes[int(t)]) for t in ids[:n])


def _render(
    runtime: Runtime, messages: list[TemplateMessage], tools: list[TemplateTool] | None
) -> str | None:
    assert runtime.chat is not None
    try:
        return runtime.chat.render(messages, add_generation_prompt=False, tools=tools)
    except ValueError:
        return None


def locate(
    runtime: Runtime,
    messages: list[TemplateMessage],
    tools: list[TemplateTool] | None,
    prompt_ids: Sequence[int],
    offset: int,
) -> PromptPart:
    """The part of the chat prompt `prompt_ids` (rendered from `messages` and `tools`) that holds
    token `offset` (module docstring)."""
    table = runtime.token_bytes or getattr(runtime.tokenizer, "token_bytes", None)
    text = runtime.decode(prompt_ids)
    head = runtime.decode(prompt_ids[:offset])
    before, after = head[-CONTEXT_CHARS:], text[len(head) : len(head) + CONTEXT_CHARS]
    if runtime.chat is None or not messages or table is None:
        return PromptPart(PartKind.PROMPT, None, None, before, after)
    at = _byte_offset(table, prompt_ids, offset)
    messages, tools = runtime.tool_messages(messages, tools)
    data = text.encode()

    def ends_before(i: int) -> bool:
        """Whether messages[:i] render to a prefix of the prompt ending at or before `at`."""
        r = _render(runtime, messages[:i], tools)
        if r is None:
            return False
        b = r.encode()
        return data.startswith(b) and len(b) <= at

    if tools and _in_tools(runtime, messages, tools, at):
        return PromptPart(PartKind.TOOLS, None, None, before, after)
    lo, hi = 0, len(messages)  # the last i whose rendering ends at or before `at`
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ends_before(mid):
            lo = mid
        else:
            hi = mid - 1
    if lo == len(messages):
        return PromptPart(PartKind.GENERATION_PROMPT, None, None, before, after)
    role = str(messages[lo].get("role"))
    kind = PartKind.SYSTEM if role == "system" else PartKind.MESSAGE
    return PromptPart(kind, lo, role, before, after)


def _in_tools(runtime: Runtime, messages: list[TemplateMessage], tools: list[TemplateTool], at: int) -> bool:
    """Whether byte `at` is inside the tool declarations: the span where the first message
    rendered with and without tools differs (templates declare tools in one block)."""
    plain = _render(runtime, messages[:1], None)
    full = _render(runtime, messages[:1], tools)
    if plain is None or full is None:
        return False
    a, b = plain.encode(), full.encode()
    n = min(len(a), len(b))
    start = next((k for k in range(n) if a[k] != b[k]), n)
    return start <= at < start + max(1, len(b) - len(a))
