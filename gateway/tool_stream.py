"""The one scanner of tool calls in generated text: fed in pieces (streaming) or whole.

Design: a call is a JSON object `{"name": N, "arguments"|"parameters": {...}}` naming an offered
function, found left to right wherever it starts. What may stand before its `{` is one optional
marker and separators, and the marker names the syntax the model used:

    <tool_call>  {...}  </tool_call>      hermes (the closing tag is dropped when it follows)
    <|python_tag|>  {...}; {...}          llama3
    [TOOL_CALLS]  [{...}, {...}]          mistral
    ```json  {...}  ```                   a fenced call, any family (the fence is dropped)
    {...}   [{...}, {...}]                a bare call or list of calls, any family

Small models (Qwen2.5-Coder-0.5B, for one) answer with the bare or fenced form even when their
template teaches the tagged one, so every family accepts those. A call that turns out not to be
one (an unknown name, not JSON, arguments that are not an object) is released as content: nothing
the model wrote is dropped but the call syntax of calls.

Streaming as OpenAI streams calls: once the name is read (and offered) and the arguments value
opens with `{`, the call is committed: one header delta (id, name, arguments "") goes out, then
argument fragments as their text arrives, verbatim. A call whose arguments are not an object (a
JSON string, say) is sent whole when its object closes (header, then one fragment). Whitespace
is held until text follows it, so none is sent between or after calls.

`ToolCall.arguments` is the compact re-serialisation of the arguments (OpenAI's
`function.arguments` string); streamed fragments join to the text the model wrote, which is the
same JSON value (equal once decoded). `parse_tool_calls` in tool_calls.py runs this scanner over a
whole text, so a streamed and a whole reply always split alike.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .json_types import JSON

if TYPE_CHECKING:
    from .tool_calls import ToolCallFamily

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
LLAMA3_TAG = "<|python_tag|>"
MISTRAL_TAG = "[TOOL_CALLS]"
FENCE = "```"
_WS = " \t\r\n"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed call. `arguments` is the JSON text of an object (compact)."""

    id: str  # "call_<24 hex>", fresh per call
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """One streamed piece of call `index` (OpenAI's `delta.tool_calls[i]`): the first piece of a
    call carries `id` and `name` (and empty arguments), the next ones argument fragments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def call_from_obj(
    obj: JSON, tool_names: Collection[str] | None, new_id: Callable[[], str]
) -> ToolCall | None:
    """A ToolCall from a decoded {"name", "arguments"|"parameters"} object, or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    name = obj["name"]
    if tool_names is not None and name not in tool_names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(new_id(), name, json.dumps(args, ensure_ascii=False, separators=(",", ":")))


# ------------------------------------------------------------------ where a call starts

_NO, _PARTIAL = -1, -2  # _match_start results besides the index of the name's first character
_HEAD = ("{", '"name"', ":", '"')  # a call object's opening, whitespace allowed between
_NAME_RE = re.compile(r'((?:[^"\\]|\\.)*)"')
_ARGS_KEY_RE = re.compile(r'[ \t\r\n]*,[ \t\r\n]*"(arguments|parameters)"[ \t\r\n]*:[ \t\r\n]*')


def _skip_ws(s: str, j: int, extra: str = "") -> int:
    while j < len(s) and (s[j] in _WS or s[j] in extra):
        j += 1
    return j


@dataclass(frozen=True, slots=True)
class _Start:
    at: int  # where the call syntax starts (the marker, or the `{`)
    obj: int  # the call object's `{`
    name_at: int  # the name string's first character
    closer: str  # what is dropped after the call when it follows: the tag, the fence, "]"...
    tagged: bool = False  # after the family's marker (else bare or fenced: arguments required)


def _match_start(s: str, i: int, markers: tuple[str, ...]) -> _Start | int:
    """Does a call start at s[i]? A _Start, _PARTIAL (s ends inside a possible start) or _NO."""
    j, marker = i, ""
    for m in markers:
        if s.startswith(m, j):
            marker, j = m, j + len(m)
            break
        if m.startswith(s[j:]):
            return _PARTIAL
    if marker == FENCE:
        while j < len(s) and s[j].isalpha():
            j += 1
    j = _skip_ws(s, j, ";," if marker in (LLAMA3_TAG, MISTRAL_TAG) else "")
    closers = {HERMES_OPEN: HERMES_CLOSE, FENCE: FENCE}.get(marker, "")
    if j < len(s) and s[j] == "[":
        j, closers = _skip_ws(s, j + 1), closers + "]"
    if j >= len(s):
        return _PARTIAL if j > i else _NO
    obj = j
    for k, piece in enumerate(_HEAD):
        if k:
            j = _skip_ws(s, j)
        got = s[j : j + len(piece)]
        if got != piece:
            return _PARTIAL if j + len(got) == len(s) and piece.startswith(got) else _NO
        j += len(piece)
    return _Start(i, obj, j, closers, marker not in ("", FENCE))


_IN_STRING = re.compile(r'["\\]')
_STRUCTURE = re.compile(r'["{}\[\]]')


@dataclass(slots=True)
class _JsonEnd:
    """Where the JSON value (object, array or string) opening at `start` ends, found
    incrementally: each `advance` reads only the text added since the last (a long argument
    streamed token by token costs linear time). Only brackets and strings are tracked: the value
    is decoded afterwards."""

    start: int
    pos: int = -1
    depth: int = 0
    in_str: bool = False
    esc: bool = False
    end: int | None = None

    def advance(self, s: str) -> int | None:
        """Index just past the value in `s` (the same text, grown), or None if it ends first."""
        j, n = max(self.pos, self.start), len(s)
        while self.end is None and j < n:
            if self.esc:
                self.esc, j = False, j + 1
            elif self.in_str:
                m = _IN_STRING.search(s, j)
                if m is None:
                    j = n
                elif s[m.start()] == "\\":
                    self.esc, j = True, m.start() + 1
                else:
                    self.in_str, j = False, m.start() + 1
                    if self.depth == 0:
                        self.end = j
            else:
                m = _STRUCTURE.search(s, j)
                if m is None:
                    j = n
                    break
                c, j = s[m.start()], m.start() + 1
                if c == '"':
                    self.in_str = True
                elif c in "{[":
                    self.depth += 1
                else:
                    self.depth -= 1
                    if self.depth <= 0:
                        self.end = j
        self.pos = j
        return self.end


def _json_end(s: str, i: int) -> int | None:
    return _JsonEnd(i).advance(s)


# ------------------------------------------------------------------ the scanner


@dataclass(slots=True)
class _Call:
    start: _Start
    name: str | None = None
    args_at: int | None = None  # the arguments value's first character
    index: int | None = None  # committed: the delta index (its header went out)
    id: str = ""
    sent: int = 0  # argument characters streamed
    obj_end: _JsonEnd | None = None  # the call object's extent, scanned as text arrives
    args_end: _JsonEnd | None = None  # the arguments value's


@dataclass(slots=True)
class StreamingToolParser:
    """Content and call deltas from released text (see the module docstring).

    Contract: feed() every released text in order, then finish() once. The content released
    over the whole stream (stripped) and `tool_calls` are what `parse_tool_calls` gives on the
    whole text, however the text is cut into pieces.
    """

    family: ToolCallFamily  # picks the markers
    tool_names: Collection[str] | None = None
    new_id: Callable[[], str] = new_call_id
    tool_calls: list[ToolCall] = field(default_factory=list)
    _buf: str = ""  # text not yet released
    _call: _Call | None = None  # the call being read (its syntax starts at _buf[0])
    _after: bool = False  # just after a call: separators and closers are dropped
    _closer: str = ""  # the closers of the calls' syntax still expected ("</tool_call>", "```", "]")
    _held_ws: str = ""  # whitespace released only when text follows
    _out: list[str] = field(default_factory=list)  # content of the current feed
    _markers: tuple[str, ...] = ()
    _finished: bool = False
    cut_text: str = ""  # a committed call the text ended in (max_tokens), as written; not in tool_calls

    def __post_init__(self) -> None:
        family_marker = {"hermes": HERMES_OPEN, "llama3": LLAMA3_TAG, "mistral": MISTRAL_TAG}
        self._markers = (family_marker[str(getattr(self.family, "value", self.family))], FENCE)

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """Add released text; returns (content to stream now, call deltas)."""
        assert not self._finished, "feed() after finish()"
        self._buf += text
        deltas: list[ToolCallDelta] = []
        self._scan(deltas, final=False)
        return self._take(), deltas

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """End of generation: a committed call ends where the text ends; anything else held back
        (a possible start, an unfinished uncommitted call) is content."""
        self._finished = True
        deltas: list[ToolCallDelta] = []
        self._scan(deltas, final=True)
        call = self._call
        if call is not None:  # only a committed call waits at the end (see _read_call)
            assert call.args_at is not None and call.index is not None
            args_end = _json_end(self._buf, call.args_at) or len(self._buf)
            deltas += self._fragment(call, args_end)
            # NOTE: its header and fragments are out (streamed), but it is no call: a whole reply
            # keeps its text as content, and finish_reason stays "length" unless calls precede it
            del self.tool_calls[call.index]
            self.cut_text = self._buf
        self._buf, self._call = "", None
        self._held_ws = ""  # trailing whitespace: the whole parse strips it
        return self._take(), deltas

    # -- content

    def _put(self, text: str) -> None:
        """Release content; whitespace waits until text follows it (dropped before a call's end
        and at the end)."""
        if not text:
            return
        if not text.strip(_WS):
            self._held_ws += text
            return
        text, self._held_ws = self._held_ws + text, ""
        stripped = text.rstrip(_WS)
        self._held_ws = text[len(stripped) :]
        self._out.append(stripped)
        self._after, self._closer = False, ""

    def _take(self) -> str:
        out, self._out = "".join(self._out), []
        return out

    # -- scanning

    def _scan(self, deltas: list[ToolCallDelta], *, final: bool) -> None:
        while self._buf:
            if self._call is not None:
                if not self._read_call(deltas, final=final):
                    return
            elif self._after and not self._drop_closers(final):
                return
            elif not self._find_start(final):
                return

    def _drop_closers(self, final: bool) -> bool:
        """Just after a call: drop separators, whitespace and the closers of its syntax; False:
        wait for more text."""
        while True:
            j = _skip_ws(self._buf, 0, ";,")
            rest = self._buf[j:]
            hit = next(
                (c for c in (HERMES_CLOSE, FENCE, "]") if c in self._closer and rest.startswith(c)), None
            )
            if hit is None:
                break
            self._buf = rest[len(hit) :]
            self._closer = self._closer.replace(hit, "", 1)
        self._buf = rest
        if not rest:
            return False
        if not final and any(c.startswith(rest) for c in (HERMES_CLOSE, FENCE) if c in self._closer):
            return False
        self._after = False  # the next call may still start here (its closers join _closer)
        return True

    def _find_start(self, final: bool) -> bool:
        buf = self._buf
        for i, c in enumerate(buf):
            if c not in "<[{`":
                continue
            got = _match_start(buf, i, self._markers)
            if got == _NO:
                continue
            if got == _PARTIAL:
                if final:
                    continue
                self._put(buf[:i])
                self._buf = buf[i:]
                return False
            assert isinstance(got, _Start)
            self._put(buf[:i])
            closer = got.closer + self._closer
            self._buf = buf[i:]
            self._call = _Call(_Start(0, got.obj - i, got.name_at - i, closer, got.tagged))
            return True
        self._put(buf)
        self._buf = ""
        return False

    def _abort(self) -> None:
        """The call was not one: its first character is content, the scan goes on after it."""
        self._put(self._buf[:1])
        self._buf, self._call = self._buf[1:], None

    def _read_call(self, deltas: list[ToolCallDelta], *, final: bool) -> bool:
        """Advance the call at _buf[0]; False when more text is needed."""
        call = self._call
        assert call is not None
        buf = self._buf
        m = _NAME_RE.match(buf, call.start.name_at)
        if m is None:
            if final:
                self._abort()
                return True
            return False
        if call.name is None:
            try:
                call.name = json.loads(f'"{m.group(1)}"')
            except ValueError:
                self._abort()
                return True
            if self.tool_names is not None and call.name not in self.tool_names:
                self._abort()
                return True
        if call.args_at is None:
            k = _ARGS_KEY_RE.match(buf, m.end())
            if k is not None and k.end() < len(buf):
                call.args_at = k.end()
        if call.index is None and call.args_at is not None and buf[call.args_at] == "{":
            call.index, call.id = len(self.tool_calls), self.new_id()
            self.tool_calls.append(ToolCall(call.id, call.name or "", ""))  # filled in by _record
            deltas.append(ToolCallDelta(call.index, call.id, call.name, ""))
        if call.obj_end is None:
            call.obj_end = _JsonEnd(call.start.obj)
        end = call.obj_end.advance(buf)
        if call.index is not None:
            assert call.args_at is not None
            if call.args_end is None:
                call.args_end = _JsonEnd(call.args_at)
            args_end = call.args_end.advance(buf)
            deltas += self._fragment(call, args_end if args_end is not None else len(buf))
            if end is None:
                return False
            self._record(call, buf[call.args_at : args_end])
            self._after_call(end)
            return True
        if end is None:
            if final:
                self._abort()
                return True
            return False
        try:
            obj = json.loads(buf[call.start.obj : end])
        except ValueError:
            obj = None
        # NOTE: a bare {"name": ...} without arguments is prose more often than a call
        keyed = call.start.tagged or (isinstance(obj, dict) and ("arguments" in obj or "parameters" in obj))
        got = call_from_obj(obj, self.tool_names, self.new_id) if keyed else None
        if got is None:
            self._abort()
            return True
        i = len(self.tool_calls)
        self.tool_calls.append(got)
        deltas += [ToolCallDelta(i, got.id, got.name, ""), ToolCallDelta(i, arguments=got.arguments)]
        self._after_call(end)
        return True

    def _fragment(self, call: _Call, upto: int) -> list[ToolCallDelta]:
        assert call.args_at is not None and call.index is not None
        piece = self._buf[call.args_at + call.sent : upto]
        if not piece:
            return []
        call.sent += len(piece)
        return [ToolCallDelta(call.index, arguments=piece)]

    def _record(self, call: _Call, args: str) -> None:
        assert call.index is not None
        try:
            compact = json.dumps(json.loads(args), ensure_ascii=False, separators=(",", ":"))
        except ValueError:
            compact = args.strip()  # cut short (max_tokens): what was written
        self.tool_calls[call.index] = ToolCall(call.id, call.name or "", compact)

    def _after_call(self, end: int) -> None:
        assert self._call is not None
        self._closer = self._call.start.closer
        self._buf, self._call, self._after = self._buf[end:], None, True
