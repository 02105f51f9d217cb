"""The second real model as the gateway opens it: `--model gemma3-270m` by short name, served under
that name, completion prompts tokenized as llama.cpp does (BOS added), every end-of-turn token
stopping generation, and the built-in Gemma chat template (the base model ships none): a chat
request's prompt, its stop at `<end_of_turn>`, and a second turn that reuses the first."""

from __future__ import annotations

import json

import openai
import pytest
from gateway_support import LiveServer, free_port
from slotserve.gateway.app import create_app
from slotserve.gateway.config import ServeConfig
from slotserve.gateway.runtime import Runtime, build_runtime, open_served_model

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
    ids, hint = runtime.encode_chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    bos, start, end, newline, blank = 2, 105, 106, 107, 108  # <bos> <start_of_turn> <end_of_turn> \n \n\n
    user, model = tok.encode("user"), tok.encode("model")
    assert ids == [bos, start, *user, newline, *tok.encode("Be brief."), blank, *tok.encode("Hi"), end, newline,
                   start, *model, newline]  # fmt: skip
    assert hint == ids.index(blank) + 1  # the system text's checkpoint hint: the open first turn


# A few-shot conversation: the base model continues the pattern ("Paris."). It never closes a turn
# by itself: its log-probability of <end_of_turn> is about -15 where a turn would end (the NumPy
# reference agrees), so it writes some other token there and runs to max_tokens.
FEW_SHOT = [
    {"role": "system", "content": "Answer with one word."},
    {"role": "user", "content": "What is the capital of Italy?"},
    {"role": "assistant", "content": "Rome."},
    {"role": "user", "content": "What is the capital of Germany?"},
    {"role": "assistant", "content": "Berlin."},
    {"role": "user", "content": "What is the capital of France?"},
]


def live(opened, **overrides) -> LiveServer:
    config = ServeConfig(model="gemma3-270m", port=free_port(), log_level="warning", batched_session=1,
                         ctx_size=256, threads=1, **overrides)  # fmt: skip
    runtime = build_runtime(config, opened)
    return LiveServer(create_app(runtime, config), runtime, config)


def test_chat_stops_at_end_of_turn_and_reuses_the_first_turn(opened):
    def ask(server: LiveServer, messages, **extra):
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
        return client.chat.completions.create(
            model="gemma3-270m", messages=messages, max_tokens=12, temperature=0, **extra
        )

    with live(opened) as server:
        first = ask(server, FEW_SHOT)
        answer = first.choices[0].message.content
        assert answer.startswith("Paris")
        # <end_of_turn> ends the reply when the model writes it (here made to, first)
        forced = ask(server, FEW_SHOT, logit_bias={"106": 100})
        assert (forced.choices[0].finish_reason, forced.choices[0].message.content) == ("stop", "")
        assert forced.usage.prompt_tokens_details.cached_tokens > 0
        turn2 = [
            *FEW_SHOT,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And of Spain?"},
        ]
        warm = ask(server, turn2)
        # the template renders the earlier turns as the first request did: all of it is reused
        assert warm.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
        assert (
            warm.model_dump()["slotserve"]["reused_tokens"] == warm.usage.prompt_tokens_details.cached_tokens
        )
    with live(opened, no_reuse=True) as server:
        cold = ask(server, turn2)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert cold.choices[0].message.content == warm.choices[0].message.content


def test_ctx_size_over_gemmas_32k_is_refused(opened):
    from slotserve.engine_ext.errors import ModelOpenError
    from slotserve.engine_ext.loader import check_ctx_len

    model_file = opened.bundle.model_file
    check_ctx_len(model_file, 32768)
    with pytest.raises(ModelOpenError, match="--ctx-size 32769 exceeds the 32768 tokens"):
        check_ctx_len(model_file, 32769)
    check_ctx_len(model_file, 32769, allow_over_train=True)
