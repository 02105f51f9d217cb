"""Helpers for the engine tests: pools on the tiny fixture models, feeding, a prefill then
decode steps (the rows the reference tests compare), and greedy decoding."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from slotserve.engine_ext import SlotPool
from slotserve.engine_ext.gguf_file import ModelFile, load_model_file

_MODELS: dict[Path, ModelFile] = {}


def model_file(path: Path) -> ModelFile:
    """The ModelFile at `path`, loaded once per session."""
    if path not in _MODELS:
        _MODELS[path] = load_model_file(path)
    return _MODELS[path]


def make_pool(path: Path, num_slots: int = 4, ctx_len: int = 160, **kwargs: object) -> SlotPool:
    return SlotPool(model_file(path), num_slots, ctx_len, **kwargs)


def random_tokens(n: int, n_vocab: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n_vocab, n).astype(np.int32)


def feed(pool: SlotPool, slot: int, tokens: Sequence[int], chunks: Iterable[int] | None = None) -> np.ndarray:
    """Append `tokens` to `slot` (in chunks of the given sizes, default one chunk); the logits
    after the last token."""
    tokens = np.asarray(tokens, dtype=np.int32)
    sizes = list(chunks) if chunks is not None else [len(tokens)]
    assert sum(sizes) == len(tokens)
    out, at = None, 0
    for size in sizes:
        start = pool.slot_len(slot)
        out = pool.forward([(slot, tokens[at : at + size], start, True)])[0]
        at += size
    assert out is not None
    return out


def prefill_then_decode(pool: SlotPool, slot: int, tokens: np.ndarray, n_prefill: int) -> np.ndarray:
    """[1 + len(tokens) - n_prefill, n_vocab]: the logits after tokens[:n_prefill], prefilled into
    the empty `slot` in one forward, then after each further token, decoded one a step."""
    rows = [pool.forward([(slot, tokens[:n_prefill], 0, True)])[0]]
    for p in range(n_prefill, len(tokens)):
        rows.append(pool.forward([(slot, tokens[p : p + 1], p, True)])[0])
    return np.array(rows)


def greedy(pool: SlotPool, slot: int, logits: np.ndarray, n: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy-decode n tokens on `slot` starting from `logits` (those of its last token):
    (the tokens, the logits that chose each)."""
    tokens, seen = [], []
    for _ in range(n):
        seen.append(logits)
        nxt = int(np.argmax(logits))
        tokens.append(nxt)
        logits = pool.forward([(slot, np.array([nxt], np.int32), pool.slot_len(slot), True)])[0]
    return tokens, seen
