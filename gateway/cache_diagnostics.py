"""Anthropic's cache diagnostics on `/v1/messages`: why a request missed the previous one's cache.

Design: a request that carries `diagnostics` (with `previous_message_id`, or null on the first
turn to opt in) has its prompt's fingerprint kept under the id of the message it is answered
with: hashes of the model, the system prompt, the tools, every message, and of the other
parameters that change the rendered prompt (tool_choice, thinking, output format). The next
request names that id; comparing the two fingerprints in Anthropic's order gives the first part
that changed, which is the `cache_miss_reason` type:

    model_changed -> system_changed -> tools_changed -> messages_changed (an earlier entry
    differs, or fewer entries) -> unavailable (only other prompt parameters differ)

An unknown or evicted id is `previous_message_not_found`; an unchanged prefix is no reason at
all (`diagnostics: null` in the answer, as Anthropic says when no divergence was detected).
`cache_missed_input_tokens` approximates what the previous prompt would have supplied from the
cache had its prefix matched: its prompt plus its answer, less the tokens this prompt shares with
the previous one. That is counted in blocks of BLOCK_TOKENS through chained block hashes (a few
bytes a block kept per fingerprint), so it is known when the request is planned, before it runs:
a stream's `message_start` carries the whole diagnosis, never a pending null.

Fingerprints are a few hashes each, kept in a bounded LRU (`FingerprintStore`) like the
responses behind `previous_response_id`; nothing survives a restart. Messages are hashed from
their canonical JSON, so a text given as a string or as one text block differs (as the rendered
prompt may); `cache_control` markers are left out (they do not change the prompt).
"""

from __future__ import annotations

import enum
import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import numpy as np

from .json_types import JSON, JSONObject

MAX_FINGERPRINTS = 4096  # previous requests kept for diagnostics.previous_message_id
BLOCK_TOKENS = 32  # prompt tokens per chained block hash (the shared-prefix count's granularity)


class MissType(str, enum.Enum):
    """Anthropic's `cache_miss_reason.type` values."""

    MODEL_CHANGED = "model_changed"  # another model than the previous request's
    SYSTEM_CHANGED = "system_changed"  # the system prompt differs
    TOOLS_CHANGED = "tools_changed"  # tools added, removed, reordered or edited
    MESSAGES_CHANGED = "messages_changed"  # an earlier message differs, not only appended ones
    PREVIOUS_MESSAGE_NOT_FOUND = "previous_message_not_found"  # id unknown (or evicted)
    UNAVAILABLE = "unavailable"  # only other prompt parameters (tool_choice, thinking...) differ


# reasons that carry cache_missed_input_tokens (the two others carry only `type`)
_COUNTED = {
    MissType.MODEL_CHANGED,
    MissType.SYSTEM_CHANGED,
    MissType.TOOLS_CHANGED,
    MissType.MESSAGES_CHANGED,
}


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What a request's prompt was made of, as hashes (module docstring)."""

    model: str
    system: str
    tools: str
    messages: tuple[str, ...]  # one hash per entry of `messages`, in order
    other: str  # tool_choice, thinking, output_config
    blocks: tuple[bytes, ...]  # chained hashes of the prompt's whole BLOCK_TOKENS blocks
    input_tokens: int  # the prompt's tokens, reused or not
    output_tokens: int = 0  # the answer's tokens (the next turn's prompt carries them back)


@dataclass(frozen=True, slots=True)
class CacheMissReason:
    type: MissType
    cache_missed_input_tokens: int | None  # None for previous_message_not_found and unavailable

    def to_json(self) -> JSONObject:
        out: JSONObject = {"type": self.type.value}
        if self.cache_missed_input_tokens is not None:
            out["cache_missed_input_tokens"] = self.cache_missed_input_tokens
        return out


_enc = msgspec.json.Encoder(order="sorted")


def _strip_cache_control(value: JSON) -> JSON:
    if isinstance(value, dict):
        return {k: _strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cache_control(v) for v in value]
    return value


def _hash(value: object) -> str:
    data = _enc.encode(_strip_cache_control(msgspec.to_builtins(value)))
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def block_hashes(prompt_ids: Sequence[int]) -> tuple[bytes, ...]:
    """Chained digests of the whole BLOCK_TOKENS blocks of `prompt_ids`: block i's digest covers
    every token before its end, so equal digests mean equal prefixes."""
    ids = np.asarray(prompt_ids, dtype=np.int32)
    out = []
    prev = b""
    for end in range(BLOCK_TOKENS, ids.shape[0] + 1, BLOCK_TOKENS):
        prev = hashlib.blake2b(prev + ids[end - BLOCK_TOKENS : end].tobytes(), digest_size=8).digest()
        out.append(prev)
    return tuple(out)


def fingerprint(
    *,
    model: str,
    system: object,
    tools: object,
    messages: Sequence[object],
    other: object,
    prompt_ids: Sequence[int],
) -> Fingerprint:
    """The fingerprint of one request (the parts as the API received them, after any
    normalization the server applied before rendering); output_tokens is filled in once the
    answer is done (`dataclasses.replace`)."""
    return Fingerprint(
        model=model,
        system=_hash(system),
        tools=_hash(tools),
        messages=tuple(_hash(m) for m in messages),
        other=_hash(other),
        blocks=block_hashes(prompt_ids),
        input_tokens=len(prompt_ids),
    )


def shared_tokens(a: Fingerprint, b: Fingerprint) -> int:
    """Prompt tokens the two prompts share, in whole blocks."""
    n = 0
    for x, y in zip(a.blocks, b.blocks):
        if x != y:
            break
        n += 1
    return n * BLOCK_TOKENS


def diagnose(previous: Fingerprint | None, current: Fingerprint) -> CacheMissReason | None:
    """Why `current` missed the cache of the request `previous` was taken from; None when its
    prefix is unchanged. `previous` None: the id named was not found."""
    if previous is None:
        return CacheMissReason(MissType.PREVIOUS_MESSAGE_NOT_FOUND, None)
    kind: MissType | None = None
    if previous.model != current.model:
        kind = MissType.MODEL_CHANGED
    elif previous.system != current.system:
        kind = MissType.SYSTEM_CHANGED
    elif previous.tools != current.tools:
        kind = MissType.TOOLS_CHANGED
    elif current.messages[: len(previous.messages)] != previous.messages:
        kind = MissType.MESSAGES_CHANGED
    elif previous.other != current.other:
        kind = MissType.UNAVAILABLE
    if kind is None:
        return None
    if kind not in _COUNTED:
        return CacheMissReason(kind, None)
    missed = max(0, previous.input_tokens + previous.output_tokens - shared_tokens(previous, current))
    return CacheMissReason(kind, missed)


class FingerprintStore:
    """Fingerprints by message id, at most `max_entries`, least recently used evicted first.
    Single-threaded (the event loop)."""

    def __init__(self, max_entries: int = MAX_FINGERPRINTS) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._items: OrderedDict[str, Fingerprint] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, message_id: str) -> Fingerprint | None:
        item = self._items.get(message_id)
        if item is not None:
            self._items.move_to_end(message_id)
        return item

    def put(self, message_id: str, fp: Fingerprint) -> None:
        self._items.pop(message_id, None)
        while len(self._items) >= self.max_entries:
            self._items.popitem(last=False)
        self._items[message_id] = fp
