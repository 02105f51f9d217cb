"""Chat templates: the model's `tokenizer.chat_template` (jinja2) rendered the way transformers
renders it, so prompts match what the model was trained on.

Environment (as transformers' apply_chat_template): ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loop controls; globals `raise_exception(msg)` and
`strftime_now(fmt)`; a `tojson` filter that keeps non-ASCII characters; render variables
`messages`, `tools`, `add_generation_prompt`, `bos_token`, `eos_token`.

A GGUF without a template gets a built-in one when its architecture or vocabulary says which
(chat_builtin.py: Gemma's turns, ChatML); `ChatTemplate.origin` records where a template came from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .chat_builtin import choose_builtin
from .gguf_file import ModelFile


class ChatTemplateError(ValueError):
    """The template rejected the conversation (raise_exception) or could not be rendered."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> jinja2.Environment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template. Thread-safe: rendering keeps no state."""

    def __init__(self, template: str, bos_token: str, eos_token: str, *, origin: str = "custom") -> None:
        try:
            self._template = _environment().from_string(template)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"the chat template does not compile: {exc}") from exc
        self.source = template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.origin = origin  # where the source came from, for the start-up line

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """The prompt text for `messages` (dicts with at least "role" and "content"), ending with
        the assistant header when add_generation_prompt. ValueError (ChatTemplateError) when the
        template rejects the conversation or fails to render it."""
        try:
            return self._template.render(
                messages=list(messages),
                tools=list(tools) if tools is not None else None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the chat template failed on these messages: {exc}") from exc
        except (TypeError, KeyError, AttributeError) as exc:  # e.g. a message without "content"
            raise ChatTemplateError(f"the chat template failed on these messages: {exc!r}") from exc

    def system_prefix(
        self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> str | None:
        """The rendered text of the leading system turn(s) of `messages` (all of it if there is
        nothing else), or None when there is none or the template does not render them as a text prefix of the whole conversation.

        The caller (the gateway's checkpoint hint) must still check that the prefix's tokens are
        a token-prefix of the prompt's tokens: a text prefix need not tokenize as a prefix.
        """
        n_system = 0
        while n_system < len(messages) and messages[n_system].get("role") == "system":
            n_system += 1
        if n_system == 0:
            return None
        try:
            prefix = self.render(messages[:n_system], add_generation_prompt=False, tools=tools)
            full = self.render(messages, add_generation_prompt=False, tools=tools)
        except ChatTemplateError:
            return None
        return prefix if prefix and full.startswith(prefix) else None


def chat_template_for(mf: ModelFile, *, builtin: bool = True) -> ChatTemplate | None:
    """The model's chat template from `tokenizer.chat_template`; if the file has none, the
    built-in one its architecture or vocabulary calls for (chat_builtin.py; unless not
    `builtin`), else None. bos/eos tokens are the texts of the tokenizer's bos/eos ids.
    `origin` says which: "gguf" or "built-in NAME (REASON)"."""
    pieces = cast("list[str]", mf.metadata.get("tokenizer.ggml.tokens") or [])
    source = mf.metadata.get("tokenizer.chat_template")
    origin = "gguf"
    if not isinstance(source, str) or not source:
        choice = choose_builtin(mf.config.arch, pieces) if builtin else None
        if choice is None:
            return None
        source, origin = choice.source, f"built-in {choice.name} ({choice.reason}; the GGUF has none)"

    def piece(key: str) -> str:
        i = mf.metadata.get(key)
        return pieces[i] if isinstance(i, int) and 0 <= i < len(pieces) else ""

    return ChatTemplate(
        source,
        bos_token=piece("tokenizer.ggml.bos_token_id"),
        eos_token=piece("tokenizer.ggml.eos_token_id"),
        origin=origin,
    )
