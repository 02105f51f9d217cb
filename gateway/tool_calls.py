"""Tool calls in generated text: the syntax of each template family, parsed whole or streamed.

Design: a model calls a tool by writing text in the syntax its chat template taught it. Three
families cover the common templates (`ToolCallFamily`); `family_for_template` picks one from the
template's source. Everything here is plain text in, plain data out, with no scheduler or HTTP
types, so every front door (chat completions, /v1/messages, /v1/responses) shares it:

    parsed = parse_tool_calls(text, family, tool_names={"get_weather"})
    parsed.content, parsed.tool_calls          # str | None, tuple[ToolCall, ...]

    parser = StreamingToolParser(family, tool_names={"get_weather"})
    for piece in texts:                         # the TokenEvent texts, in order
        content, deltas = parser.feed(piece)    # content to stream now; ToolCallDelta list
    content, deltas = parser.finish()           # at the FinishEvent (its text fed first)
    parser.tool_calls                           # every call, as parse_tool_calls would give

A call whose text is not valid JSON, or names a function the request did not offer, stays in the
content: nothing the model wrote is dropped. Arguments are re-serialised compactly as a JSON
object text (OpenAI's `function.arguments` is a string).

    family    what the model writes                                        templates
    hermes    <tool_call>{"name": N, "arguments": {...}}</tool_call> ...   Hermes, Qwen 2.5/3, the built-in shim
    llama3    [<|python_tag|>]{"name": N, "parameters": {...}}[; {...}]    Llama 3.1-3.3
    mistral   [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]           Mistral, Mixtral
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class ToolCallFamily(str, enum.Enum):
    HERMES = "hermes"  # <tool_call> JSON </tool_call> blocks, anywhere in the text
    LLAMA3 = "llama3"  # the whole reply is JSON call(s), optionally after <|python_tag|>
    MISTRAL = "mistral"  # [TOOL_CALLS] then a JSON array of calls


HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
LLAMA3_TAG = "<|python_tag|>"
MISTRAL_TAG = "[TOOL_CALLS]"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed call. `arguments` is the JSON text of an object (compact)."""

    id: str  # "call_<24 hex>", fresh per call
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    content: str | None  # the text outside the calls (stripped); None when nothing is left
    tool_calls: tuple[ToolCall, ...]


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """One streamed piece of call `index` (OpenAI's `delta.tool_calls[i]`): the first piece of a
    call carries `id` and `name`, the next ones argument fragments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def family_for_template(source: str | None) -> tuple[ToolCallFamily, bool]:
    """(family, renders_tools) for a chat template's jinja source. `renders_tools` is False when
    the template never reads `tools`: the gateway then renders tools itself (`hermes_shim`)."""
    src = source or ""
    renders_tools = "tools" in src
    if MISTRAL_TAG in src:
        return ToolCallFamily.MISTRAL, renders_tools
    if LLAMA3_TAG in src or ("<|start_header_id|>" in src and renders_tools and HERMES_OPEN not in src):
        return ToolCallFamily.LLAMA3, renders_tools
    return ToolCallFamily.HERMES, renders_tools and HERMES_OPEN in src


# ------------------------------------------------------------------ whole-text parsing


def _call_from_obj(
    obj: Any, tool_names: Collection[str] | None, new_id: Callable[[], str]
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


def _decode_json_values(text: str) -> list[Any] | None:
    """Every JSON value in `text`, separated by whitespace or ';' (Llama 3's parallel calls);
    None if anything else is there."""
    dec = json.JSONDecoder()
    out: list[Any] = []
    i, n = 0, len(text)
    while True:
        while i < n and (text[i].isspace() or text[i] == ";"):
            i += 1
        if i >= n:
            return out
        try:
            obj, i = dec.raw_decode(text, i)
        except ValueError:
            return None
        out.append(obj)


def _calls_from_json(
    text: str, tool_names: Collection[str] | None, new_id: Callable[[], str]
) -> list[ToolCall] | None:
    """The calls a JSON text holds (one object, several, or an array of them); None unless every
    value is a valid call."""
    values = _decode_json_values(text)
    if not values:
        return None
    objs: list[Any] = []
    for v in values:
        objs.extend(v if isinstance(v, list) else [v])
    calls = [_call_from_obj(o, tool_names, new_id) for o in objs]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]


def _content(parts: Sequence[str]) -> str | None:
    text = "".join(parts).strip()
    return text or None


def parse_tool_calls(
    text: str,
    family: ToolCallFamily,
    *,
    tool_names: Collection[str] | None = None,
    new_id: Callable[[], str] = new_call_id,
) -> ParsedOutput:
    """Split a complete generated `text` into content and tool calls (see the module docstring).
    `tool_names`: the functions offered (None accepts any name)."""
    if family is ToolCallFamily.HERMES:
        parts: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while True:
            start = text.find(HERMES_OPEN, pos)
            if start < 0:
                parts.append(text[pos:])
                break
            end = text.find(HERMES_CLOSE, start)
            body_end = end if end >= 0 else len(text)  # an unclosed last call (eos after the JSON)
            got = _calls_from_json(text[start + len(HERMES_OPEN) : body_end], tool_names, new_id)
            after = body_end + len(HERMES_CLOSE) if end >= 0 else len(text)
            if got is None:
                parts.append(text[pos:after])
            else:
                parts.append(text[pos:start])
                calls.extend(got)
            pos = after
            if end < 0:
                break
        return ParsedOutput(_content(parts), tuple(calls))
    if family is ToolCallFamily.LLAMA3:
        body = text.strip()
        tagged = body.startswith(LLAMA3_TAG)
        if tagged:
            body = body[len(LLAMA3_TAG) :]
        # after the tag anything may be a call list (as the streaming parser decides at the tag)
        if tagged or body.lstrip().startswith("{"):
            got = _calls_from_json(body, tool_names, new_id)
            if got is not None:
                return ParsedOutput(None, tuple(got))
        return ParsedOutput(_content([text]), ())
    # MISTRAL
    at = text.find(MISTRAL_TAG)
    if at >= 0:
        got = _calls_from_json(text[at + len(MISTRAL_TAG) :], tool_names, new_id)
        if got is not None:
            return ParsedOutput(_content([text[:at]]), tuple(got))
    return ParsedOutput(_content([text]), ())


# ------------------------------------------------------------------ streaming


def _held_prefix_len(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


@dataclass(slots=True)
class StreamingToolParser:
    """Streams content while holding back call syntax; emits each call as deltas once its text
    is complete (a header delta with id and name, then its arguments).

    Contract: feed() every released text in order, then finish() once. The content released
    over the whole stream plus `tool_calls` equal what `parse_tool_calls` gives on the whole
    text, except that content is not stripped while streaming.
    """

    family: ToolCallFamily
    tool_names: Collection[str] | None = None
    new_id: Callable[[], str] = new_call_id
    tool_calls: list[ToolCall] = field(default_factory=list)
    _buf: str = ""  # text not yet released: a possible marker start, or a call being written
    _in_call: bool = False  # hermes: inside <tool_call>; llama3/mistral: the rest is calls
    _seen_text: bool = False  # llama3: some non-space content went out (the reply is prose)
    _finished: bool = False

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """Add released text; returns (content to stream now, call deltas)."""
        assert not self._finished, "feed() after finish()"
        self._buf += text
        if self.family is ToolCallFamily.HERMES:
            return self._feed_hermes()
        if self.family is ToolCallFamily.LLAMA3:
            return self._feed_llama3()
        return self._feed_mistral()

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """End of generation: settle what is held back (an unclosed call is parsed as if closed;
        text that is no call becomes content)."""
        self._finished = True
        buf, self._buf = self._buf, ""
        if not self._in_call:
            return buf, []
        if self.family is ToolCallFamily.HERMES:
            body = buf[len(HERMES_OPEN) :]
            return self._emit(body, raw=buf)
        if self.family is ToolCallFamily.LLAMA3:
            body = buf.strip()
            body = body[len(LLAMA3_TAG) :] if body.startswith(LLAMA3_TAG) else body
            return self._emit(body, raw=buf)
        return self._emit(buf[len(MISTRAL_TAG) :], raw=buf)

    def _emit(self, body: str, *, raw: str) -> tuple[str, list[ToolCallDelta]]:
        """Deltas for the calls in `body`, or `raw` back as content if it holds none."""
        got = _calls_from_json(body, self.tool_names, self.new_id)
        if got is None:
            return raw, []
        deltas: list[ToolCallDelta] = []
        for call in got:
            i = len(self.tool_calls)
            self.tool_calls.append(call)
            deltas.append(ToolCallDelta(i, call.id, call.name, ""))
            deltas.append(ToolCallDelta(i, arguments=call.arguments))
        return "", deltas

    def _feed_hermes(self) -> tuple[str, list[ToolCallDelta]]:
        out: list[str] = []
        deltas: list[ToolCallDelta] = []
        while True:
            if self._in_call:
                end = self._buf.find(HERMES_CLOSE)
                if end < 0:
                    break
                raw = self._buf[: end + len(HERMES_CLOSE)]
                self._buf = self._buf[end + len(HERMES_CLOSE) :]
                self._in_call = False
                content, got = self._emit(raw[len(HERMES_OPEN) : end], raw=raw)
                out.append(content)
                deltas.extend(got)
                continue
            start = self._buf.find(HERMES_OPEN)
            if start >= 0:
                out.append(self._buf[:start])
                self._buf = self._buf[start:]
                self._in_call = True
                continue
            hold = _held_prefix_len(self._buf, HERMES_OPEN)
            out.append(self._buf[: len(self._buf) - hold])
            self._buf = self._buf[len(self._buf) - hold :]
            break
        return "".join(out), deltas

    def _feed_llama3(self) -> tuple[str, list[ToolCallDelta]]:
        if self._in_call:
            return "", []
        if self._seen_text:
            buf, self._buf = self._buf, ""
            return buf, []
        stripped = self._buf.lstrip()
        if not stripped:
            return "", []  # leading whitespace: undecided
        if stripped.startswith("{") or stripped.startswith(LLAMA3_TAG):
            self._in_call = True
            return "", []
        if LLAMA3_TAG.startswith(stripped):
            return "", []  # maybe the tag, still arriving
        self._seen_text = True
        buf, self._buf = self._buf, ""
        return buf, []

    def _feed_mistral(self) -> tuple[str, list[ToolCallDelta]]:
        if self._in_call:
            return "", []
        at = self._buf.find(MISTRAL_TAG)
        if at >= 0:
            out = self._buf[:at]
            self._buf = self._buf[at:]
            self._in_call = True
            return out, []
        hold = _held_prefix_len(self._buf, MISTRAL_TAG)
        out = self._buf[: len(self._buf) - hold]
        self._buf = self._buf[len(self._buf) - hold :]
        return out, []


# ------------------------------------------------------------------ rendering for templates without tools


HERMES_SYSTEM = (
    "You are a function calling AI model. You may call one or more functions to assist with the "
    "user query. Here are the available tools: <tools>\n{tools}\n</tools>\nFor each function call, "
    "return a JSON object with the function name and arguments within <tool_call></tool_call> tags:"
    '\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def hermes_shim(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> list[dict[str, Any]]:
    """Messages rewritten for a template that does not render tools (SmolLM2's, for one): the
    tool list joins the system message (one is added in front if there is none), an assistant's
    `tool_calls` become `<tool_call>` blocks in its content, and a `tool` message's content is
    wrapped in `<tool_response>`. The template then renders plain role/content messages.

    Deterministic in its input, so a conversation resent with one more turn renders to the same
    prefix (prefix reuse keeps working through a tool loop)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        content = m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            blocks = []
            for tc in m["tool_calls"]:
                fn = tc.get("function", tc)
                args = fn.get("arguments", "{}")
                try:
                    args_obj = json.loads(args) if isinstance(args, str) else args
                except ValueError:
                    args_obj = args
                call = json.dumps({"name": fn.get("name"), "arguments": args_obj}, ensure_ascii=False)
                blocks.append(f"{HERMES_OPEN}\n{call}\n{HERMES_CLOSE}")
            content = "\n".join([content, *blocks] if content else blocks)
            out.append({"role": "assistant", "content": content})
        elif role == "tool":
            out.append({"role": "tool", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
    if tools:
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        system = HERMES_SYSTEM.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{system}"}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out
