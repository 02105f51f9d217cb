"""Constrained decoding with llguidance: JSON schemas and tool-call syntax as token masks.

Design: one `GrammarCompiler` per served model owns the llguidance tokenizer (built once from
the model's token bytes and its encoder, ~0.3 s) and a small thread pool. It compiles a request's
`response_format` or forced tool call into a `CompiledGrammar`, an immutable value that goes into
`SamplingParams.grammar` (the scheduler's `Grammar` protocol). Each sequence then gets its own
`MaskedSequence` (`start()`), owned by that sequence's Sampler:

    allowed()    waits for the mask of the next position (normally computed already) and returns
                 it as bool [n_vocab]
    accept(tok)  advances the matcher by the sampled token and submits the next mask to the pool,
                 so it is computed while the engine runs its next step (the event loop goes on)

Why llguidance (see docs/structured_output.md): CPU-only wheel of ~3 MB with no dependency (numpy
interface; xgrammar needs torch), JSON schema and Lark grammars in one engine, and masks for the
49k SmolLM2 vocabulary in 0.02-0.1 ms after the first (measured in that doc).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from .json_types import JSONObject, TemplateTool
from .tool_calls import ToolCallFamily
from .tool_stream import HERMES_CLOSE, HERMES_OPEN, MISTRAL_TAG

if TYPE_CHECKING:
    from llguidance import LLMatcher
    from llguidance._lib import JsonCompileOptions

    from ..engine_ext.tokenizer import Tokenizer

# JSON layout the model is held to: one space after ':' and ',' (what chat models write), no
# other whitespace, so a constrained reply cannot run on in blank space.
_JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


class _Vocab:
    """What llguidance's TokenizerWrapper reads: id -> bytes (special tokens by their text, marked
    in `special_token_ids` so that grammar text never matches them), eos/bos, and an encoder of
    plain text (special-token spellings stay text)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tokens: list[bytes] = list(tok.token_bytes)
        self.eos_token_id: int = tok.eos_id
        self.bos_token_id: int | None = tok.bos_id
        self.special_token_ids: list[int] = sorted(tok.special_ids)
        self.end_ids: frozenset[int] = frozenset(tok.eos_token_ids) | {tok.eos_id}
        self._tok = tok

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):  # llguidance probes for a bytes encoder: we take str only
            raise TypeError("encode str")
        return list(self._tok.encode(text, parse_special=False))


class GrammarError(ValueError):
    """The schema or grammar cannot be compiled (the message says why)."""


class GrammarCompiler:
    """Compiles schemas for one tokenizer. Thread-safe; `close()` stops the mask pool."""

    def __init__(self, vocab: _Vocab, *, threads: int = 1) -> None:
        import llguidance

        self._llg = llguidance
        self.n_vocab = len(vocab.tokens)
        self.eos_token_id = vocab.eos_token_id
        # int64 [E] every id that ends generation: allowed wherever the grammar allows eos
        self.end_ids = np.array(sorted(vocab.end_ids), dtype=np.int64)
        self.end_set = vocab.end_ids
        # NOTE: built from the token bytes, not from a tokenizer.json: the byte meaning of every
        # id is then the engine tokenizer's own, whatever its kind (byte-level BPE, SentencePiece)
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocab))
        self._special_ids = frozenset(vocab.special_token_ids)
        self._encode_special = getattr(vocab._tok, "encode", None)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="slotserve-mask")

    @classmethod
    def for_tokenizer(cls, tok: Tokenizer) -> GrammarCompiler:
        """From `engine_ext.tokenizer.Tokenizer`: its token bytes, special ids, eos and encoder."""
        return cls(_Vocab(tok))

    def is_special(self, text: str) -> bool:
        """Is `text` one special token of the vocabulary (which grammar text cannot produce)?"""
        if self._encode_special is None:
            return False
        ids = list(self._encode_special(text, parse_special=True))
        return len(ids) == 1 and ids[0] in self._special_ids

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _compile(self, grammar: str) -> CompiledGrammar:
        err = self._llg.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if err:
            raise GrammarError(err)
        return CompiledGrammar(self, grammar)

    def json_schema(self, schema: JSONObject | None) -> CompiledGrammar:
        """Any JSON object (`schema` None: OpenAI's json_object), or JSON valid under `schema`."""
        try:
            grammar = self._llg.LLMatcher.grammar_from_json_schema(
                dict(schema) if schema is not None else {"type": "object"}, defaults=_JSON_OPTIONS
            )
        except ValueError as exc:
            raise GrammarError(str(exc)) from None
        return self._compile(grammar)

    def tool_calls(
        self, family: ToolCallFamily, tools: Sequence[TemplateTool], *, parallel: bool, allow_text: bool
    ) -> CompiledGrammar:
        """Tool-call syntax of `family` whose JSON is one of `tools` (OpenAI tool dicts) with its
        parameters schema. `parallel`: one or more calls, else exactly one; `allow_text`: a plain
        text reply is allowed instead (tool_choice "auto" with strict schemas)."""
        call_schema = _call_schema(tools, "parameters" if family is ToolCallFamily.LLAMA3 else "arguments")
        call = json.dumps({**call_schema, "x-guidance": _JSON_OPTIONS})  # the fixed layout inside %json too
        if family is ToolCallFamily.HERMES:
            one = f'"{HERMES_OPEN}\\n" %json {call} "\\n{HERMES_CLOSE}"'
            calls = 'call ("\\n" call)*' if parallel else "call"
            text = "/[^<][\\s\\S]*/"  # a reply that does not start a call
        elif family is ToolCallFamily.LLAMA3:
            one = f"%json {call}"
            calls = 'call ("; " call)*' if parallel else "call"
            text = "/[^{<][\\s\\S]*/"
        else:
            arr = {"type": "array", "items": call_schema, "minItems": 1, "x-guidance": _JSON_OPTIONS}
            if not parallel:
                arr["maxItems"] = 1
            one = f'"{MISTRAL_TAG}" %json {json.dumps(arr)}'
            calls = "call"
            text = "/[^\\[][\\s\\S]*/"
        lark = f"start: calls{' | TEXT' if allow_text else ''}\ncalls: {calls}\ncall: {one}\n"
        if allow_text:
            lark += f"TEXT: {text}\n"
        try:
            grammar = self._llg.LLMatcher.grammar_from_lark(lark)
        except ValueError as exc:
            raise GrammarError(str(exc)) from None
        return self._compile(grammar)

    def lazy_tool_calls(
        self, tools: Sequence[TemplateTool], *, parallel: bool, tag: bool = True
    ) -> CompiledGrammar:
        """tool_choice "auto": free text, until the model starts a call (`<tool_call>`, or a JSON
        object opening with `{"name": "`, bare or fenced); from there the call is held to
        `tools`: a declared name, then arguments valid under its parameters schema (whitespace
        as the model likes it, bounded), then the closing brace (and tag). A name nobody
        declared frees the rest of the reply again (it stays text: no call is forced on it).
        `parallel` False: one constrained call, the text after it free; `tag` False: no
        `<tool_call>` trigger (families that do not write it). `CompiledGrammar.lazy` is True."""
        try:
            grammar = self._llg.LLMatcher.grammar_from_lark(lazy_tool_lark(tools, parallel=parallel, tag=tag))
        except ValueError as exc:
            raise GrammarError(str(exc)) from None
        compiled = self._compile(grammar)
        compiled.lazy = True
        return compiled


# JSON inside a lazily constrained call: the model's own layout (one line, or indented in a
# fence), at most 16 blanks in a row so it cannot run on in whitespace.
_LAZY_JSON_OPTIONS = {"whitespace_flexible": True, "whitespace_pattern": "[ \\n]{0,16}"}
_W = "[ \\t\\n]"


def _regex_literal(text: str) -> str:
    """`text` as a regex matching itself (llguidance's regex syntax)."""
    return "".join(c if c.isalnum() or c == "_" else f"\\x{{{ord(c):x}}}" for c in text)


def lazy_tool_lark(tools: Sequence[TemplateTool], *, parallel: bool, tag: bool = True) -> str:
    """The lark grammar behind `GrammarCompiler.lazy_tool_calls` (llguidance lazy lexemes: a
    `[lazy]` rule made of the free text and a trigger ends at the trigger's first match)."""
    alts, rules, names = [], [], []
    for i, t in enumerate(tools):
        fn = t.get("function", t)
        params = dict(fn.get("parameters") or {"type": "object", "properties": {}})
        name = _regex_literal(fn["name"])
        names.append(name)
        alts.append(f"fn_{i}")
        rules.append(f"fn_{i}: FN_{i} %json {json.dumps({**params, 'x-guidance': _LAZY_JSON_OPTIONS})} CLOSE")
        rules.append(f'FN_{i}: /{name}"{_W}*,{_W}*"(arguments|parameters)"{_W}*:{_W}*/')
    head = f'\\{{{_W}*"name"{_W}*:{_W}*"'
    lines = [
        "%llguidance {}",
        f"start: call{'*' if parallel else '?'} TAIL",
        "TAIL: /(.|\\n)*/",
        f"json_hd[lazy]: TAIL /{head}/",
        *(
            [
                f'tag_hd[lazy]: TAIL "{HERMES_OPEN}"',
                "call: json_hd named | tag_hd OPEN named ENDTAG",
                f"OPEN: /{_W}*{head}/",
                f"ENDTAG: /{_W}*<\\/tool_call>/",
            ]
            if tag
            else ["call: json_hd named"]
        ),
        f"CLOSE: /{_W}{{0,16}}\\}}/",
        f"named: {' | '.join(alts)} | OTHER",
        # a name that is none of the tools': the rest is free text
        f'OTHER: /[^"]*"(.|\\n)*/ & ~/({"|".join(names)})"(.|\\n)*/',
        *rules,
    ]
    return "\n".join(lines) + "\n"


def _call_schema(tools: Sequence[TemplateTool], args_key: str) -> JSONObject:
    """JSON schema of one call object {"name": N, args_key: {...}} over `tools`."""
    options = []
    for t in tools:
        fn = t.get("function", t)
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, args_key: params},
                "required": ["name", args_key],
                "additionalProperties": False,
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


class CompiledGrammar:
    """An immutable compiled grammar (the scheduler's `Grammar`): `start()` per sequence."""

    __slots__ = ("_compiler", "grammar", "lazy")

    def __init__(self, compiler: GrammarCompiler, grammar: str) -> None:
        self._compiler = compiler
        self.grammar = grammar  # llguidance's serialised grammar
        self.lazy = False  # tool_choice "auto"'s call grammar (free text until a call starts)

    def start(self) -> MaskedSequence:
        return MaskedSequence(self._compiler, self.grammar)


class MaskedSequence:
    """One sequence's matcher and its next-token mask (the scheduler's `TokenConstraint`).

    The matcher is built and the mask of the next position computed in the compiler's pool,
    started at construction (the Sampler's, at submit) and after each `accept`; `allowed()`
    waits for it. `accept` is only called after `allowed` (the Sampler's order)."""

    def __init__(self, compiler: GrammarCompiler, grammar: str) -> None:
        self._c = compiler
        self._matcher: LLMatcher | None = (
            None  # built in the pool with the first mask (not on the event loop)
        )
        self._bits = np.zeros((compiler.n_vocab + 31) // 32, dtype=np.int32)  # [ceil(V/32)] bitmask
        self._next: Future[None] | None = compiler._pool.submit(self._start, grammar)

    def _start(self, grammar: str) -> None:
        self._matcher = self._c._llg.LLMatcher(self._c.tokenizer, grammar)
        self._fill()

    @property
    def _m(self) -> LLMatcher:
        assert self._matcher is not None, "built by _start, which every mask waits for"
        return self._matcher

    def _fill(self) -> None:
        m = self._m
        m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)

    def allowed(self) -> np.ndarray:
        """bool [n_vocab]: the tokens the grammar accepts next (eos alone once it is complete or
        if the matcher failed, so generation always ends)."""
        if self._next is not None:
            self._next.result()
            self._next = None
        out = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self._c.n_vocab].view(bool)
        if self._m.is_error() or not out.any():
            out = np.zeros(self._c.n_vocab, dtype=bool)
            out[self._c.eos_token_id] = True
        if out[self._c.eos_token_id]:  # the model's own end-of-turn token ends it as well as eos
            out[self._c.end_ids] = True
        return out

    def accept(self, token: int) -> None:
        """Advance by `token`; an end-of-generation id ends the sequence (nothing to compute)."""
        if token in self._c.end_set:
            return
        self._m.consume_token(int(token))
        self._next = self._c._pool.submit(self._fill)
