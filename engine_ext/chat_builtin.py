"""Built-in chat templates for GGUF files that carry none (`tokenizer.chat_template` absent).

Design: a template is chosen from what the file does have, in this order:

1. `gemma`: a Gemma architecture (`gemma`, `gemma2`, `gemma3`), or `<start_of_turn>` and
   `<end_of_turn>` both in the vocabulary. Gemma's turn format, as Google's published Gemma 3
   template writes it: `<bos>`, then per message `<start_of_turn>ROLE\\nTEXT<end_of_turn>\\n`
   with ROLE `user` or `model` (for `assistant`), TEXT trimmed, system text (trimmed) folded
   into the first user turn followed by a blank line, and `<start_of_turn>model\\n` as the
   generation prompt. Gemma 3 270M's GGUF (the base model) ships without a template.
2. `chatml`: `<|im_start|>` and `<|im_end|>` both in the vocabulary:
   `<|im_start|>ROLE\\nTEXT<|im_end|>\\n` per message, `<|im_start|>assistant\\n` to generate.
3. none: chat requests are refused (400) as before; `/v1/completions` still works.

`--chat-template FILE` replaces any of them. (llama.cpp's server, given a GGUF without a
template, renders ChatML whatever the model; for Gemma that spells the turns as plain text the
model never saw, hence the Gemma choice by architecture here.)

Both templates render an earlier turn the same way whatever follows it, so a conversation resent
with one more turn is a token-prefix extension of the one before (prefix reuse across turns).
The Gemma one departs from Google's in three places, each so that a gateway rewrite or a
checkpoint hint keeps working: roles need not alternate (no error), a `tool` message (tool
output, from the gateway's tool-call shim) is a user turn, and a conversation of system messages
alone without the generation prompt renders as the opening of the first user turn
(`<bos><start_of_turn>user\\nSYSTEM\\n\\n`): the text every conversation with that system prompt
starts with, which is what the system-prefix checkpoint hint asks for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3"})

# NOTE: neither source may mention the tool list's variable: gateway/tool_calls.py takes a
# template that does as one that renders tool definitions itself (else the gateway's shim does).
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% set ns = namespace(system='', opened=false) %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% set ns.system = ns.system + (message['content'] | trim) %}"
    "{% else %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{% if ns.system and role == 'user' %}{{ ns.system + '\n\n' }}{% set ns.system = '' %}{% endif %}"
    "{{ (message['content'] | trim) + '<end_of_turn>\n' }}"
    "{% set ns.opened = true %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if not ns.opened and ns.system and not add_generation_prompt %}"
    "{{ '<start_of_turn>user\n' + ns.system + '\n\n' }}"
    "{% endif %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

BUILTIN_TEMPLATES: dict[str, str] = {"gemma": GEMMA_TEMPLATE, "chatml": CHATML_TEMPLATE}


@dataclass(frozen=True)
class BuiltinChoice:
    """The built-in template a file without one gets, and why (for the start-up log)."""

    name: str  # a key of BUILTIN_TEMPLATES
    reason: str  # e.g. "architecture gemma3", "<start_of_turn>/<end_of_turn> in the vocabulary"

    @property
    def source(self) -> str:
        return BUILTIN_TEMPLATES[self.name]


def choose_builtin(architecture: str, pieces: Sequence[str] | Mapping[str, int]) -> BuiltinChoice | None:
    """The built-in template for a model of `architecture` whose vocabulary is `pieces` (token
    texts; any container), or None when nothing fits (module doc: the order of the rules)."""
    vocab = pieces if isinstance(pieces, Mapping) else frozenset(pieces)
    if architecture in GEMMA_ARCHITECTURES:
        return BuiltinChoice("gemma", f"architecture {architecture}")
    if "<start_of_turn>" in vocab and "<end_of_turn>" in vocab:
        return BuiltinChoice("gemma", "<start_of_turn>/<end_of_turn> in the vocabulary")
    if "<|im_start|>" in vocab and "<|im_end|>" in vocab:
        return BuiltinChoice("chatml", "<|im_start|>/<|im_end|> in the vocabulary")
    return None
