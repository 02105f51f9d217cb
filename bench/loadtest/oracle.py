"""The oracle: how many prompt tokens a perfect prefix cache would have reused.

Definition (docs/loadtest.md states it for users). Before the server produced a request's first
token it can have computed (*seen*):
- the prompt of every other request sent before that first token arrived (for a request that
  streamed nothing: before its stream ended), and
- prompt + reply of every request whose stream ended (completed, aborted, failed) before this
  request was sent, the reply being the text the client received, tokenised.
A perfect cache keeps every seen sequence forever, with its KV and the logits after it, and
shares computation between requests in flight together. The oracle for a request is

    min(len(prompt), max over seen sequences S of common_prefix_len(prompt, S))

No server can reuse more for a request than its oracle (what it never saw, it cannot reuse),
so `cached_tokens <= oracle` holds per request. When requests overlap in time the oracle may
credit each of them with their common prefix although a server computes it once: under
concurrency the oracle's sum is an upper bound that a server may not reach. The *once* oracle
(`in_flight=False`) credits computation shared in flight only to the later sender: a request is
credited from the prompts of requests sent before it (and what ended before it was sent), never
from prompts sent after it, so each shared prefix counts as computed once, as a server computes
it. Its sum is the figure a server can reach; per request, arrival races may let a server credit
the other request of a pair, so the per-request bound stays the oracle above.

Token ids come from the server's POST /tokenize (`messages` rendered with the generation
prompt for chat; the reply as plain text without special tokens), in either of the two request
shapes servers use (`ServerTokenizer`). When the server has no /tokenize,
`oracle_from_usage` estimates from usage counts at message granularity instead.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import httpx

from .client import Exchange


class PrefixTrie:
    """Every inserted token sequence, sharing common prefixes (dict per node)."""

    def __init__(self) -> None:
        self._root: dict[int, dict] = {}
        self.num_nodes = 0

    def insert(self, ids: Sequence[int]) -> None:
        node = self._root
        for tok in ids:
            child = node.get(tok)
            if child is None:
                child = node[tok] = {}
                self.num_nodes += 1
            node = child

    def longest_prefix(self, ids: Sequence[int]) -> int:
        """Length of the longest common prefix of `ids` with any inserted sequence."""
        node, n = self._root, 0
        for tok in ids:
            child = node.get(tok)
            if child is None:
                break
            node, n = child, n + 1
        return n


@dataclass(frozen=True, slots=True)
class Seen:
    """One request as the oracle needs it (times: any common clock)."""

    t_send: float
    t_first: float  # first token arrived (t_end when none did)
    t_end: float
    prompt_ids: list[int]
    reply_ids: list[int]  # tokens of the text received before the stream ended


def oracle_from_ids(items: Sequence[Seen], *, in_flight: bool = True) -> list[int]:
    """The oracle for each item (see the module docstring), in the order given; with
    `in_flight=False` the once oracle (no credit from prompts sent after the request's own).

    A sweep over sends and ends in time order keeps a trie of what was seen before each send;
    prompts sent between a request's send and its first token are compared pairwise."""
    # NOTE: an end sorts before a send at the same instant; a request ends after its own send
    # (t_end > t_send), so it never sees its own reply.
    events = sorted(
        [(s.t_end, 0, i) for i, s in enumerate(items)] + [(s.t_send, 1, i) for i, s in enumerate(items)]
    )
    sends = sorted(range(len(items)), key=lambda i: (items[i].t_send, i))
    rank = {i: pos for pos, i in enumerate(sends)}
    trie = PrefixTrie()
    result = [0] * len(items)
    for _, kind, i in events:
        s = items[i]
        if kind == 1:  # send: query what came before, then the prompt is seen
            best = trie.longest_prefix(s.prompt_ids)
            for j in sends[rank[i] + 1 :] if in_flight else ():  # sent while it waited for a token
                if items[j].t_send >= s.t_first:
                    break
                best = max(best, common_prefix_len(s.prompt_ids, items[j].prompt_ids))
            result[i] = min(len(s.prompt_ids), best)
            trie.insert(s.prompt_ids)
        elif s.reply_ids:  # end: the reply extends the prompt
            trie.insert(s.prompt_ids + s.reply_ids)
    return result


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def oracle_from_usage(exchanges: Sequence[Exchange]) -> list[int | None]:
    """Estimate without token ids: credit a request with the usage counts of an earlier request
    of its conversation whose content is a prefix of its own. Per earlier request e (sent
    before r, same conversation), in decreasing credit:
    - r repeats e's body exactly: r's whole prompt;
    - r extends e's messages + e's reply (ended before r was sent): e.prompt + e.completion;
    - r extends e's messages otherwise (e.g. the reply was re-rendered): e.prompt tokens.
    Prefixes shorter than a whole message (a system prompt shared across conversations) are
    not credited, so this under-estimates what `oracle_from_ids` computes."""
    order = sorted(range(len(exchanges)), key=lambda i: (exchanges[i].t_send, exchanges[i].index))
    by_conv: dict[str, list[Exchange]] = {}  # conversation -> its exchanges sent so far
    out: list[int | None] = [None] * len(exchanges)
    for i in order:
        r = exchanges[i]
        earlier = by_conv.setdefault(r.spec.conversation_id, [])
        if r.prompt_tokens is not None:
            out[i] = min(r.prompt_tokens, max((_credit(e, r) for e in earlier), default=0))
        earlier.append(r)
    return out


def _credit(e: Exchange, r: Exchange) -> int:
    a, b = e.spec, r.spec
    if a.messages is not None and b.messages is not None:
        if b.messages == a.messages:
            return r.prompt_tokens or 0
        n = len(a.messages)
        if len(b.messages) <= n or b.messages[:n] != a.messages:
            return 0
        reply = {"role": "assistant", "content": e.text}
        if e.t_end <= r.t_send and e.text and b.messages[n] == reply and e.completion_tokens:
            return (e.prompt_tokens or 0) + e.completion_tokens
        return e.prompt_tokens or 0
    if a.prompt is not None and b.prompt is not None:
        if b.prompt == a.prompt:
            return r.prompt_tokens or 0
        if e.t_end <= r.t_send and e.text and b.prompt.startswith(a.prompt + e.text):
            return (e.prompt_tokens or 0) + (e.completion_tokens or 0)
        return (e.prompt_tokens or 0) if b.prompt.startswith(a.prompt) else 0
    return 0


class TokenizeUnavailable(Exception):
    """The server has no usable POST /tokenize."""


class Dialect(Enum):
    """The request shape of a server's POST /tokenize."""

    MESSAGES = "messages"  # {"messages": [...]} or {"prompt": text} (slotserve, vLLM, SGLang)
    CONTENT = "content"  # {"content": text} only; chat via POST /apply-template (llama.cpp)


# A text every tokenizer turns into at least one token: the dialect probe.
_PROBE_TEXT = "Hello world"


class ServerTokenizer:
    """Token ids from the server's POST /tokenize ({"tokens": [...]} in the reply).

    The dialect is found on first use: a server that answers `{"prompt": ...}` with tokens
    speaks MESSAGES; one that answers it with an empty list but `{"content": ...}` with tokens
    speaks CONTENT (llama.cpp's server reads only `content` and answers anything else with
    `{"tokens": []}`, which would otherwise pass for a prompt of no tokens). In CONTENT, a chat
    prompt is rendered by the server's POST /apply-template and tokenised with special tokens
    added and parsed, as its chat endpoint does; a reply is parsed without added specials."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, model: str) -> None:
        self._client, self._base, self._model = client, base_url, model
        self._memo: dict[str, list[int]] = {}
        self._gate = asyncio.Semaphore(4)  # a few calls at a time: the run is over, be gentle
        self._dialect_lock = asyncio.Lock()
        self.dialect: Dialect | None = None  # found by the first call

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        """The JSON reply of a 200 to POST `path` (TokenizeUnavailable otherwise)."""
        async with self._gate:
            try:
                resp = await self._client.post(self._base + path, json={"model": self._model, **body})
            except httpx.HTTPError as exc:
                raise TokenizeUnavailable(f"POST {path} failed: {exc}") from None
        if resp.status_code != 200:
            raise TokenizeUnavailable(f"POST {path} answered HTTP {resp.status_code}")
        try:
            return resp.json()
        except ValueError:
            raise TokenizeUnavailable(f"POST {path} reply is not JSON") from None

    async def _tokenize(self, body: dict[str, Any]) -> list[int]:
        key = json.dumps(body, sort_keys=True)
        if key in self._memo:
            return self._memo[key]
        reply = await self._post("/tokenize", body)
        try:
            ids = [int(t) for t in reply["tokens"]]
        except (KeyError, TypeError, ValueError):
            raise TokenizeUnavailable("POST /tokenize reply has no integer list `tokens`") from None
        self._memo[key] = ids
        return ids

    async def _get_dialect(self) -> Dialect:
        async with self._dialect_lock:
            if self.dialect is None:
                if await self._tokenize({"prompt": _PROBE_TEXT}):
                    self.dialect = Dialect.MESSAGES
                elif await self._tokenize({"content": _PROBE_TEXT}):
                    self.dialect = Dialect.CONTENT
                else:
                    raise TokenizeUnavailable(
                        f"POST /tokenize answers {_PROBE_TEXT!r} with no tokens, "
                        "given as `prompt` or as `content`"
                    )
            return self.dialect

    async def prompt_ids(self, ex: Exchange) -> list[int]:
        dialect = await self._get_dialect()
        if dialect is Dialect.MESSAGES:
            if ex.spec.messages is not None:
                return await self._tokenize(
                    {"messages": list(ex.spec.messages), "add_generation_prompt": True}
                )
            return await self._tokenize({"prompt": ex.spec.prompt})
        text = ex.spec.prompt
        if ex.spec.messages is not None:
            rendered = await self._post("/apply-template", {"messages": list(ex.spec.messages)})
            text = rendered.get("prompt") if isinstance(rendered, dict) else None
            if not isinstance(text, str):
                raise TokenizeUnavailable("POST /apply-template reply has no string `prompt`")
        return await self._tokenize({"content": text, "add_special": True, "parse_special": True})

    async def text_ids(self, text: str) -> list[int]:
        if not text:
            return []
        if await self._get_dialect() is Dialect.MESSAGES:
            return await self._tokenize({"prompt": text, "add_special_tokens": False})
        return await self._tokenize({"content": text, "add_special": False, "parse_special": True})


@dataclass(frozen=True, slots=True)
class OracleResult:
    values: list[int | None]  # per exchange, aligned with the input
    once: list[int | None]  # the once oracle (in-flight sharing credited to the later sender)
    source: str  # "tokenize" | "usage"
    num_len_mismatches: int  # /tokenize length != usage.prompt_tokens (the oracle is suspect)
    note: str  # why the fallback was used, when it was


async def compute_oracle(
    exchanges: Sequence[Exchange], client: httpx.AsyncClient, base_url: str, model: str
) -> OracleResult:
    """The oracle per exchange: exact from /tokenize, else the usage-count estimate."""
    tok = ServerTokenizer(client, base_url, model)
    try:
        prompts = await asyncio.gather(*(tok.prompt_ids(e) for e in exchanges))
        replies = await asyncio.gather(*(tok.text_ids(e.text) for e in exchanges))
    except TokenizeUnavailable as exc:
        estimate = oracle_from_usage(exchanges)  # earlier requests only: already "once"
        return OracleResult(estimate, list(estimate), "usage", 0, str(exc))
    items = [
        Seen(e.t_send, e.token_times[0] if e.token_times else e.t_end, e.t_end, p, r)
        for e, p, r in zip(exchanges, prompts, replies)
    ]
    mismatches = sum(
        e.prompt_tokens is not None and e.prompt_tokens != len(p) for e, p in zip(exchanges, prompts)
    )
    return OracleResult(
        list(oracle_from_ids(items)),
        list(oracle_from_ids(items, in_flight=False)),
        "tokenize",
        mismatches,
        "",
    )
