"""The responses kept for `previous_response_id`: bounded, in memory, least recently used out.

One `ResponseStore` per app (`responses_api.routes`). It holds, per response id, the chat messages
the conversation ended with; nothing survives a restart. Bounds: MAX_STORED_RESPONSES entries and
MAX_STORED_BYTES of their messages' JSON.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass

from .json_types import TemplateMessage

MAX_STORED_RESPONSES = 1024  # responses kept for previous_response_id
MAX_STORED_BYTES = 64 * 2**20  # their conversations' JSON size, summed


@dataclass
class _Stored:
    messages: list[TemplateMessage]  # the conversation, without instructions, as the template reads it
    num_bytes: int


class ResponseStore:
    """Conversations of stored responses by id: at most `max_responses` and `max_bytes` (their
    JSON size), least recently used evicted first. A conversation larger than `max_bytes` alone
    is not kept. Single-threaded (the event loop)."""

    def __init__(self, max_responses: int = MAX_STORED_RESPONSES, max_bytes: int = MAX_STORED_BYTES):
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._items: OrderedDict[str, _Stored] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, response_id: str) -> list[TemplateMessage] | None:
        item = self._items.get(response_id)
        if item is None:
            return None
        self._items.move_to_end(response_id)
        return item.messages

    def put(self, response_id: str, messages: list[TemplateMessage]) -> bool:
        """Keep `messages` under `response_id`; False when too large to keep at all."""
        size = len(json.dumps(messages, ensure_ascii=False).encode())
        if size > self.max_bytes:
            return False
        old = self._items.pop(response_id, None)
        if old is not None:
            self.num_bytes -= old.num_bytes
        while self._items and (
            len(self._items) >= self.max_responses or self.num_bytes + size > self.max_bytes
        ):
            _, evicted = self._items.popitem(last=False)
            self.num_bytes -= evicted.num_bytes
        self._items[response_id] = _Stored(messages, size)
        self.num_bytes += size
        return True
