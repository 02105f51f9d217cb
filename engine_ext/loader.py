"""One call from a model path to everything needed to serve it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .chat import ChatTemplate, chat_template_for
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


def open_model(
    path: str | os.PathLike[str] | ModelFile,
    *,
    num_slots: int,
    ctx_len: int,
    threads: int | None = None,
    kv_dtype: str = "f16",
) -> ModelBundle:
    """Load and validate the GGUF at `path` (or take an already loaded ModelFile), build its tokenizer and chat template, and allocate
    a SlotPool of `num_slots` slots of `ctx_len` tokens each (all KV memory allocated here).
    ValueError with the cause for a bad file or bad pool parameters."""
    from . import SlotPool  # the compiled engine; imported only when a pool is wanted

    model_file = path if isinstance(path, ModelFile) else load_model_file(path)
    tokenizer = Tokenizer.from_model_file(model_file)
    if tokenizer.n_vocab != model_file.config.n_vocab:
        raise ValueError(
            f"{model_file.path}: tokenizer has {tokenizer.n_vocab} tokens, the model "
            f"{model_file.config.n_vocab} output rows"
        )
    pool = SlotPool(model_file, num_slots, ctx_len, threads=threads, kv_dtype=kv_dtype)
    return ModelBundle(
        model_file=model_file, tokenizer=tokenizer, chat=chat_template_for(model_file), pool=pool
    )
