"""Token sampling from one logits row, vectorised over the vocabulary.

Design: one `Sampler` per request owns its random generator (seeded from `params.seed`, so the
same seed and prompt give the same tokens whatever else shares the batch) and the counts of the
tokens it generated (for presence/frequency penalties). Every filter is a numpy operation over
the row or over a candidate subset; nothing loops over the vocabulary in Python.

Order of operations: penalties -> logit_bias -> grammar mask -> (logprobs) -> greedy
(temperature 0) or temperature -> top-k -> softmax -> min-p -> top-p -> draw.

A request without logit_bias, grammar or logprobs pays nothing for them: each is one `if` per
token. A plain greedy request (temperature 0 and none of those, nor penalties) takes the argmax
of the row as the engine wrote it: no float64 working copy (the same id: widening float32 to
float64 is exact, and argmax keeps the first of equal values either way). With a grammar (`params.grammar`), the Sampler owns the sequence's TokenConstraint: the
disallowed ids are set to -inf before anything else picks, and the sampled token is fed back.
"""

from __future__ import annotations

import math

import numpy as np

from .request import MAX_TOP_LOGPROBS, SamplingParams, TokenConstraint, TokenLogprob

# Top-p first tries the best _TOP_P_PRESELECT candidates (argpartition, O(V)) and sorts the
# whole row only if they do not hold top_p of the mass.
_TOP_P_PRESELECT = 1024


def validate_params(params: SamplingParams, n_vocab: int) -> None:
    """Raise ValueError (with the fix) for parameters the sampler cannot honour."""
    if not params.temperature >= 0:
        raise ValueError(f"temperature={params.temperature} must be >= 0 (0 = greedy)")
    if params.top_k < 0:
        raise ValueError(f"top_k={params.top_k} must be >= 0 (0 = off)")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p={params.top_p} must be in (0, 1]")
    if not 0 <= params.min_p <= 1:
        raise ValueError(f"min_p={params.min_p} must be in [0, 1]")
    for name in ("presence_penalty", "frequency_penalty"):
        if not math.isfinite(getattr(params, name)):
            raise ValueError(f"{name}={getattr(params, name)} must be a finite number (0 = off)")
    if params.max_tokens < 1:
        raise ValueError(f"max_tokens={params.max_tokens} must be >= 1")
    for tid in params.stop_token_ids:
        if not 0 <= tid < n_vocab:
            raise ValueError(f"stop token id {tid} outside the vocabulary 0..{n_vocab - 1}")
    if any(s == "" for s in params.stop):
        raise ValueError("stop strings must be non-empty")
    for tid, bias in params.logit_bias:
        if not 0 <= tid < n_vocab:
            raise ValueError(f"logit_bias token id {tid} outside the vocabulary 0..{n_vocab - 1}")
        if not math.isfinite(bias):
            raise ValueError(f"logit_bias for token {tid} must be a finite number")
    if params.logprobs is not None and not 0 <= params.logprobs <= MAX_TOP_LOGPROBS:
        raise ValueError(f"logprobs={params.logprobs} must be in 0..{MAX_TOP_LOGPROBS}")
    if params.grammar is not None and params.ignore_eos:
        raise ValueError("ignore_eos cannot be combined with a grammar: the grammar ends with eos")


class Sampler:
    """Samples one token per call; remembers what it sampled for the penalties and advances the
    grammar. `last_logprob` holds the logprobs of the last sampled token when params.logprobs is
    set (else None)."""

    def __init__(self, params: SamplingParams, n_vocab: int) -> None:
        self.params = params
        self._rng = np.random.default_rng(params.seed)
        has_penalty = params.presence_penalty != 0 or params.frequency_penalty != 0
        # int32 [n_vocab] occurrences of each id among the generated tokens; None without penalties
        self._counts = np.zeros(n_vocab, dtype=np.int32) if has_penalty else None
        if params.logit_bias:
            ids = np.array([t for t, _ in params.logit_bias], dtype=np.int64)  # [B]
            bias = np.array([b for _, b in params.logit_bias], dtype=np.float64)  # [B]
            # NOTE: OpenAI's -100 means "ban": a finite bias could still be outbid by a logit
            self._bias: tuple[np.ndarray, np.ndarray] | None = (ids, np.where(bias <= -100, -np.inf, bias))
        else:
            self._bias = None
        self.constraint: TokenConstraint | None = params.grammar.start() if params.grammar else None
        self.last_logprob: TokenLogprob | None = None
        # greedy with nothing to adjust or report: `sample` is one argmax over the row
        self.is_plain_greedy = (
            params.temperature == 0
            and self._counts is None
            and self._bias is None
            and self.constraint is None
            and params.logprobs is None
        )
        # the scheduler may call `sample` on the engine worker thread (step.py): everything but
        # a grammar, whose TokenConstraint is driven from the event loop's thread
        self.can_sample_off_loop = self.constraint is None

    def sample(self, logits: np.ndarray) -> int:
        """Pick a token from float32 [n_vocab] `logits` and record it."""
        if self.is_plain_greedy:
            return int(logits.argmax())
        p = self.params
        x = np.array(logits, dtype=np.float64)  # [V] working copy
        if self._counts is not None:
            x -= p.frequency_penalty * self._counts + p.presence_penalty * (self._counts > 0)
        if self._bias is not None:
            np.add.at(x, self._bias[0], self._bias[1])
        if self.constraint is not None:
            x[~self.constraint.allowed()] = -np.inf
        if p.temperature == 0:
            tok = int(np.argmax(x))
        else:
            # NOTE: shift before scaling: x / 1e-320 overflows to inf, and inf - inf is NaN.
            # Shifted, the best logit scales to 0 and the others at worst to -inf (weight 0).
            with np.errstate(over="ignore"):
                scaled = (x - x.max()) / p.temperature
            tok = self._draw(scaled)
        if self._counts is not None:
            self._counts[tok] += 1
        if p.logprobs is not None:
            self.last_logprob = token_logprob(x, tok, p.logprobs)
        if self.constraint is not None:
            self.constraint.accept(tok)
        return tok

    def _draw(self, x: np.ndarray) -> int:
        p = self.params
        vocab = x.shape[0]
        cand = None  # int64 [k] candidate ids, or None for the whole row
        if 0 < p.top_k < vocab:
            cand = np.argpartition(x, vocab - p.top_k)[vocab - p.top_k :]
            x = x[cand]
        probs = np.exp(x - x.max())
        probs /= probs.sum()
        if p.min_p > 0:
            probs = np.where(probs >= p.min_p * probs.max(), probs, 0.0)
        if p.top_p < 1:
            keep = _top_p_ids(probs, p.top_p)
            mask = np.zeros_like(probs)
            mask[keep] = 1.0
            probs = probs * mask
        cdf = np.cumsum(probs)
        i = int(np.searchsorted(cdf, self._rng.random() * cdf[-1], side="right"))
        i = min(i, probs.shape[0] - 1)
        while probs[i] == 0:  # float edge: never return a filtered-out id
            i -= 1
        return int(cand[i]) if cand is not None else i


def token_logprob(x: np.ndarray, tok: int, k: int) -> TokenLogprob:
    """The logprob of `tok` and the `k` best ids under log_softmax(x) (float64 [V], -inf allowed)."""
    m = x.max()
    lse = m + math.log(float(np.exp(x - m).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        k = min(k, x.shape[0])
        best = np.argpartition(x, x.shape[0] - k)[x.shape[0] - k :]
        best = best[np.argsort(-x[best], kind="stable")]
        top = tuple((int(i), float(x[i] - lse)) for i in best)
    return TokenLogprob(tok, float(x[tok] - lse), top)


def _top_p_ids(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of the smallest highest-probability set whose mass reaches top_p."""
    total = probs.sum()
    n = probs.shape[0]
    if n > _TOP_P_PRESELECT:
        pre = np.argpartition(probs, n - _TOP_P_PRESELECT)[n - _TOP_P_PRESELECT :]
        if probs[pre].sum() >= top_p * total:
            order = pre[np.argsort(-probs[pre], kind="stable")]
        else:
            order = np.argsort(-probs, kind="stable")
    else:
        order = np.argsort(-probs, kind="stable")
    cum = np.cumsum(probs[order])
    m = int(np.searchsorted(cum, top_p * total, side="left")) + 1
    return order[: min(m, n)]
