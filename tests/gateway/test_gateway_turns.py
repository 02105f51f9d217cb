"""Turn offsets (gateway/turns.py): where the chat template starts the last user message and
each assistant turn, as token offsets of the prompt, carried to the scheduler's rule turn."""

from __future__ import annotations

import dataclasses
from typing import Any

from gateway_support import (
    IM_START,
    ByteTokenizer,
    ChatML,
    Reply,
    make_runtime,
    running_app,
    scripted_runtime,
    serve_config,
)
from slotserve.gateway.app import create_app
from slotserve.gateway.runtime import Runtime
from slotserve.gateway.turns import MAX_ASSISTANT_TURNS, turn_offsets

TOK = ByteTokenizer()
CHAT = ChatML()


def msg(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "content": content}


def ids(text: str) -> list[int]:
    return TOK.encode(text)


def runtime(**kw: Any) -> Runtime:
    rt, _ = scripted_runtime(Reply(("ok",)))
    kw = {"turn_captures": True, "token_bytes": TOK.token_bytes, **kw}
    return dataclasses.replace(rt, **kw)


CONV = [
    msg("system", "be brief"),
    msg("user", "first question"),
    msg("assistant", "first answer"),
    msg("user", "second question"),
]


def test_the_last_user_message_and_each_assistant_turn_start_are_token_offsets():
    rt = runtime()
    prompt = ids(CHAT.render(CONV))
    got = turn_offsets(rt, CONV, None, prompt)
    assistant = len(ids(CHAT.render(CONV[:2], add_generation_prompt=True)))  # its reply began here
    last_user = len(ids(CHAT.render(CONV[:3], add_generation_prompt=False)))
    assert got == (assistant, last_user)
    assert TOK.decode(prompt[assistant:]).startswith("first answer")
    assert prompt[last_user] == IM_START and TOK.decode(prompt[last_user:]).startswith(
        "<|im_start|>user\nsecond"
    )


def test_only_the_last_assistant_turns_are_rendered():
    conv = [msg("user", "q0")]
    for i in range(1, 8):
        conv += [msg("assistant", f"a{i}"), msg("user", f"q{i}")]
    got = turn_offsets(runtime(), conv, None, ids(CHAT.render(conv)))
    assert len(got) == MAX_ASSISTANT_TURNS + 1
    assert TOK.decode(ids(CHAT.render(conv))[got[0] :]).startswith(f"a{8 - MAX_ASSISTANT_TURNS}")


def test_nothing_when_the_pool_rewinds_anywhere_or_the_tokens_do_not_spell_the_text():
    prompt = ids(CHAT.render(CONV))
    assert turn_offsets(runtime(turn_captures=False), CONV, None, prompt) == ()
    assert turn_offsets(runtime(), CONV, None, [*prompt[:-1], 65]) == ()  # another text
    assert turn_offsets(runtime(), [msg("user", "only")], None, ids(CHAT.render([msg("user", "only")]))) == ()


async def test_a_chat_request_carries_its_turn_offsets_to_the_scheduler():
    rt, sched = scripted_runtime(Reply(("ok",)))
    rt = dataclasses.replace(rt, turn_captures=True, token_bytes=TOK.token_bytes)
    async with running_app(create_app(rt, serve_config())) as client:
        r = await client.post("/v1/chat/completions", json={"model": rt.model_name, "messages": CONV})
    assert r.status_code == 200, r.text
    gen = sched.submitted[0]
    assert gen.turn_offsets == turn_offsets(rt, CONV, None, gen.prompt_ids) and len(gen.turn_offsets) == 2


def test_turn_offsets_with_the_real_tokenizer_and_a_jinja_template(tiny_model_path):
    """The tiny fixture's ChatML jinja template and its GGUF tokenizer (byte-level BPE): each
    offset is where the rendering of the messages before it ends, token for token."""
    from slotserve.engine_ext.chat import chat_template_for
    from slotserve.engine_ext.gguf_file import load_model_file
    from slotserve.engine_ext.tokenizer import Tokenizer

    mf = load_model_file(tiny_model_path)
    tok = Tokenizer.from_model_file(mf)
    chat = chat_template_for(mf)
    assert chat is not None
    rt = Runtime(scheduler=None, tokenizer=tok, chat=chat, model_names=("tiny",), ctx_len=512, num_slots=1,  # type: ignore[arg-type]
                 turn_captures=True, token_bytes=tok.token_bytes)  # fmt: skip
    conv = [msg("user", "hello there"), msg("assistant", "general kenobi"), msg("user", "you are a bold one")]
    prompt, _ = rt.encode_chat(conv)
    got = turn_offsets(rt, conv, None, prompt)
    assistant = tok.encode(chat.render(conv[:1], add_generation_prompt=True))
    last_user = tok.encode(chat.render(conv[:2], add_generation_prompt=False))
    assert got == (len(assistant), len(last_user))
    assert prompt[: len(assistant)] == assistant and prompt[: len(last_user)] == last_user
    assert tok.pieces[prompt[len(last_user)]] == "<|im_start|>"


async def test_an_edited_turn_restores_its_turn_checkpoint_through_the_gateway():
    """End to end on a recurrent pool (FakeSlotPool(recurrent=True)): three chat turns, then the
    second user message edited. The second request carried the offset where that message starts
    (rule turn), so the edit restores the checkpoint there; the answer equals a cold server's.
    (No interval grid: on the fake's small snapshots it would put one every 64 tokens.)"""
    system = msg("system", "You are a careful assistant who answers in full sentences. " * 2)
    users = [f"question number {i}: " + "please explain the thing in detail. " * 2 for i in range(3)]
    rt, _ = make_runtime(
        num_slots=1,
        ctx_len=2048,
        pool_options={"recurrent": True},
        checkpoint_memory_mb=8,
        checkpoint_interval_tokens=0,
    )
    assert rt.turn_captures
    conv = [system]
    async with running_app(create_app(rt, serve_config())) as client:
        for u in users:
            conv.append(msg("user", u))
            r = await client.post("/v1/chat/completions", json={"model": rt.model_name, "messages": conv, "max_tokens": 4, "temperature": 0})  # fmt: skip
            assert r.status_code == 200, r.text
            conv.append(msg("assistant", r.json()["choices"][0]["message"]["content"]))
        edited = [
            *conv[:3],
            msg("user", "question number 1: never mind, tell me a joke instead."),
        ]
        body = {"model": rt.model_name, "messages": edited, "max_tokens": 6, "temperature": 0}
        warm = (await client.post("/v1/chat/completions", json=body)).json()
    start = len(ids(CHAT.render(conv[:3], add_generation_prompt=False)))  # where user 2 starts
    assert (warm["slotserve"]["reuse_source"], warm["slotserve"]["reused_tokens"]) == (
        "checkpoint_memory",
        start,
    )
    assert warm["slotserve"]["prefilled_tokens"] == len(ids(CHAT.render(edited))) - start
    cold_rt, _ = make_runtime(num_slots=1, ctx_len=2048, reuse=False, pool_options={"recurrent": True})
    async with running_app(create_app(cold_rt, serve_config())) as client:
        cold = (await client.post("/v1/chat/completions", json=body)).json()
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
