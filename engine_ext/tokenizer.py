"""The model's tokenizer, rebuilt from GGUF metadata on the `tokenizers` library.

Design: GGUF stores a gpt2-style byte-level BPE as `tokenizer.ggml.tokens` (id -> piece, in the
GPT-2 bytes_to_unicode alphabet), `tokenizer.ggml.merges` ("left right", by rank) and a
pre-tokenizer *name* in `tokenizer.ggml.pre`. We map that name to the equivalent `tokenizers`
pre-tokenizer (PRE_TOKENIZERS below), add CONTROL / USER_DEFINED pieces as added tokens (so
"<|im_start|>" in text encodes as its special id), and decode byte-level.

Only `tokenizer.ggml.model == "gpt2"` is supported (SmolLM2, Llama 3, Qwen-style vocabularies);
SentencePiece vocabularies ("llama", e.g. TinyLlama) fail with a clear error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from .gguf_file import ModelFile

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Control tokens that end generation when present, besides eos / eot / eom ids (as llama.cpp
# treats them): chat-turn terminators of common templates.
END_OF_GENERATION_TEXTS = (
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
)

# Llama 3's split regex (tokenizer.ggml.pre "llama-bpe"): contractions, letter runs with one
# optional leading non-letter, digit groups of 1-3, punctuation runs, newlines, spaces.
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2_pre() -> Any:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm_pre() -> Any:
    # Every digit on its own, then GPT-2's byte-level regex.
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2_pre()])


def _llama3_pre() -> Any:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


# tokenizer.ggml.pre -> (pre-tokenizer factory, ignore_merges: whole pre-tokens found in the
# vocabulary are taken as-is before merging, as Llama 3's tokenizer does).
PRE_TOKENIZERS = {
    "default": (_gpt2_pre, False),
    "gpt2": (_gpt2_pre, False),
    "smollm": (_smollm_pre, False),
    "llama-bpe": (_llama3_pre, True),
    "llama3": (_llama3_pre, True),
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


@dataclass(eq=False)
class Tokenizer:
    """Encode/decode for one model. Immutable after construction; safe to share across threads
    (the underlying `tokenizers` object is thread-safe for encode/decode)."""

    backend: HFTokenizer = field(repr=False)
    pieces: list[str] = field(repr=False)  # id -> vocabulary piece, as stored in the GGUF
    token_bytes: list[bytes] = field(repr=False)  # id -> raw bytes it stands for (specials: UTF-8 text)
    special_ids: frozenset[int]  # CONTROL / USER_DEFINED ids (parsed from text as one token)
    bos_id: int | None
    eos_id: int
    eos_token_ids: frozenset[int]  # every id that ends generation (eos, eot, eom, turn enders)
    add_bos_token: bool  # the model wants bos_id in front of a raw prompt

    @property
    def n_vocab(self) -> int:
        return len(self.pieces)

    @classmethod
    def from_model_file(cls, mf: ModelFile) -> Tokenizer:
        """Build the tokenizer described by `mf.metadata`; ValueError if it is missing or of a
        kind not supported (the message names the field and the value)."""
        meta = mf.metadata
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(
                f"{mf.path}: tokenizer.ggml.model {kind!r} is not supported; only "
                "byte-level BPE ('gpt2') vocabularies are"
            )
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZERS:
            raise ValueError(
                f"{mf.path}: pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; "
                f"supported: {', '.join(sorted(PRE_TOKENIZERS))}"
            )
        pieces = meta.get("tokenizer.ggml.tokens")
        merges = meta.get("tokenizer.ggml.merges")
        if not isinstance(pieces, list) or not isinstance(merges, list):
            raise ValueError(f"{mf.path}: tokenizer.ggml.tokens / tokenizer.ggml.merges are missing")
        types = meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(pieces)
        if len(types) != len(pieces):
            raise ValueError(
                f"{mf.path}: tokenizer.ggml.token_type has {len(types)} entries for {len(pieces)} tokens"
            )
        vocab: dict[str, int] = {}
        for i, piece in enumerate(pieces):
            vocab.setdefault(piece, i)  # duplicated pieces (unused slots) keep their first id
        pre_factory, ignore_merges = PRE_TOKENIZERS[pre]
        backend = HFTokenizer(
            models.BPE(
                vocab=vocab,
                merges=[tuple(m.split(" ", 1)) for m in merges],
                ignore_merges=ignore_merges,
            )
        )
        backend.pre_tokenizer = pre_factory()
        backend.decoder = decoders.ByteLevel()
        special_ids = frozenset(i for i, t in enumerate(types) if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED))
        backend.add_special_tokens(
            [
                AddedToken(pieces[i], special=types[i] == TOKEN_CONTROL, normalized=False)
                for i in sorted(special_ids)
            ]
        )

        to_byte = {c: b for b, c in byte_to_unicode().items()}
        token_bytes = [
            piece.encode("utf-8")
            if i in special_ids or any(c not in to_byte for c in piece)
            else bytes(to_byte[c] for c in piece)
            for i, piece in enumerate(pieces)
        ]

        n = len(pieces)
        eos_id = _token_id(mf, "tokenizer.ggml.eos_token_id", n, required=True)
        bos_id = _token_id(mf, "tokenizer.ggml.bos_token_id", n, required=False)
        eog = {eos_id}
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
            extra = _token_id(mf, key, n, required=False)
            if extra is not None:
                eog.add(extra)
        eog.update(
            i for i in special_ids if types[i] == TOKEN_CONTROL and pieces[i] in END_OF_GENERATION_TEXTS
        )
        return cls(
            backend=backend,
            pieces=list(pieces),
            token_bytes=token_bytes,
            special_ids=special_ids,
            bos_id=bos_id,
            eos_id=eos_id,
            eos_token_ids=frozenset(eog),
            add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos_id is not None,
        )

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Token ids of `text`; special-token texts in it (e.g. "<|im_start|>") become their ids.
        add_bos prepends bos_id (once: not if the text already starts with it).
        NOTE: a byte for which the vocabulary has no token is dropped (as the HF tokenizer and
        llama.cpp do); SmolLM2 lacks 21 of the 256 byte tokens (e.g. 0x04, 0xf1)."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
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
        """The vocabulary piece of `token_id` as stored in the GGUF (e.g. 'Ġthe')."""
        self._check_ids([token_id])
        return self.pieces[token_id]

    def _check_ids(self, ids: Sequence[int]) -> None:
        n = len(self.pieces)
        for i in ids:
            if not 0 <= i < n:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {n})")


def _token_id(mf: ModelFile, key: str, n_vocab: int, *, required: bool) -> int | None:
    value = mf.metadata.get(key)
    if value is None:
        if required:
            raise ValueError(f"{mf.path}: {key} is missing; the model has no end-of-sequence token")
        return None
    if not isinstance(value, int) or not 0 <= value < n_vocab:
        raise ValueError(f"{mf.path}: {key} = {value!r} is not a token id in [0, {n_vocab})")
    return value
