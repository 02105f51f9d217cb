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


# ---- built-in templates (engine_ext/chat_builtin.py) for files without one -----------------

GEMMA_TURNS = [
    {"role": "system", "content": " Be brief. "},
    {"role": "user", "content": "Hi\n"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Café?"},
]


def builtin(name: str) -> ChatTemplate:
    from slotserve.engine_ext.chat_builtin import BUILTIN_TEMPLATES

    return ChatTemplate(BUILTIN_TEMPLATES[name], bos_token="<bos>", eos_token="<eos>")


def test_gemma_builtin_renders_gemmas_turns():
    # Google's Gemma 3 turn format: bos, trimmed texts, system text (trimmed) + a blank line at
    # the start of the first user turn, `model` for the assistant, `<start_of_turn>model\n` last.
    chat = builtin("gemma")
    assert chat.render(GEMMA_TURNS) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nCafé?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert (
        chat.render(GEMMA_TURNS[1:2], add_generation_prompt=False)
        == "<bos><start_of_turn>user\nHi<end_of_turn>\n"
    )
    # tool output (the gateway's shim sends role "tool") is a user turn
    assert chat.render([{"role": "tool", "content": "42"}]) == (
        "<bos><start_of_turn>user\n42<end_of_turn>\n<start_of_turn>model\n"
    )


@pytest.mark.parametrize("name", ["gemma", "chatml"])
def test_builtin_renders_earlier_turns_identically(name):
    # Turn k's prompt plus the reply and the turn end is a text prefix of turn k+1's prompt, so
    # a resent conversation reuses the previous turn's slot (prefix reuse across turns).
    chat = builtin(name)
    end = {"gemma": "<end_of_turn>\n", "chatml": "<|im_end|>\n"}[name]
    for k in (2, 4):
        asked = chat.render(GEMMA_TURNS[:k])
        following = [
            *GEMMA_TURNS[:k],
            {"role": "assistant", "content": "Oui."},
            {"role": "user", "content": "Next"},
        ]
        assert chat.render(following).startswith(asked + "Oui." + end)


def test_gemma_builtin_system_prefix_is_the_open_first_turn():
    # The system turn alone renders as the opening of the first user turn: the text every
    # conversation with that system prompt starts with (the checkpoint hint's prefix).
    chat = builtin("gemma")
    prefix = chat.system_prefix(GEMMA_TURNS)
    assert prefix == "<bos><start_of_turn>user\nBe brief.\n\n"
    assert chat.render(GEMMA_TURNS).startswith(prefix)
    assert chat.render(GEMMA_TURNS[:1]) == "<bos><start_of_turn>model\n"  # as Google's: no user turn yet


def test_builtin_choice_by_architecture_then_vocabulary():
    from slotserve.engine_ext.chat_builtin import choose_builtin

    chatml_vocab = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a"]
    gemma_vocab = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
    assert choose_builtin("gemma3", ["a"]) == choose_builtin("gemma3", chatml_vocab)
    assert choose_builtin("gemma3", ["a"]).name == "gemma"  # by architecture, whatever the vocabulary
    assert choose_builtin("gemma2", ["a"]).reason == "architecture gemma2"
    assert choose_builtin("llama", gemma_vocab).name == "gemma"  # a Gemma vocabulary on another architecture
    assert choose_builtin("llama", gemma_vocab[:4]) is None  # both turn tokens are needed
    assert choose_builtin("qwen2", chatml_vocab).name == "chatml"
    assert choose_builtin("llama", ["<|im_start|>", "a"]) is None
    assert choose_builtin("llama", ["<s>", "</s>", "a"]) is None


def test_tiny_files_without_a_template_get_the_builtin(arch_model_factory, tiny_model_factory):
    # The GGUF's own template wins; without one, the tiny gemma3 fixture gets Gemma's turns (by
    # architecture) and the tiny llama ChatML (by its <|im_start|>/<|im_end|> tokens).
    gemma = chat_template_for(load_model_file(arch_model_factory("gemma3", chat_template=None)))
    assert gemma is not None and gemma.origin == "built-in gemma (architecture gemma3; the GGUF has none)"
    assert gemma.render([{"role": "user", "content": "x"}]).startswith(
        "<|im_start|><start_of_turn>user\nx"
    )  # bos id 1
    llama = load_model_file(tiny_model_factory(chat_template=None))
    chatml = chat_template_for(llama)
    assert chatml is not None and chatml.origin.startswith("built-in chatml (<|im_start|>/<|im_end|> in the")
    assert (
        chatml.render([{"role": "user", "content": "x"}])
        == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    )
    assert chat_template_for(llama, builtin=False) is None
    assert chat_template_for(load_model_file(arch_model_factory("gemma3"))).origin == "gguf"
