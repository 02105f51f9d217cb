"""The model's tokenizer, rebuilt from GGUF metadata on the `tokenizers` library, token-exact
with llama.cpp.

Design: GGUF stores the vocabulary as `tokenizer.ggml.tokens` (id -> piece) and
`tokenizer.ggml.token_type`, plus what the model kind needs:

    tokenizer.ggml.model  what it is                   how it is rebuilt
    "gpt2"                byte-level BPE: pieces in    BPE(vocab, tokenizer.ggml.merges); the
                          GPT-2's bytes_to_unicode     pre-tokenizer named by tokenizer.ggml.pre
                          alphabet, ranked merges      (PRE_TOKENIZERS), then ByteLevel
    "llama"               SentencePiece BPE (llama.cpp BPE(vocab, merges derived from the scores:
                          "SPM"): pieces with "▁" for  spm_merges), byte_fallback to <0xNN>
                          spaces, a score per piece,   pieces; no pre-tokenizer; normalizer
                          <0xNN> byte pieces           " " -> "▁" (and a "▁" prefix when
                                                       tokenizer.ggml.add_space_prefix)

llama.cpp's SPM merges the adjacent pair whose concatenation is the highest-scoring piece, the
leftmost on ties, until no adjacent pair forms a piece. A BPE whose merge ranks order every
(left, right) split of every piece by that piece's score makes the same choices (see
`spm_merges`); tests/spm_reference.py is a direct port of the SPM loop the tests compare with.

Special tokens (llama.cpp's partition step): CONTROL and UNKNOWN pieces, and pieces whose text
ends generation (END_OF_GENERATION_TEXTS), are `tokenizers` special tokens: in `encode` their
text becomes their id unless parse_special=False. USER_DEFINED pieces (Gemma's runs of spaces,
tabs and newlines) are always matched as one token, as llama.cpp does. Text between them goes
through the model; with add_space_prefix each such segment gets the "▁" prefix.

Decoding is bytes: `token_bytes[id]` is what a token stands for (byte pieces their byte, "▁" a
space, special pieces their text, UNUSED pieces nothing), which the incremental detokenizer in
scheduler/detok.py joins. An UNUSED token (a vocabulary's padding: `[PAD151643]`, `[UNUSED_7]`)
stands for no text, as in llama.cpp's token_to_piece (whatever its `special` flag) and as for an
id a Hugging Face tokenizer does not have: a model that samples one prints nothing, so the next
turn's prompt carries what the client saw. llguidance reads the same table, and never allows a
token of no bytes, so a constrained reply cannot spend tokens on them either. CONTROL pieces
keep their text: the tool-call parsers read some of them (Mistral's `[TOOL_CALLS]`, Llama's
`<|python_tag|>`), and those that end generation are never printed. Anything else (another model kind, an unknown pre-tokenizer rule) raises
UnsupportedModelError naming what was found and what is supported.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from .errors import UnsupportedModelError

if TYPE_CHECKING:
    from .gguf_file import ModelFile

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


class TokenizerKind(str, enum.Enum):
    """tokenizer.ggml.model: the tokenizer families slotserve rebuilds."""

    GPT2 = "gpt2"  # byte-level BPE
    LLAMA = "llama"  # SentencePiece


SUPPORTED_MODELS = tuple(k.value for k in TokenizerKind)

# Texts of tokens that end generation besides the eos / eot / eom ids, whatever their token type
# (llama.cpp's list, less models slotserve cannot run): chat-turn terminators of common families.
END_OF_GENERATION_TEXTS = (
    "<|endoftext|>",  # GPT-2 style, SmolLM2, Qwen2 base
    "<|im_end|>",  # ChatML: SmolLM2-Instruct, Qwen2
    "<|eot_id|>",  # Llama 3
    "<|eom_id|>",  # Llama 3.1 tool calls
    "<|end_of_text|>",  # Llama 3 base, Granite
    "<|end|>",  # Phi-3
    "<end_of_turn>",  # Gemma
    "<EOT>",  # CodeLlama infill
)

# ---- gpt2 pre-tokenizer rules (tokenizer.ggml.pre) --------------------------------------------

# GPT-2's split (llama.cpp's "gpt-2" rule; `tokenizers` ByteLevel with use_regex uses the same):
# contractions, letter runs and digit runs each with one optional leading space, other symbol
# runs likewise, whitespace not followed by a non-space.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

# llama.cpp's "default" rule, applied in turn (each splits the pieces of the one before):
# punctuation runs, then GPT-2's split, then digit runs, then groups of three ASCII digits.
DEFAULT_PATTERNS = (
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
)

# Llama 3's split ("llama-bpe"): case-insensitive contractions, letter runs with one optional
# leading non-letter, digit groups of 1-3, symbol runs with trailing newlines, newline runs,
# spaces.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2's split ("qwen2"): Llama 3's with every digit on its own.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# Qwen3.5's split ("qwen35"): Qwen2's, with combining marks (\p{M}) kept inside letter runs
# ("cafe" + U+0301 is one piece, not "cafe" and a symbol piece).
QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _split(pattern: str) -> Any:
    return pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)


def _byte_level() -> Any:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)


def _gpt2_pre() -> Any:
    return pre_tokenizers.Sequence([_split(GPT2_PATTERN), _byte_level()])


def _default_pre() -> Any:
    return pre_tokenizers.Sequence([*(_split(p) for p in DEFAULT_PATTERNS), _byte_level()])


def _smollm_pre() -> Any:
    # Every digit on its own, then GPT-2's split.
    return pre_tokenizers.Sequence([_split(r"\p{N}"), _split(GPT2_PATTERN), _byte_level()])


def _llama3_pre() -> Any:
    return pre_tokenizers.Sequence([_split(LLAMA3_PATTERN), _byte_level()])


def _qwen2_pre() -> Any:
    return pre_tokenizers.Sequence([_split(QWEN2_PATTERN), _byte_level()])


def _qwen35_pre() -> Any:
    return pre_tokenizers.Sequence([_split(QWEN35_PATTERN), _byte_level()])


@dataclass(frozen=True)
class PreRule:
    """A gpt2 pre-tokenizer rule: how text is split before merging, as llama.cpp does it."""

    factory: Callable[[], Any]  # -> a `tokenizers` pre-tokenizer
    ignore_merges: bool = False  # a whole piece found in the vocabulary is taken as is (Llama 3)
    add_bos: bool = False  # llama.cpp's default when tokenizer.ggml.add_bos_token is absent


# tokenizer.ggml.pre -> rule (names as llama.cpp spells them).
PRE_TOKENIZERS: dict[str, PreRule] = {
    "default": PreRule(_default_pre),
    "gpt-2": PreRule(_gpt2_pre),
    "gpt2": PreRule(_gpt2_pre),
    "smollm": PreRule(_smollm_pre),
    "llama-bpe": PreRule(_llama3_pre, ignore_merges=True, add_bos=True),
    "llama3": PreRule(_llama3_pre, ignore_merges=True, add_bos=True),
    "llama-v3": PreRule(_llama3_pre, ignore_merges=True, add_bos=True),
    "lfm2": PreRule(_llama3_pre, ignore_merges=True, add_bos=True),  # llama.cpp: LLAMA3's rule
    "qwen2": PreRule(_qwen2_pre),
    "qwen35": PreRule(_qwen35_pre),
}


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def spm_merges(pieces: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges equivalent to llama.cpp's SentencePiece merging over `pieces`.

    Every split of a piece into two pieces of the vocabulary is a merge; merges are ranked by
    the merged piece's score, highest first (then by its id, then by the left part's id). Run
    by a BPE that merges the lowest-ranked adjacent pair, leftmost on ties, this merges the
    pair forming the best-scoring piece first, as SPM does. (Pairs forming the same piece by
    different splits can never share a symbol, so their order does not change the result.)
    NOTE: where two *different* pieces have equal scores and their pairs overlap ("ab" and "bc"
    over "abc"), SPM takes the leftmost pair and this ranking the lower piece id. Real
    SentencePiece vocabularies give every normal piece its own score (Gemma 3's 255,474 normal
    pieces have 255,474 distinct scores); the shared -1000 of control and user-defined pieces
    never meets a merge, as those are matched whole before merging.

    Cost: Gemma's 262,144 pieces have ~1.3 M split points. Looking each half up in a dict
    takes seconds in Python, so the halves are found by hash instead (`_split_candidates`,
    vectorised); every merge returned is then checked as strings, so a hash collision can
    only cost a merge, never add a wrong one, and collisions between pieces fall back to dicts.
    """
    vocab: dict[str, int] = {}
    for i, piece in enumerate(pieces):
        vocab.setdefault(piece, i)
    merged, left, right = _split_candidates(list(vocab), np.fromiter(vocab.values(), np.int64, len(vocab)))
    score = np.asarray(scores, np.float64)
    order = np.lexsort((left, merged, -score[merged])) if len(merged) else np.empty(0, np.int64)
    return [
        (pieces[a], pieces[b])
        for m, a, b in zip(merged[order].tolist(), left[order].tolist(), right[order].tolist())
        if pieces[a] + pieces[b] == pieces[m]
    ]


_HASH_BASE = 0x100000001B3  # odd, so invertible modulo 2**64


def _split_candidates(uniq: list[str], ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(merged, left, right) id arrays: every split of a piece of `uniq` (ids[j] is uniq[j]'s id)
    whose two halves hash like pieces of `uniq` (polynomial hash modulo 2**64).

    Layout: all pieces' code points in one array; for a piece starting at s, the prefix sums of
    c[s+i] * B**-i give any prefix hash as (sum) * B**(k-1), and a suffix hash as the whole
    piece's minus the prefix's shifted: H(p[k:]) = H(p) - H(p[:k]) * B**(len-k).
    """
    lens = np.fromiter(map(len, uniq), np.int64, len(uniq))
    cps = np.frombuffer("".join(uniq).encode("utf-32-le"), np.uint32).astype(np.uint64) + np.uint64(1)
    starts = np.cumsum(lens) - lens
    max_len = int(lens.max(initial=1))
    mod = 1 << 64
    inv = pow(_HASH_BASE, -1, mod)
    pow_b = np.array([pow(_HASH_BASE, i, mod) for i in range(max_len + 1)], np.uint64)
    pow_inv = np.array([pow(inv, i, mod) for i in range(max_len + 1)], np.uint64)
    local = np.arange(len(cps), dtype=np.int64) - np.repeat(starts, lens)
    with np.errstate(over="ignore"):
        cum = np.cumsum(cps * pow_inv[local], dtype=np.uint64)  # wraps modulo 2**64, as intended
        before = np.where(starts > 0, cum[np.maximum(starts - 1, 0)], np.uint64(0))

        def prefix_hash(piece: np.ndarray, k: np.ndarray) -> np.ndarray:
            return (cum[starts[piece] + k - 1] - before[piece]) * pow_b[k - 1]

        whole = prefix_hash(np.arange(len(uniq)), np.maximum(lens, 1))
        # every split point: piece j, prefix length k in 1..len-1
        n_splits = np.maximum(lens - 1, 0)
        piece = np.repeat(np.arange(len(uniq)), n_splits)
        k = np.arange(len(piece), dtype=np.int64) - np.repeat(np.cumsum(n_splits) - n_splits, n_splits) + 1
        pre = prefix_hash(piece, k)
        suf = whole[piece] - pre * pow_b[lens[piece] - k]
    order = np.argsort(whole, kind="stable")
    table = whole[order]
    if len(table) > 1 and bool((table[1:] == table[:-1]).any()):
        return _split_candidates_dict(uniq, ids)  # two pieces share a hash: look up by string

    def lookup(h: np.ndarray) -> np.ndarray:
        at = np.minimum(np.searchsorted(table, h), len(table) - 1)
        return np.where(table[at] == h, order[at], -1)

    lpos, rpos = lookup(pre), lookup(suf)
    hit = (lpos >= 0) & (rpos >= 0)
    return ids[piece[hit]], ids[lpos[hit]], ids[rpos[hit]]


def _split_candidates_dict(uniq: list[str], ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_split_candidates` by dict lookups (slow, exact)."""
    index = {piece: int(i) for piece, i in zip(uniq, ids.tolist())}
    out: list[tuple[int, int, int]] = []
    for piece, pid in index.items():
        for k in range(1, len(piece)):
            lid, rid = index.get(piece[:k]), index.get(piece[k:])
            if lid is not None and rid is not None:
                out.append((pid, lid, rid))
    arr = np.asarray(out, np.int64).reshape(-1, 3)
    return arr[:, 0], arr[:, 1], arr[:, 2]


@dataclass(eq=False)
class Tokenizer:
    """Encode/decode for one model. Immutable after construction; safe to share across threads
    (the underlying `tokenizers` objects are thread-safe for encode)."""

    backend: HFTokenizer = field(repr=False)  # parses special-token texts
    plain_backend: HFTokenizer = field(repr=False)  # same model; special-token texts stay text
    kind: TokenizerKind  # tokenizer.ggml.model
    pieces: list[str] = field(repr=False)  # id -> vocabulary piece, as stored in the GGUF
    token_bytes: list[bytes] = field(
        repr=False
    )  # id -> raw bytes it stands for (specials: UTF-8 text; UNUSED: b"")
    special_ids: frozenset[int] = field(repr=False)  # CONTROL / UNKNOWN ids (dropped by skip_special)
    bos_id: int | None
    eos_id: int
    eos_token_ids: frozenset[int] = field(
        repr=False
    )  # every id that ends generation (eos, eot, eom, turn enders)
    add_bos_token: bool  # the model wants bos_id in front of a raw prompt

    @property
    def n_vocab(self) -> int:
        return len(self.pieces)

    @classmethod
    def from_model_file(cls, mf: ModelFile) -> Tokenizer:
        """The tokenizer described by `mf.metadata` (a gguf_file.ModelFile); see from_metadata."""
        return cls.from_metadata(mf.metadata, source=str(mf.path))

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], *, source: str = "model") -> Tokenizer:
        """Build the tokenizer described by GGUF metadata `meta` (decoded to Python values).

        UnsupportedModelError for a tokenizer model or pre-tokenizer rule slotserve lacks;
        ValueError for missing or inconsistent fields (the message names the field). `source`
        (the file's path) starts every message.
        """
        kind = meta.get("tokenizer.ggml.model")
        if kind not in SUPPORTED_MODELS:
            raise UnsupportedModelError(
                f"{source}: tokenizer.ggml.model {kind!r} is not supported; supported: "
                "'gpt2' (byte-level BPE) and 'llama' (SentencePiece)"
            )
        kind = TokenizerKind(kind)
        pieces = meta.get("tokenizer.ggml.tokens")
        if not isinstance(pieces, list) or not pieces or not all(isinstance(p, str) for p in pieces):
            raise ValueError(f"{source}: tokenizer.ggml.tokens is missing or not a list of strings")
        n = len(pieces)
        types = meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * n
        if len(types) != n:
            raise ValueError(f"{source}: tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
        types = list(types)
        # end-of-generation texts are control tokens whatever the file says (as in llama.cpp)
        for i, piece in enumerate(pieces):
            if piece in END_OF_GENERATION_TEXTS and types[i] not in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
                types[i] = TOKEN_CONTROL
        vocab: dict[str, int] = {}
        for i, piece in enumerate(pieces):
            vocab.setdefault(piece, i)  # duplicated pieces (unused slots) keep their first id

        if kind is TokenizerKind.GPT2:
            parts = _gpt2_parts(meta, source, pieces, vocab, types)
        else:
            parts = _spm_parts(meta, source, pieces, vocab, types)
        model, normalizer, pre, decoder, token_bytes, add_bos_default = parts

        control = [i for i, t in enumerate(types) if t in (TOKEN_CONTROL, TOKEN_UNKNOWN)]
        user_defined = [i for i, t in enumerate(types) if t == TOKEN_USER_DEFINED]
        backends = []
        for parse_special in (True, False):
            backend = HFTokenizer(model)  # both share the one model object (no second copy)
            if normalizer is not None:
                backend.normalizer = normalizer
            if pre is not None:
                backend.pre_tokenizer = pre
            # NOTE: decode() reads token_bytes; the decoder is for readers of the backend's JSON
            # (llguidance's token masks in gateway/structured.py tell byte-level from byte fallback by it).
            backend.decoder = decoder
            backend.add_special_tokens(
                [AddedToken(pieces[i], special=True, normalized=False) for i in control]
            )
            backend.add_tokens([AddedToken(pieces[i], special=False, normalized=False) for i in user_defined])
            backend.encode_special_tokens = not parse_special
            backends.append(backend)

        special_ids = frozenset(control)
        for i in (*control, *user_defined):
            token_bytes[i] = pieces[i].encode("utf-8")
        for i, t in enumerate(types):
            if t == TOKEN_UNUSED:
                token_bytes[i] = b""

        eos_id = _token_id(meta, source, "tokenizer.ggml.eos_token_id", n, required=True)
        assert eos_id is not None
        bos_id = _token_id(meta, source, "tokenizer.ggml.bos_token_id", n, required=False)
        eog = {eos_id}
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            extra = _token_id(meta, source, key, n, required=False)
            if extra is not None:
                eog.add(extra)
        eog.update(i for i, piece in enumerate(pieces) if piece in END_OF_GENERATION_TEXTS)
        add_bos = meta.get("tokenizer.ggml.add_bos_token", add_bos_default)
        return cls(
            backend=backends[0],
            plain_backend=backends[1],
            kind=kind,
            pieces=list(pieces),
            token_bytes=token_bytes,
            special_ids=special_ids,
            bos_id=bos_id,
            eos_id=eos_id,
            eos_token_ids=frozenset(eog),
            add_bos_token=bool(add_bos) and bos_id is not None,
        )

    def encode(self, text: str, *, add_bos: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids of `text`. With parse_special (the default) special-token texts in it (e.g.
        "<|im_start|>", "<start_of_turn>") become their ids; without, they are tokenized as
        plain text (user-defined pieces such as Gemma's space runs are matched either way, as
        in llama.cpp). add_bos prepends bos_id (once: not if the text already starts with it).
        NOTE: a byte for which a byte-level vocabulary has no token is dropped (as the HF
        tokenizer and llama.cpp do); SmolLM2 lacks 21 of the 256 byte tokens (e.g. 0x04, 0xf1)."""
        backend = self.backend if parse_special else self.plain_backend
        ids = backend.encode(text, add_special_tokens=False).ids
        if add_bos and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """The text of `ids`: their token_bytes joined and decoded as UTF-8 (bytes of a character
        split off at either end -> U+FFFD). ValueError for an id outside the vocabulary."""
        self._check_ids(ids)
        data = b"".join(self.token_bytes[i] for i in ids if not (skip_special and i in self.special_ids))
        return data.decode("utf-8", errors="replace")

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary piece of `token_id` as stored in the GGUF (e.g. 'Ġthe', '▁the')."""
        self._check_ids([token_id])
        return self.pieces[token_id]

    def _check_ids(self, ids: Sequence[int]) -> None:
        n = len(self.pieces)
        for i in ids:
            if not 0 <= i < n:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {n})")


# (model, normalizer, pre-tokenizer, decoder, token_bytes, add_bos default)
_Parts = tuple[Any, Any, Any, Any, list[bytes], bool]


def _gpt2_parts(
    meta: Mapping[str, Any], source: str, pieces: list[str], vocab: dict[str, int], types: list[int]
) -> _Parts:
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedModelError(
            f"{source}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; "
            f"supported: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    merges = meta.get("tokenizer.ggml.merges")
    if not isinstance(merges, list):
        raise ValueError(f"{source}: tokenizer.ggml.merges is missing (a gpt2 vocabulary needs it)")
    rule = PRE_TOKENIZERS[pre]
    model = models.BPE(
        vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], ignore_merges=rule.ignore_merges
    )
    to_byte = {c: b for b, c in byte_to_unicode().items()}
    token_bytes = [
        bytes(to_byte[c] for c in piece) if all(c in to_byte for c in piece) else piece.encode("utf-8")
        for piece in pieces
    ]
    return model, None, rule.factory(), decoders.ByteLevel(), token_bytes, rule.add_bos


def _spm_parts(
    meta: Mapping[str, Any], source: str, pieces: list[str], vocab: dict[str, int], types: list[int]
) -> _Parts:
    scores = meta.get("tokenizer.ggml.scores")
    if not isinstance(scores, list) or len(scores) != len(pieces):
        raise ValueError(
            f"{source}: tokenizer.ggml.scores is missing or not one score per token "
            "(a SentencePiece vocabulary needs them)"
        )
    token_bytes = []
    for piece, kind in zip(pieces, types):
        byte = _BYTE_PIECE.fullmatch(piece) if kind == TOKEN_BYTE else None
        token_bytes.append(
            bytes([int(byte.group(1), 16)]) if byte else piece.replace("▁", " ").encode("utf-8")
        )
    model = models.BPE(vocab=vocab, merges=spm_merges(pieces, scores), byte_fallback=True)
    steps: list[Any] = [normalizers.Replace(" ", "▁")]
    if meta.get("tokenizer.ggml.add_space_prefix", True):
        steps.insert(0, normalizers.Prepend("▁"))
    decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return model, normalizers.Sequence(steps), None, decoder, token_bytes, True


def _token_id(meta: Mapping[str, Any], source: str, key: str, n_vocab: int, *, required: bool) -> int | None:
    value = meta.get(key)
    if value is None:
        if required:
            raise ValueError(f"{source}: {key} is missing; the model has no end-of-sequence token")
        return None
    if not isinstance(value, int) or not 0 <= value < n_vocab:
        raise ValueError(f"{source}: {key} = {value!r} is not a token id in [0, {n_vocab})")
    return value
