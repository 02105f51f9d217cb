"""engine_ext.tokenizer: exact agreement with the reference SmolLM2 encodings, round trips,
special tokens, and the tiny fixture's tokenizer."""

from __future__ import annotations

import dataclasses
import json

import pytest
from gguf_fixtures import TINY_MERGES, byte_to_unicode
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from slotserve.engine_ext.errors import UnsupportedModelError
from slotserve.engine_ext.gguf_file import load_model_file
from slotserve.engine_ext.tokenizer import Tokenizer

# Text without the special-token strings (those encode as one id by design).
plain_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60).filter(lambda s: "<|" not in s)


@pytest.fixture(scope="module")
def real_tok(real_model_file) -> Tokenizer:
    return Tokenizer.from_model_file(real_model_file)


@pytest.fixture(scope="module")
def tiny_tok(tiny_model_path) -> Tokenizer:
    return Tokenizer.from_model_file(load_model_file(tiny_model_path))


# ---- the real SmolLM2 tokenizer ------------------------------------------------------------


@pytest.mark.real_model
def test_every_shared_case_encodes_exactly(real_tok, shared_fixtures_dir):
    cases = json.loads((shared_fixtures_dir / "smollm2_tokenizer_cases.json").read_text())
    assert len(cases) >= 20
    mismatches = [
        (c["text"], real_tok.encode(c["text"]), c["ids"])
        for c in cases
        if real_tok.encode(c["text"]) != c["ids"]
    ]
    assert mismatches == []
    for c in cases:
        assert real_tok.decode(c["ids"]) == c["text"]


@pytest.mark.real_model
def test_llamacpp_prompt_ids_agree(real_tok, shared_fixtures_dir):
    cases = json.loads((shared_fixtures_dir / "smollm2_greedy_llamacpp.json").read_text())
    assert [real_tok.encode(c["prompt"]) for c in cases] == [c["prompt_ids"] for c in cases]


@pytest.mark.real_model
def test_real_special_ids(real_tok):
    assert (real_tok.bos_id, real_tok.eos_id, real_tok.n_vocab) == (1, 2, 49152)
    assert real_tok.eos_token_ids == {0, 2}  # <|im_end|> and <|endoftext|>
    assert not real_tok.add_bos_token
    assert real_tok.encode("<|im_start|>user\nhi<|im_end|>")[0] == 1
    assert real_tok.encode("<|im_start|>user\nhi<|im_end|>")[-1] == 2
    assert real_tok.id_to_piece(260) == "Ġthe" and real_tok.token_bytes[260] == b" the"
    assert real_tok.token_bytes[1] == b"<|im_start|>"


@pytest.mark.real_model
@settings(max_examples=150, deadline=None)
@given(text=plain_text)
def test_real_round_trip(real_tok, text):
    # SmolLM2's vocabulary lacks 21 byte tokens (e.g. 0x04, 0xf1): bytes without a token are
    # dropped, as in the HF tokenizer and llama.cpp; text using them cannot round-trip.
    single_bytes = {
        b[0] for i, b in enumerate(real_tok.token_bytes) if len(b) == 1 and i not in real_tok.special_ids
    }
    assume(set(text.encode("utf-8")) <= single_bytes)
    ids = real_tok.encode(text)
    assert real_tok.decode(ids) == text
    assert b"".join(real_tok.token_bytes[i] for i in ids) == text.encode("utf-8")


# ---- the tiny fixture's tokenizer -----------------------------------------------------------


def test_tiny_vocab_layout(tiny_tok):
    assert tiny_tok.n_vocab == 299 == 3 + 256 + len(TINY_MERGES)
    assert (tiny_tok.bos_id, tiny_tok.eos_id, tiny_tok.eos_token_ids) == (1, 2, frozenset({0, 2}))
    assert tiny_tok.special_ids == {0, 1, 2}
    assert [tiny_tok.token_bytes[3 + b] for b in range(256)] == [bytes([b]) for b in range(256)]
    assert tiny_tok.id_to_piece(3 + 32) == byte_to_unicode()[32] == "Ġ"


def test_tiny_merges_and_specials(tiny_tok):
    the = tiny_tok.pieces.index("Ġthe")
    assert tiny_tok.encode(" the") == [the]
    assert tiny_tok.encode("<|im_start|>user\n the<|im_end|>") == [1, *tiny_tok.encode("user\n"), the, 2]
    assert tiny_tok.encode("123") == [3 + ord("1"), 3 + ord("2"), 3 + ord("3")]  # digits split
    assert tiny_tok.encode("x", add_bos=True) == [1, 3 + ord("x")]
    assert tiny_tok.encode("<|im_start|>", add_bos=True) == [1]
    assert tiny_tok.decode([1, the, 2]) == "<|im_start|> the<|im_end|>"
    assert tiny_tok.decode([1, the, 2], skip_special=True) == " the"


@settings(max_examples=200, deadline=None)
@given(text=plain_text)
def test_tiny_round_trip(tiny_tok, text):
    ids = tiny_tok.encode(text)
    assert all(0 <= i < tiny_tok.n_vocab for i in ids)
    assert tiny_tok.decode(ids) == text


def test_decode_rejects_ids_outside_vocab(tiny_tok):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny_tok.decode([5, 299])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny_tok.id_to_piece(-1)


@pytest.mark.real_model
def test_bytes_missing_from_the_vocabulary_are_dropped(real_tok):
    assert real_tok.encode("a\U00040000b") == [81, 218, 218, 218, 82]  # 0xf1 has no token


def test_split_character_decodes_to_replacement(tiny_tok):
    ids = tiny_tok.encode("é")  # two byte tokens
    assert len(ids) == 2 and tiny_tok.decode(ids[:1]) == "\ufffd"


def test_unsupported_tokenizer_kinds_are_rejected(tiny_model_path):
    mf = load_model_file(tiny_model_path)
    ugm = dataclasses.replace(mf, metadata={**mf.metadata, "tokenizer.ggml.model": "t5"})
    with pytest.raises(UnsupportedModelError, match="tokenizer.ggml.model 't5' is not supported"):
        Tokenizer.from_model_file(ugm)
    odd = dataclasses.replace(mf, metadata={**mf.metadata, "tokenizer.ggml.pre": "deepseek-coder"})
    with pytest.raises(UnsupportedModelError, match="pre-tokenizer 'deepseek-coder'"):
        Tokenizer.from_model_file(odd)


# ---- UNUSED tokens: no text (llama.cpp's token_to_piece) --------------------------------------


def _synthetic_tok(n_vocab: int = 400) -> Tokenizer:
    """The vocabulary `bench engine --synthetic` writes: controls, bytes, merges, UNUSED padding."""
    from slotserve.bench.synthetic import MERGES, vocab

    tokens, types = vocab(n_vocab)
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": list(MERGES),
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.bos_token_id": 0,
    }
    return Tokenizer.from_metadata(meta)


def test_unused_tokens_stand_for_no_text():
    from slotserve.scheduler.detok import Detokenizer

    tok = _synthetic_tok()
    first_unused = 3 + 256 + 8
    unused = [first_unused, first_unused + 50, 399]
    assert [tok.id_to_piece(i) for i in unused] == [f"[UNUSED_{i}]" for i in unused]  # the piece is kept
    assert all(tok.token_bytes[i] == b"" for i in unused)
    a, b = tok.encode("a"), tok.encode("b")
    reply = [unused[0], *a, unused[1], unused[2], *b]
    assert tok.decode(reply) == "ab"
    # a reply's text re-tokenizes to its ids without the UNUSED ones (the next turn's prompt)
    assert tok.encode(tok.decode(reply)) == [*a, *b]
    detok = Detokenizer(tok.token_bytes)
    assert "".join(detok.push(t) for t in reply) + detok.flush() == "ab"
    # the piece's spelling is text like any other, never the UNUSED id
    assert first_unused not in tok.encode(f"[UNUSED_{first_unused}]")
    # control and byte tokens keep their text
    assert tok.token_bytes[1] == b"<|im_start|>" and tok.token_bytes[3 + ord("x")] == b"x"
