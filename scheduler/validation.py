"""Request validation at submit: pure functions, no scheduler state."""

from __future__ import annotations

import numpy as np

from .request import GenerationRequest, PromptTooLong
from .sampling import validate_params


def validate_request(req: GenerationRequest, n_vocab: int, ctx_len: int) -> np.ndarray:
    """The prompt as int32 [L], or ValueError / PromptTooLong with the fix in the message."""
    try:
        prompt = np.asarray(req.prompt_ids)
    except (TypeError, ValueError):  # ragged nesting
        prompt = np.empty((0, 0))
    if prompt.size == 0 and prompt.ndim == 1:
        raise ValueError("prompt_ids is empty; send at least one token")
    # NOTE: no dtype= above: it would truncate 6.5 to 6 and overflow on ids past int64.
    if prompt.ndim != 1 or prompt.dtype.kind not in "iu":
        raise ValueError("prompt_ids must be a flat list of integer token ids")
    if prompt.min() < 0 or prompt.max() >= n_vocab:
        raise ValueError(f"prompt_ids holds a token id outside the vocabulary 0..{n_vocab - 1}")
    if prompt.shape[0] + 1 > ctx_len:
        raise PromptTooLong(
            f"prompt has {prompt.shape[0]} tokens but a slot holds {ctx_len} "
            f"(prompt + at least one generated token); shorten it to {ctx_len - 1} tokens"
        )
    validate_params(req.params, n_vocab)
    if req.prefix_hint is not None and not 0 < req.prefix_hint <= prompt.shape[0]:
        raise ValueError(f"prefix_hint={req.prefix_hint} must be within the prompt (1..{prompt.shape[0]})")
    turns = req.turn_offsets
    if any(not 0 < t <= prompt.shape[0] for t in turns) or list(turns) != sorted(set(turns)):
        raise ValueError(
            f"turn_offsets={list(turns)} must be ascending, distinct and within the prompt (1..{prompt.shape[0]})"
        )
    if req.timeout_s is not None and not req.timeout_s > 0:
        raise ValueError(f"timeout_s={req.timeout_s} must be > 0")
    return np.ascontiguousarray(prompt, dtype=np.int32)
