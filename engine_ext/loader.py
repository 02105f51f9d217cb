"""One call from a model path to everything needed to serve it.

Every failure to open a model as asked is a ModelOpenError (engine_ext/errors.py) with a
one-line message, which the `slotserve` command prints without a traceback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .chat import ChatTemplate, chat_template_for
from .errors import ModelOpenError
from .gguf_file import ModelFile, load_model_file
from .tokenizer import Tokenizer


@dataclass(frozen=True, eq=False)
class ModelBundle:
    """A loaded model: the file (keeps the weights mapped), its tokenizer, its chat template
    (None if the file has none) and the slot pool computing on it."""

    model_file: ModelFile
    tokenizer: Tokenizer
    chat: ChatTemplate | None
    pool: Any  # slotserve.engine_ext.SlotPool (satisfies scheduler.interface.SlotPool)


def read_model(path: str | os.PathLike[str] | ModelFile) -> tuple[ModelFile, Tokenizer]:
    """Load and validate the GGUF at `path` (or take an already loaded ModelFile) and build its
    tokenizer. ModelOpenError (UnsupportedModelError for what slotserve lacks) for any problem:
    every ValueError of loading becomes one, with its one-line message."""
    try:
        model_file = path if isinstance(path, ModelFile) else load_model_file(path)
        tokenizer = Tokenizer.from_model_file(model_file)
    except ModelOpenError:
        raise
    except ValueError as exc:
        raise ModelOpenError(str(exc)) from exc
    if tokenizer.n_vocab != model_file.config.n_vocab:
        raise ModelOpenError(
            f"{model_file.path}: tokenizer has {tokenizer.n_vocab} tokens, the model "
            f"{model_file.config.n_vocab} output rows"
        )
    return model_file, tokenizer


def check_ctx_len(model_file: ModelFile, ctx_len: int, *, allow_over_train: bool = False) -> None:
    """ModelOpenError if `ctx_len` exceeds the context the model was trained for
    (`{arch}.context_length`), unless allow_over_train: past it the model's output degrades."""
    ctx_train = model_file.config.ctx_train
    if ctx_len > ctx_train and not allow_over_train:
        raise ModelOpenError(
            f"{model_file.path}: --ctx-size {ctx_len} exceeds the {ctx_train} tokens the model was "
            f"trained for; use --ctx-size {ctx_train} or less (or --allow-ctx-over-train to force it)"
        )


def open_model(
    path: str | os.PathLike[str] | ModelFile,
    *,
    num_slots: int,
    ctx_len: int,
    threads: int | None = None,
    kv_dtype: str = "f16",
    allow_ctx_over_train: bool = False,
    tokenizer: Tokenizer | None = None,
    swa_full: bool = False,
    max_batch_tokens: int | None = None,
    rollback: int = 0,
) -> ModelBundle:
    """`read_model`, its chat template, and a SlotPool of `num_slots` slots of `ctx_len` tokens
    each (all KV memory allocated here). ModelOpenError with the cause for a bad file, a ctx_len
    over the trained context (unless allow_ctx_over_train) or pool parameters it cannot take.
    `tokenizer`: the one `read_model` already built for this ModelFile (skips building it again).
    swa_full: keep every row of sliding-window layers (SlotPool; default: rings).
    max_batch_tokens: rows of one engine step (SlotPool's; None: its default, 512).
    rollback: earlier recurrent states kept per slot (SlotPool's), for a model with recurrent
    state only (every other model rewinds to any length): speculative drafts need them."""
    from . import SlotPool  # the compiled engine; imported only when a pool is wanted

    if tokenizer is None or not isinstance(path, ModelFile):
        model_file, tokenizer = read_model(path)
    else:
        model_file = path
    check_ctx_len(model_file, ctx_len, allow_over_train=allow_ctx_over_train)
    try:
        chat = chat_template_for(model_file)
        pool = SlotPool(
            model_file,
            num_slots,
            ctx_len,
            threads=threads,
            kv_dtype=kv_dtype,
            swa_full=swa_full,
            max_batch_tokens=512 if max_batch_tokens is None else max_batch_tokens,
            rollback=rollback if model_file.config.has_recurrent_state else 0,
        )
    except ModelOpenError:
        raise
    except ValueError as exc:
        raise ModelOpenError(str(exc)) from exc
    return ModelBundle(model_file=model_file, tokenizer=tokenizer, chat=chat, pool=pool)
