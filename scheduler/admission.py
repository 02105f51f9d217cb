"""Request validation and the finish records of a request: pure functions, no scheduler state."""

from __future__ import annotations

import numpy as np

from .request import FinishEvent, FinishReason, GenerationRequest, PromptTooLong, ReuseSource
from .sampling import validate_params
from .sequence import Sequence
from .stats import RequestStats

_OUTCOME = {
    FinishReason.STOP: "ok",
    FinishReason.LENGTH: "ok",
    FinishReason.CANCELLED: "cancelled",
    FinishReason.TIMEOUT: "timeout",
    FinishReason.ERROR: "error",
}


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
    if req.timeout_s is not None and not req.timeout_s > 0:
        raise ValueError(f"timeout_s={req.timeout_s} must be > 0")
    return np.ascontiguousarray(prompt, dtype=np.int32)


def rejected_stats(req: GenerationRequest) -> RequestStats:
    return RequestStats(
        "rejected", None, len(req.prompt_ids), 0, ReuseSource.NONE, 0, 0, None, None, None, ()
    )


def finish_records(
    seq: Sequence, reason: FinishReason, text: str, now: float, error: str | None
) -> tuple[FinishEvent, RequestStats]:
    """The FinishEvent the gateway receives and the RequestStats the metrics receive."""
    timings = {"e2e_s": now - seq.admitted_at, "prefill_s": seq.prefill_s}
    queue_s = seq.assigned_at - seq.admitted_at if seq.assigned_at is not None else None
    ttft_s = seq.first_token_at - seq.admitted_at if seq.first_token_at is not None else None
    if queue_s is not None:
        timings["queue_s"] = queue_s
    if ttft_s is not None:
        timings["ttft_s"] = ttft_s
    ev = FinishEvent(reason, text, seq.prompt_len, seq.num_generated, seq.reuse, error, timings)
    reuse = seq.reuse
    stats = RequestStats(
        outcome=_OUTCOME[reason],
        finish_reason=reason,
        prompt_tokens=seq.prompt_len,
        reused_tokens=reuse.reused_tokens if reuse else 0,
        reuse_source=reuse.source if reuse else ReuseSource.NONE,
        prefilled_tokens=seq.num_prefilled,
        completion_tokens=seq.num_generated,
        queue_s=queue_s,
        ttft_s=ttft_s,
        e2e_s=now - seq.admitted_at,
        itl_s=tuple(seq.itl_s),
    )
    return ev, stats
