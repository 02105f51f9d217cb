"""Constrained decoding over a vocabulary with UNUSED tokens (the synthetic files'): they stand
for no text (engine_ext/tokenizer.py), and llguidance never allows them, wherever the grammar is."""

from __future__ import annotations

from slotserve.bench.synthetic import MERGES, vocab
from slotserve.engine_ext.tokenizer import TOKEN_UNUSED, Tokenizer
from slotserve.gateway.structured import GrammarCompiler


def test_unused_tokens_are_never_allowed_by_a_grammar():
    tokens, types = vocab(600)
    tok = Tokenizer.from_metadata(
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "qwen2",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": list(MERGES),
            "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.bos_token_id": 0,
        }
    )
    unused = [i for i, t in enumerate(types) if t == TOKEN_UNUSED]
    assert len(unused) > 300
    compiler = GrammarCompiler.for_tokenizer(tok)
    try:
        seq = compiler.json_schema({"type": "object", "properties": {"a": {"type": "string"}}}).start()
        checked = 0
        for t in tok.encode('{"a": "x [UNUSED_400] y"}'):
            allowed = seq.allowed()
            assert allowed[t]
            assert not allowed[unused].any()
            checked += 1
            seq.accept(t)
        assert checked > 10 and seq.allowed()[tok.eos_id]
    finally:
        compiler.close()
