"""Verification of a draft: which of its tokens the model confirms, as a pure function.

A verification step feeds a slot its last sampled token followed by k draft tokens and gets
k + 1 logits rows back: row i is the model's next-token distribution after the draft's first i
tokens. `verify_draft` walks the rows in order and samples each with the request's own sampler,
exactly as plain decoding would sample that position: row i is used only while every earlier
draft token equalled the token sampled before it, i.e. while the rows' context is the text
plain decoding would have produced. The first sampled token that differs from its draft token
is emitted and ends the walk (its row was computed from the right context; the later rows were
not); if all k match, row k gives one more token. So a verification emits 1..k+1 tokens.

Exactness. Greedy: every emitted token is the argmax of the row plain decoding would compute
(same prefix, same KV rows, bit-identical logits), so the output is identical token for token.
Temperature > 0: a prompt-lookup draft is a point mass q = delta(x). Speculative sampling
accepts x with probability min(1, p(x) / q(x)) = p(x) and on rejection resamples from
norm(max(0, p - q)) = p conditioned on "not x". Drawing t ~ p and accepting iff t == x realises
that same joint law (P(x) = p(x); P(y) = p(y) for y != x), so the output distribution equals
plain sampling's. Since it draws exactly one random number per emitted token from the request's
own generator, a seeded run emits the same tokens as the same seeded run without drafting.
Everything else the sampler applies per position (penalties from the tokens so far, logit_bias,
the grammar's mask: each draft token is checked against the matcher by sampling under its mask,
logprobs) sees the same state as plain decoding, because it is advanced by the emitted tokens
only, one position at a time.

Stop rules checked here (`ends`: eos, stop token ids, max_tokens, the context) end the walk at
the token that triggers them, as plain decoding would stop there; stop strings are matched by
the caller on the emitted tokens in order, and a match there ends the request the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .request import TokenLogprob

Pick = tuple[int, TokenLogprob | None]


@dataclass(frozen=True, slots=True)
class Verdict:
    picks: tuple[Pick, ...]  # emitted tokens (1 .. k + 1), in order, with their logprobs
    accepted: int  # draft tokens confirmed (each emitted token equal to its draft token)
    ended: bool  # `ends` fired on the last pick

    @property
    def rows_kept(self) -> int:
        """Rows of the verified item whose KV stays valid: the last token's row and the rows of
        the draft tokens that were emitted and will not be fed again (every emitted token but
        the last, which becomes the pending token or ends the request, as in plain decoding)."""
        return len(self.picks)


def verify_draft(
    rows: np.ndarray,
    draft: np.ndarray,
    pick: Callable[[np.ndarray], Pick],
    ends: Callable[[int, int], bool],
) -> Verdict:
    """Verify `draft` (int32 [k]) against `rows` (float32 [k + 1, n_vocab]).

    pick(row): sample one token from a logits row with the request's sampler (which advances
    its random generator, penalties and grammar as for any sampled token) and return it with
    its logprob. ends(token, i): True if the i-th emitted token (0-based) ends the request by a
    rule the caller wants checked here (eos, stop ids, max_tokens, context)."""
    k = int(draft.shape[0])
    if rows.shape[0] != k + 1:
        raise ValueError(
            f"verify_draft: {rows.shape[0]} logits rows for a draft of {k} tokens (want {k + 1})"
        )
    picks: list[Pick] = []
    accepted = 0
    for i in range(k + 1):
        tok, lp = pick(rows[i])
        picks.append((tok, lp))
        matched = i < k and tok == int(draft[i])
        accepted += matched
        if ends(tok, i):
            return Verdict(tuple(picks), accepted, True)
        if not matched:
            break
    return Verdict(tuple(picks), accepted, False)
