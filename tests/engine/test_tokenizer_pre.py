"""engine_ext.tokenizer on byte-level BPE ("gpt2") vocabularies: each pre-tokenizer rule splits
text as its regex definition says (expected splits worked out by hand from the patterns quoted
in engine_ext/tokenizer.py, which are llama.cpp's and the models' tokenizer.json ones), the
rule reaches the encoder, and unknown rules or kinds are refused with UnsupportedModelError."""

from __future__ import annotations

import pytest
from slotserve.engine_ext.errors import UnsupportedModelError
from slotserve.engine_ext.tokenizer import (
    PRE_TOKENIZERS,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    Tokenizer,
    byte_to_unicode,
)

TO_BYTE = {c: b for b, c in byte_to_unicode().items()}


def split(rule: str, text: str) -> list[str]:
    pre = PRE_TOKENIZERS[rule].factory()
    return [bytes(TO_BYTE[c] for c in piece).decode("utf-8") for piece, _ in pre.pre_tokenize_str(text)]


SENTENCE = "Hello, world!!! I'M don't"
CODE = "(foo)->bar;"
NUMBERS = "x=12345+67 ab"
SPACES = "  hi\n\n  there  "
CRLF = "a\r\nb"
MARKS = "cafe\u0301 x"  # a combining acute accent (Mn) after a letter

# rule -> text -> expected pieces. Why, in short:
#   gpt-2: contractions are lower-case only ("'M" is "'" + "M"); a space run gives its last
#     space to the next word; "\r" and "\n" part (\s+(?!\S) backs off before "b").
#   default: punctuation runs are cut out first, so "don't" -> "don" "'" "t"; digit runs then
#     split into groups of three from the left.
#   smollm: every digit alone, then gpt-2.
#   llama-bpe: case-insensitive contractions; one leading non-letter joins a word ("(foo");
#     newline runs stand alone; digits in groups of 1-3; "\r\n" stays together.
#   qwen2: llama-bpe with every digit alone; a combining mark is a symbol of its own.
#   qwen35: qwen2 with combining marks inside letter runs.
EXPECTED = {
    "gpt-2": {
        SENTENCE: ["Hello", ",", " world", "!!!", " I", "'", "M", " don", "'t"],
        CODE: ["(", "foo", ")->", "bar", ";"],
        NUMBERS: ["x", "=", "12345", "+", "67", " ab"],
        SPACES: [" ", " hi", "\n\n ", " there", "  "],
        CRLF: ["a", "\r", "\n", "b"],
    },
    "default": {
        SENTENCE: ["Hello", ",", " world", "!!!", " I", "'", "M", " don", "'", "t"],
        CODE: ["(", "foo", ")->", "bar", ";"],
        NUMBERS: ["x", "=", "123", "45", "+", "67", " ab"],
        SPACES: [" ", " hi", "\n\n ", " there", "  "],
        CRLF: ["a", "\r", "\n", "b"],
    },
    "smollm": {
        SENTENCE: ["Hello", ",", " world", "!!!", " I", "'", "M", " don", "'t"],
        CODE: ["(", "foo", ")->", "bar", ";"],
        NUMBERS: ["x", "=", "1", "2", "3", "4", "5", "+", "6", "7", " ab"],
        SPACES: [" ", " hi", "\n\n ", " there", "  "],
        CRLF: ["a", "\r", "\n", "b"],
    },
    "llama-bpe": {
        SENTENCE: ["Hello", ",", " world", "!!!", " I", "'M", " don", "'t"],
        CODE: ["(foo", ")->", "bar", ";"],
        NUMBERS: ["x", "=", "123", "45", "+", "67", " ab"],
        SPACES: [" ", " hi", "\n\n", " ", " there", "  "],
        CRLF: ["a", "\r\n", "b"],
    },
    "qwen2": {
        SENTENCE: ["Hello", ",", " world", "!!!", " I", "'M", " don", "'t"],
        CODE: ["(foo", ")->", "bar", ";"],
        NUMBERS: ["x", "=", "1", "2", "3", "4", "5", "+", "6", "7", " ab"],
        SPACES: [" ", " hi", "\n\n", " ", " there", "  "],
        CRLF: ["a", "\r\n", "b"],
        MARKS: ["cafe", "\u0301", " x"],
    },
    "qwen35": {
        SENTENCE: ["Hello", ",", " world", "!!!", " I", "'M", " don", "'t"],
        CODE: ["(foo", ")->", "bar", ";"],
        NUMBERS: ["x", "=", "1", "2", "3", "4", "5", "+", "6", "7", " ab"],
        SPACES: [" ", " hi", "\n\n", " ", " there", "  "],
        CRLF: ["a", "\r\n", "b"],
        MARKS: ["cafe\u0301", " x"],
    },
}


@pytest.mark.parametrize("rule", sorted(EXPECTED))
def test_rule_splits_as_its_regex_says(rule):
    for text, pieces in EXPECTED[rule].items():
        assert split(rule, text) == pieces, (rule, text)
        assert "".join(pieces) == text


def test_aliases_share_their_rule():
    for alias, rule in (
        ("gpt2", "gpt-2"),
        ("llama3", "llama-bpe"),
        ("llama-v3", "llama-bpe"),
        ("lfm2", "llama-bpe"),
    ):
        for text, pieces in EXPECTED[rule].items():
            assert split(alias, text) == pieces


# ---- whole tokenizers on a small byte-level vocabulary ---------------------------------------


def byte_level_meta(pre: str, merges: list[str], **extra: object) -> dict[str, object]:
    """<|endoftext|>, <|im_end|>, then the 256 byte pieces, then one piece per merge."""
    u = byte_to_unicode()
    tokens = ["<|endoftext|>", "<|im_end|>"] + [u[b] for b in range(256)]
    tokens += ["".join(m.split(" ")) for m in merges]
    types = [TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_NORMAL] * (len(tokens) - 2)
    meta: dict[str, object] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 0,
    }
    meta.update(extra)
    return meta


MERGES = ["1 2", "12 3", "d o", "do n", "don '", "don' t", "Ġ Ġ"]


def pieces_of(tok: Tokenizer, text: str) -> list[str]:
    return [bytes(TO_BYTE[c] for c in tok.pieces[i]).decode() for i in tok.encode(text)]


def test_the_rule_reaches_the_encoder():
    # merges could join "123" and "don't"; the rule decides which survive the split
    expect = {
        "gpt-2": (["123"], ["don", "'", "t"]),  # "'t" is split off as a contraction
        "default": (["123"], ["don", "'", "t"]),
        "smollm": (["1", "2", "3"], ["don", "'", "t"]),
        "llama-bpe": (["123"], ["don", "'", "t"]),
        "qwen2": (["1", "2", "3"], ["don", "'", "t"]),
    }
    for rule, (digits, word) in expect.items():
        tok = Tokenizer.from_metadata(byte_level_meta(rule, MERGES))
        assert (pieces_of(tok, "123"), pieces_of(tok, "don't")) == (digits, word), rule


def test_llama_bpe_takes_whole_vocabulary_words():
    # "Ġthe" is a piece but no merge builds it: Llama 3's tokenizer (ignore_merges) still uses
    # it for the pre-token " the"; the other rules can only spell it byte by byte.
    meta = byte_level_meta("llama-bpe", ["1 2"])
    meta["tokenizer.ggml.tokens"] = [*meta["tokenizer.ggml.tokens"], "Ġthe"]
    meta["tokenizer.ggml.token_type"] = [*meta["tokenizer.ggml.token_type"], TOKEN_NORMAL]
    tok = Tokenizer.from_metadata(meta)
    assert pieces_of(tok, " the") == [" the"]
    assert tok.add_bos_token  # llama.cpp's default for Llama 3 vocabularies
    gpt2 = Tokenizer.from_metadata({**meta, "tokenizer.ggml.pre": "gpt-2"})
    assert pieces_of(gpt2, " the") == [" ", "t", "h", "e"]
    assert not gpt2.add_bos_token


def test_end_of_turn_tokens_stop_generation():
    tok = Tokenizer.from_metadata(byte_level_meta("qwen2", []))
    assert tok.eos_token_ids == {0, 1}  # eos <|endoftext|> and the ChatML turn end <|im_end|>
    assert tok.encode("a<|im_end|>") == [2 + ord("a"), 1]
    assert tok.encode("a<|im_end|>", parse_special=False)[0] == 2 + ord("a")
    assert len(tok.encode("a<|im_end|>", parse_special=False)) == 1 + len("<|im_end|>")
    # an explicit eot id joins them; so does a turn-end text stored as a normal token
    meta = byte_level_meta("llama-bpe", [], **{"tokenizer.ggml.eot_token_id": 5})
    meta["tokenizer.ggml.tokens"] = [*meta["tokenizer.ggml.tokens"], "<|eot_id|>"]
    meta["tokenizer.ggml.token_type"] = [*meta["tokenizer.ggml.token_type"], TOKEN_NORMAL]
    tok = Tokenizer.from_metadata(meta)
    eot = len(meta["tokenizer.ggml.tokens"]) - 1
    assert tok.eos_token_ids == {0, 1, 5, eot}
    assert tok.encode("<|eot_id|>") == [eot] and eot in tok.special_ids


def test_unsupported_kinds_and_rules_are_refused():
    with pytest.raises(
        UnsupportedModelError, match=r"tokenizer.ggml.model 'bert' is not supported; supported: 'gpt2'"
    ):
        Tokenizer.from_metadata(
            {**byte_level_meta("gpt-2", []), "tokenizer.ggml.model": "bert"}, source="m.gguf"
        )
    with pytest.raises(
        UnsupportedModelError, match=r"m.gguf: pre-tokenizer 'deepseek-coder' .* supported: default"
    ):
        Tokenizer.from_metadata(byte_level_meta("deepseek-coder", []), source="m.gguf")
    with pytest.raises(ValueError, match="tokenizer.ggml.merges is missing"):
        meta = byte_level_meta("gpt-2", [])
        del meta["tokenizer.ggml.merges"]
        Tokenizer.from_metadata(meta)
