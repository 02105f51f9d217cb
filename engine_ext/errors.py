"""Errors the engine layer raises for model files it cannot serve.

`UnsupportedModelError` marks a well-formed file that uses something slotserve does not implement
(an architecture, a tensor type, a tokenizer model or pre-tokenizer rule). Its message is one line
naming what was found and what is supported; the CLI prints it without a traceback and exits 2.
Other `ValueError`s from the loader mean a broken or inconsistent file.
"""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """A model file uses an architecture, tensor type or tokenizer slotserve does not support."""
