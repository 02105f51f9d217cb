"""Where a chat prompt's turns start, as token offsets: the scheduler's checkpoint rule turn.

Design: a pool whose slots cannot be cut back to an earlier turn (sliding-window rings,
recurrent state: `Runtime.turn_captures`) needs a checkpoint wherever a later request may
diverge from this one; in agent conversations that is where a turn starts: the last user
message (edited or resent) and each assistant turn (regenerated, or rendered differently once
it is history). The template alone knows where those are, so each is found by rendering the
messages before it: up to the last user message without a generation prompt, up to an assistant
message with one (where the reply that became it was generated; without one if that is not how
the conversation renders). A rendering that is not a text prefix of the prompt's is dropped.

Text offsets become token offsets through the tokens' bytes (`Runtime.token_bytes`, else the
tokenizer's): a boundary
counts only where a prompt token starts exactly at its byte, and nothing is offered when the
tokens do not spell the rendered text byte for byte (a tokenizer that adds or drops bytes). The
offsets only place checkpoints: the checkpoint holds the prompt's own tokens up to the offset,
so a misplaced one costs a useless snapshot, never a wrong answer.

Cost: one rendering per boundary, of the last user message and the last MAX_ASSISTANT_TURNS
assistant turns (earlier turns were boundaries of earlier requests, captured then); no
tokenizing beyond the prompt's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .json_types import TemplateMessage, TemplateTool
from .runtime import Runtime

MAX_ASSISTANT_TURNS = 4


def turn_offsets(
    runtime: Runtime,
    messages: list[TemplateMessage],
    tools: list[TemplateTool] | None,
    prompt_ids: Sequence[int],
) -> tuple[int, ...]:
    """Ascending token offsets of `prompt_ids` (the chat prompt of `messages`, with the generation
    prompt) where the last user message and the last assistant turns start; () when the pool
    does not need them or they cannot be placed exactly (module docstring)."""
    table = runtime.token_bytes or getattr(runtime.tokenizer, "token_bytes", None)
    if not runtime.turn_captures or runtime.chat is None or table is None or not prompt_ids:
        return ()
    messages, tools = runtime.tool_messages(messages, tools)
    try:
        full = runtime.chat.render(messages, add_generation_prompt=True, tools=tools)
    except ValueError:  # the template refused: the prompt itself would have failed first
        return ()
    starts = _turn_starts(runtime, messages, tools, full)
    if not starts:
        return ()
    pieces = [table[int(t)] for t in prompt_ids]
    data = full.encode()
    if b"".join(pieces) != data:
        return ()
    ends = np.cumsum(np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces)))
    out = set()
    for c in starts:
        b = len(full[:c].encode())
        n = int(np.searchsorted(ends, b))  # first token ending at or past byte b
        if n < len(pieces) and ends[n] == b and 0 < n + 1 < len(pieces):
            out.add(n + 1)
    return tuple(sorted(out))


def _turn_starts(
    runtime: Runtime, messages: list[TemplateMessage], tools: list[TemplateTool] | None, full: str
) -> list[int]:
    """Character offsets in `full` where the last user message and the last assistant turns
    start (renderings of the messages before each that are a proper text prefix of `full`)."""
    chat = runtime.chat
    assert chat is not None
    users = [i for i, m in enumerate(messages) if m.get("role") == "user" and i > 0]
    assistants = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]
    cuts: list[tuple[int, tuple[bool, ...]]] = [(i, (True, False)) for i in assistants[-MAX_ASSISTANT_TURNS:]]
    if users:
        cuts.append((users[-1], (False,)))
    out = []
    for i, ways in cuts:
        for with_generation_prompt in ways:
            try:
                text = chat.render(messages[:i], add_generation_prompt=with_generation_prompt, tools=tools)
            except ValueError:  # some templates refuse a conversation cut there
                continue
            if 0 < len(text) < len(full) and full.startswith(text):
                out.append(len(text))
                break
    return sorted(set(out))
