"""Trace replay: requests recorded one per JSONL line, grouped into conversations.

A line is a JSON object:

    {"conversation_id": "c7", "offset_s": 12.5, "max_tokens": 128,
     "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}]}

with `prompt` (a string, sent to /v1/completions) instead of `messages` (sent to
/v1/chat/completions). `offset_s` (seconds after the start, >= 0) is when the request is sent
when the trace is replayed at its own pace. Lines of one conversation keep their file order.
The recorded messages are sent as they are: a replayed request does not depend on the reply
the server gives now.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .workloads import Outcome, RequestSpec

_KEYS = {"conversation_id", "messages", "prompt", "offset_s", "max_tokens"}


@dataclass
class TraceConversation:
    """The recorded requests of one conversation, sent in file order whatever the replies."""

    conversation_id: str
    specs: list[RequestSpec]
    _next: int = field(default=0)

    def next_request(self) -> RequestSpec | None:
        return self.specs[self._next] if self._next < len(self.specs) else None

    def record_reply(self, spec: RequestSpec, outcome: Outcome, text: str) -> None:
        self._next += 1


def _parse_line(obj: object, where: str, turn_index: int) -> RequestSpec:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object per line, got {type(obj).__name__}")
    unknown = set(obj) - _KEYS
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    cid, messages, prompt = obj.get("conversation_id"), obj.get("messages"), obj.get("prompt")
    offset, max_tokens = obj.get("offset_s", 0.0), obj.get("max_tokens")
    if not isinstance(cid, str) or not cid:
        raise ValueError(f'{where}: "conversation_id" must be a non-empty string')
    if (messages is None) == (prompt is None):
        raise ValueError(f'{where}: give exactly one of "messages" (chat) or "prompt" (text)')
    if messages is not None and not (
        isinstance(messages, list)
        and messages
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
    ):
        raise ValueError(f'{where}: "messages" must be a non-empty list of {{"role", "content"}}')
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f'{where}: "prompt" must be a string')
    if not isinstance(offset, (int, float)) or isinstance(offset, bool) or offset < 0:
        raise ValueError(f'{where}: "offset_s" must be a number >= 0 (seconds after the start)')
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f'{where}: "max_tokens" must be an integer >= 1')
    return RequestSpec(
        conversation_id=cid,
        turn_index=turn_index,
        max_tokens=max_tokens,
        messages=tuple(messages) if messages is not None else None,
        prompt=prompt,
        offset_s=float(offset),
    )


def load_trace(path: str | Path) -> list[TraceConversation]:
    """Parse a JSONL trace. Raises ValueError naming the line and the fix on bad input."""
    by_id: dict[str, list[RequestSpec]] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg}); one object per line") from None
            cid = obj.get("conversation_id") if isinstance(obj, dict) else None
            turn = len(by_id.get(cid, [])) if isinstance(cid, str) else 0
            spec = _parse_line(obj, where, turn)
            by_id.setdefault(spec.conversation_id, []).append(spec)
    if not by_id:
        raise ValueError(f"{path}: the trace is empty; write one JSON request per line")
    return [TraceConversation(cid, specs) for cid, specs in by_id.items()]


def write_trace(path: str | Path, specs: list[RequestSpec]) -> None:
    """Write specs as a trace (the inverse of `load_trace`, up to turn numbering)."""
    with open(path, "w", encoding="utf-8") as f:
        for s in specs:
            obj: dict[str, object] = {
                "conversation_id": s.conversation_id,
                "offset_s": s.offset_s or 0.0,
                "max_tokens": s.max_tokens,
            }
            if s.messages is not None:
                obj["messages"] = list(s.messages)
            else:
                obj["prompt"] = s.prompt
            f.write(json.dumps(obj) + "\n")
