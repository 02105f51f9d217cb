"""Errors the engine layer raises for models it cannot open as asked.

`ModelOpenError` is every reason a model cannot be opened: the file is missing, unreadable or
inconsistent, it asks for a context longer than the model was trained for, or (its subclass
`UnsupportedModelError`) it is a well-formed file using something slotserve does not implement
(an architecture, a tensor type, a tokenizer model or pre-tokenizer rule). Each message is one
line naming the file, what was found and, for unsupported files, what is supported. The
`slotserve` command prints it as `slotserve: error: ...` without a traceback and exits 2.

Both are ValueErrors, so callers that catch ValueError keep working. `engine_ext.loader` and
`engine_ext.model_cache.resolve_model` turn every ValueError of opening into a ModelOpenError.
"""

from __future__ import annotations


class ModelOpenError(ValueError):
    """The model cannot be opened: missing, broken or unsupported file, or a bad size for it."""


class UnsupportedModelError(ModelOpenError):
    """A model file uses an architecture, tensor type or tokenizer slotserve does not support."""
