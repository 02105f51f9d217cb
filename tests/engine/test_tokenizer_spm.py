"""engine_ext.tokenizer on SentencePiece ("llama") vocabularies: llama.cpp's ids for Gemma 3,
agreement with the step-by-step reference (tests/spm_reference.py) on Gemma's vocabulary and on
small vocabularies built here, byte fallback, the space-prefix rule, special tokens, decoding."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slotserve.engine_ext.chat import chat_template_for
from slotserve.engine_ext.tokenizer import (
    TOKEN_BYTE,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNKNOWN,
    TOKEN_USER_DEFINED,
    Tokenizer,
    spm_merges,
)
from spm_reference import SpmReference

# ---- Gemma 3 (the real file) -----------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_tok(gemma3_metadata) -> Tokenizer:
    return Tokenizer.from_metadata(gemma3_metadata, source="gemma3")


@pytest.fixture(scope="module")
def gemma_ref(gemma3_metadata) -> SpmReference:
    m = gemma3_metadata
    return SpmReference(
        m["tokenizer.ggml.tokens"],
        m["tokenizer.ggml.scores"],
        m["tokenizer.ggml.token_type"],
        add_space_prefix=m["tokenizer.ggml.add_space_prefix"],
    )


@pytest.mark.real_model
def test_gemma3_cases_match_llamacpp_exactly(gemma_tok, gemma_ref, shared_fixtures_dir):
    cases = json.loads((shared_fixtures_dir / "gemma3_tokenizer_cases.json").read_text())
    assert len(cases) == 15
    # llama.cpp tokenized these as plain text: no BOS, special-token texts not parsed
    ours = [gemma_tok.encode(c["text"], parse_special=False) for c in cases]
    assert [(c["text"], ids) for c, ids in zip(cases, ours) if ids != c["ids"]] == []
    # the reference port agrees too, so it can stand in for llama.cpp on other texts
    assert [gemma_ref.encode(c["text"], parse_special=False) for c in cases] == [c["ids"] for c in cases]
    for c in cases:
        assert gemma_tok.decode(c["ids"]) == c["text"]


@pytest.mark.real_model
def test_gemma3_prompts_and_continuations_match_llamacpp(gemma_tok, shared_fixtures_dir):
    # llama.cpp's prompt ids for the greedy cases: BOS added (the file asks for it), special
    # tokens parsed (<start_of_turn> is one id); its generated tokens decode to its text.
    cases = json.loads((shared_fixtures_dir / "gemma3_greedy_llamacpp.json").read_text())
    assert [gemma_tok.encode(c["prompt"], add_bos=gemma_tok.add_bos_token) for c in cases] == [
        c["prompt_ids"] for c in cases
    ]
    for c in cases:
        assert gemma_tok.decode([s["id"] for s in c["steps"]]).startswith(c["continuation"])


# Texts mixing what Gemma's vocabulary treats specially: runs of spaces/tabs/newlines
# (user-defined pieces), "▁", special-token spellings, byte-fallback characters.
gemma_alphabet = st.sampled_from(
    ["a", "b", "e", "the", " ", "  ", "\t", "\n", "\n\n", "▁", "<", ">", "end_of_turn", "<start_of_turn>",
     "<eos>", "é", "日本", "🤖", "\U0010fffd", "\x00", "1", "23", ".", "'", "İ", "\u200b"]
)  # fmt: skip
gemma_text = st.lists(st.one_of(gemma_alphabet, st.text(max_size=4)), max_size=24).map("".join)


@pytest.mark.real_model
@settings(max_examples=80, deadline=None)
@given(text=gemma_text, parse_special=st.booleans())
def test_gemma3_agrees_with_reference(gemma_tok, gemma_ref, text, parse_special):
    ids = gemma_tok.encode(text, parse_special=parse_special)
    assert ids == gemma_ref.encode(text, parse_special=parse_special)
    if not parse_special:
        # byte fallback: every text round-trips, except that a literal "▁" reads as a space
        assert gemma_tok.decode(ids) == text.replace("▁", " ")


@pytest.mark.real_model
def test_gemma3_special_tokens(gemma_tok):
    assert (gemma_tok.kind, gemma_tok.n_vocab, gemma_tok.bos_id, gemma_tok.eos_id) == ("llama", 262144, 2, 1)
    assert gemma_tok.add_bos_token
    turn_end = gemma_tok.pieces.index("<end_of_turn>")
    assert gemma_tok.eos_token_ids == {1, turn_end}  # <eos> and <end_of_turn> stop generation
    ids = gemma_tok.encode("<start_of_turn>user\nHi<end_of_turn>\n", add_bos=True)
    assert ids[:2] == [2, gemma_tok.pieces.index("<start_of_turn>")] and turn_end in ids
    assert gemma_tok.decode(ids) == "<bos><start_of_turn>user\nHi<end_of_turn>\n"
    assert gemma_tok.decode(ids, skip_special=True) == "user\nHi\n"
    # byte pieces decode to their byte, "▁" to a space; a split character decodes to U+FFFD
    assert gemma_tok.token_bytes[gemma_tok.pieces.index("<0x0A>")] == b"\n"
    assert gemma_tok.token_bytes[gemma_tok.pieces.index("▁the")] == b" the"
    private = "\U0010fffd"  # a private-use character: no piece, four byte pieces
    assert private not in gemma_tok.pieces
    ids = gemma_tok.encode(private, parse_special=False)
    assert [gemma_tok.pieces[i] for i in ids] == ["<0xF4>", "<0x8F>", "<0xBF>", "<0xBD>"]
    assert gemma_tok.decode(ids[:2]) == "\ufffd" and gemma_tok.decode(ids) == private


@pytest.mark.real_model
def test_gemma3_streams_through_the_incremental_detokenizer(gemma_tok):
    # The scheduler's detokenizer sees only token_bytes: byte-fallback pieces of one character
    # arrive separately and must come out as that character, once, with nothing lost.
    from slotserve.scheduler.detok import Detokenizer

    text = "Ünïcödé \U0010fffd and 日本語, tabs\t\tand  spaces\n\nend"
    ids = gemma_tok.encode(text, parse_special=False)
    assert any(gemma_tok.pieces[i].startswith("<0x") for i in ids)  # byte fallback is exercised
    detok = Detokenizer(gemma_tok.token_bytes)
    chunks = [detok.push(i) for i in ids]
    assert "".join(chunks) + detok.flush() == text
    assert "\ufffd" not in "".join(chunks)


@pytest.mark.real_model
def test_gemma3_file_has_no_chat_template(gemma3_model_path, gemma3_metadata):
    # The pretrained (base) model ships without tokenizer.chat_template: it gets the built-in
    # Gemma template (engine_ext/chat_builtin.py), chosen by its architecture.
    from slotserve.engine_ext.gguf_file import load_model_file

    assert "tokenizer.chat_template" not in gemma3_metadata
    mf = load_model_file(gemma3_model_path)
    assert chat_template_for(mf, builtin=False) is None
    chat = chat_template_for(mf)
    assert chat is not None and chat.origin.startswith("built-in gemma (architecture gemma3")
    assert (chat.bos_token, chat.eos_token) == ("<bos>", "<eos>")


# ---- small vocabularies built here ---------------------------------------------------------


def small_spm(add_space_prefix: bool = True, **extra: object) -> dict[str, object]:
    """A Llama-2-like SentencePiece vocabulary: <unk>, <s>, </s>, 256 byte pieces, then pieces
    whose scores decide the merges (built so that greedy-by-score and left-to-right differ)."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256
    scores = [0.0] * len(pieces)
    normal = {
        "▁": -1.0, "a": -2.0, "b": -3.0, "c": -4.0, "h": -5.0, "i": -6.0, "e": -7.0, "l": -8.0, "o": -9.0,
        "▁h": -10.0, "hi": -11.0, "▁hi": -12.0, "ab": -20.0, "bc": -13.0, "he": -14.0,
        "ll": -15.0, "hell": -16.0, "hello": -17.0, "▁hello": -18.0, "lo": -19.0, "▁▁": -21.0,
    }  # fmt: skip
    pieces += list(normal)
    types += [TOKEN_NORMAL] * len(normal)
    scores += list(normal.values())
    pieces.append("<tab>")
    types.append(TOKEN_USER_DEFINED)
    scores.append(0.0)
    meta: dict[str, object] = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": pieces,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }
    meta.update(extra)
    return meta


def _ref(meta: dict[str, object]) -> SpmReference:
    return SpmReference(
        meta["tokenizer.ggml.tokens"],
        meta["tokenizer.ggml.scores"],
        meta["tokenizer.ggml.token_type"],
        add_space_prefix=bool(meta["tokenizer.ggml.add_space_prefix"]),
    )


def _pieces(tok: Tokenizer, ids: list[int]) -> list[str]:
    return [tok.pieces[i] for i in ids]


def test_merges_follow_scores_not_position():
    tok = Tokenizer.from_metadata(small_spm(add_space_prefix=False))
    # "bc" (-13) outscores "ab" (-20): the right pair merges first (left to right would give ab, c)
    assert _pieces(tok, tok.encode("abc")) == ["a", "bc"]
    assert _pieces(tok, tok.encode("hello")) == ["hello"]  # he, ll, hell, hello
    # "▁h" (-10) beats "he" (-14), so " hello" never becomes "▁hello": l+l then stops
    assert _pieces(tok, tok.encode("hi hello")) == ["hi", "▁h", "e", "ll", "o"]


def test_space_prefix_rule():
    with_prefix = Tokenizer.from_metadata(small_spm(add_space_prefix=True))
    without = Tokenizer.from_metadata(small_spm(add_space_prefix=False))
    assert _pieces(with_prefix, with_prefix.encode("hi")) == ["▁hi"]
    assert _pieces(without, without.encode("hi")) == ["hi"]
    # the prefix is added to every text fragment, after a special token too (llama.cpp)
    assert _pieces(with_prefix, with_prefix.encode("<s>hi</s>hi")) == ["<s>", "▁hi", "</s>", "▁hi"]
    assert _pieces(with_prefix, with_prefix.encode("<s>hi", parse_special=False)) == [
        "▁", "<0x3C>", "<0x73>", "<0x3E>", "hi"
    ]  # fmt: skip
    # absent key: llama.cpp's default for SentencePiece is to add the prefix
    meta = small_spm()
    del meta["tokenizer.ggml.add_space_prefix"]
    assert _pieces(Tokenizer.from_metadata(meta), Tokenizer.from_metadata(meta).encode("hi")) == ["▁hi"]


def test_byte_fallback_and_decoding():
    tok = Tokenizer.from_metadata(small_spm(add_space_prefix=False))
    ids = tok.encode("hé")
    assert _pieces(tok, ids) == ["h", "<0xC3>", "<0xA9>"]
    assert tok.decode(ids) == "hé" and tok.decode(ids[:2]) == "h\ufffd"
    assert tok.token_bytes[tok.pieces.index("▁hello")] == b" hello"
    assert [tok.token_bytes[3 + b] for b in range(256)] == [bytes([b]) for b in range(256)]
    # a user-defined piece is one token whatever parse_special says, and decodes to its text
    tab = tok.pieces.index("<tab>")
    assert tok.encode("a<tab>b", parse_special=False) == [tok.pieces.index("a"), tab, tok.pieces.index("b")]
    assert tok.decode([tab]) == "<tab>"


def test_bos_default_and_override():
    assert Tokenizer.from_metadata(small_spm()).add_bos_token  # SentencePiece default: add BOS
    tok = Tokenizer.from_metadata(small_spm(**{"tokenizer.ggml.add_bos_token": False}))
    assert not tok.add_bos_token
    assert tok.encode("hi", add_bos=True)[0] == 1


small_text = st.text(st.sampled_from("abchilo▁ é<>s/\t"), max_size=40)


@settings(max_examples=300, deadline=None)
@given(text=small_text, add_space_prefix=st.booleans(), parse_special=st.booleans())
def test_small_vocab_agrees_with_reference(text, add_space_prefix, parse_special):
    meta = small_spm(add_space_prefix=add_space_prefix)
    tok = _tok_cache(add_space_prefix)
    assert tok.encode(text, parse_special=parse_special) == _ref(meta).encode(
        text, parse_special=parse_special
    )


_TOKS: dict[bool, Tokenizer] = {}


def _tok_cache(add_space_prefix: bool) -> Tokenizer:
    if add_space_prefix not in _TOKS:
        _TOKS[add_space_prefix] = Tokenizer.from_metadata(small_spm(add_space_prefix=add_space_prefix))
    return _TOKS[add_space_prefix]


def test_spm_merges_lists_every_split_by_score():
    pieces = ["a", "b", "c", "ab", "bc", "abc", "x"]
    scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0, 0.0]
    # abc splits as a+bc and ab+c; bc (-1) ranks first, then ab (-2), then both splits of abc
    assert spm_merges(pieces, scores) == [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]


def test_spm_needs_scores():
    meta = small_spm()
    del meta["tokenizer.ggml.scores"]
    with pytest.raises(ValueError, match="tokenizer.ggml.scores"):
        Tokenizer.from_metadata(meta, source="m.gguf")
