"""The second real model as the gateway opens it: `--model gemma3-270m` by short name, served under
that name, completion prompts tokenized as llama.cpp does (BOS added), every end-of-turn token
stopping generation, and no chat template (the base model ships none)."""

from __future__ import annotations

import json

import pytest
from slotserve.gateway.config import ServeConfig
from slotserve.gateway.runtime import PromptError, Runtime, open_served_model

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def opened(gemma3_model_path):
    return open_served_model(ServeConfig(model="gemma3-270m", batched_session=1, ctx_size=256, threads=1))


def test_served_by_short_name(opened, gemma3_model_path):
    assert opened.path == gemma3_model_path
    assert opened.model_names == ("gemma3-270m", "gemma-3-270m-q4_k_m")


def test_prompts_and_stop_tokens(opened, shared_fixtures_dir):
    tok = opened.bundle.tokenizer
    runtime = Runtime(scheduler=None, tokenizer=tok, chat=opened.bundle.chat, model_names=opened.model_names,
                      ctx_len=256, num_slots=1)  # fmt: skip
    cases = json.loads((shared_fixtures_dir / "gemma3_greedy_llamacpp.json").read_text())
    assert [runtime.encode_prompt(c["prompt"]) for c in cases] == [c["prompt_ids"] for c in cases]
    assert {tok.pieces[i] for i in tok.eos_token_ids} == {"<eos>", "<end_of_turn>"}
    with pytest.raises(PromptError, match="no chat template"):
        runtime.encode_chat([{"role": "user", "content": "hi"}])


def test_ctx_size_over_gemmas_32k_is_refused(opened):
    from slotserve.engine_ext.errors import ModelOpenError
    from slotserve.engine_ext.loader import check_ctx_len

    model_file = opened.bundle.model_file
    check_ctx_len(model_file, 32768)
    with pytest.raises(ModelOpenError, match="--ctx-size 32769 exceeds the 32768 tokens"):
        check_ctx_len(model_file, 32769)
    check_ctx_len(model_file, 32769, allow_over_train=True)
