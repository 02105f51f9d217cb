"""engine_ext.chat: transformers-compatible rendering, errors, and the system-prefix hint."""

from __future__ import annotations

import pytest
from slotserve.engine_ext.chat import ChatTemplate, ChatTemplateError, chat_template_for
from slotserve.engine_ext.gguf_file import load_model_file
from slotserve.engine_ext.tokenizer import Tokenizer

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Café?"},
]


@pytest.fixture(scope="module")
def real_chat(real_model_file) -> tuple[ChatTemplate, Tokenizer]:
    mf = real_model_file
    return chat_template_for(mf), Tokenizer.from_model_file(mf)


@pytest.mark.real_model
def test_smollm2_template_renders_chatml(real_chat):
    chat, _ = real_chat
    assert chat.render(CONVERSATION) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nCafé?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # No system message: the template injects its default one.
    text = chat.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n")
    assert (chat.bos_token, chat.eos_token) == ("<|im_start|>", "<|im_end|>")


@pytest.mark.real_model
def test_system_prefix_is_a_token_prefix_on_the_real_model(real_chat):
    chat, tok = real_chat
    prefix = chat.system_prefix(CONVERSATION)
    assert prefix == "<|im_start|>system\nBe brief.<|im_end|>\n"
    prefix_ids, full_ids = tok.encode(prefix), tok.encode(chat.render(CONVERSATION))
    assert full_ids[: len(prefix_ids)] == prefix_ids and len(full_ids) > len(prefix_ids)


def test_tiny_fixture_template(tiny_model_path):
    chat = chat_template_for(load_model_file(tiny_model_path))
    assert chat is not None
    assert chat.render([{"role": "user", "content": "x"}]) == (
        "<|im_start|>system\nYou are a tiny test model.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_system_prefix_none_without_leading_system():
    chat = ChatTemplate("{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}", "", "")
    assert chat.system_prefix([{"role": "user", "content": "a"}]) is None
    assert chat.system_prefix([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]) is None
    two = [
        {"role": "system", "content": "s1"},
        {"role": "system", "content": "s2"},
        {"role": "user", "content": "u"},
    ]
    assert chat.system_prefix(two) == "[system:s1][system:s2]"
    assert chat.system_prefix(two[:1]) == "[system:s1]"


def test_system_prefix_none_when_template_renders_system_differently_alone():
    # A template that puts the system text inside the first user turn (no standalone prefix).
    source = (
        "{% for m in messages %}{% if m.role == 'user' %}<u>{{ messages[0].content }}|{{ m.content }}"
        "{% endif %}{% endfor %}"
    )
    chat = ChatTemplate(source, "", "")
    assert chat.system_prefix(CONVERSATION) is None


def test_trim_and_lstrip_blocks_like_transformers():
    source = "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n{% endfor %}"
    chat = ChatTemplate(source, "", "")
    assert chat.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "U:a\nU:b\n"


def test_raise_exception_becomes_value_error():
    chat = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok", "", ""
    )
    assert chat.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ValueError, match="first must be user"):
        chat.render([{"role": "assistant", "content": "x"}])


def test_tojson_tools_bos_eos_and_generation_flag():
    source = (
        "{{ bos_token }}{% if tools %}{{ tools | tojson }}{% endif %}"
        "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}"
    )
    chat = ChatTemplate(source, "<s>", "</s>")
    tools = [{"type": "function", "function": {"name": "météo", "parameters": {}}}]
    out = chat.render([{"role": "user", "content": "q"}], tools=tools)
    assert out == '<s>[{"type": "function", "function": {"name": "météo", "parameters": {}}}]q</s>>'
    assert chat.render([{"role": "user", "content": "q"}], add_generation_prompt=False) == "<s>q</s>"


def test_loop_controls_and_strftime_available():
    chat = ChatTemplate(
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}"
        "{% endfor %}{{ strftime_now('%Y') | length }}",
        "",
        "",
    )
    assert chat.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a4"


def test_sandbox_blocks_mutation_and_internals():
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ messages.append(1) }}", "", "").render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ ''.__class__.__mro__ }}", "", "").render([])


def test_bad_template_and_bad_messages_are_value_errors():
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% for m in messages %}", "", "")
    chat = ChatTemplate("{{ messages[0]['content'] + 1 }}", "", "")
    with pytest.raises(ValueError, match="failed on these messages"):
        chat.render([{"role": "user", "content": "x"}])
