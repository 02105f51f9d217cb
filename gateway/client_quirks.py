"""Opt-in normalizations of what known agent clients send, so their prefixes stay reusable.

Design: some clients put per-request text at the very start of the prompt, which makes every
turn miss the cache from token one. `--normalize NAME` removes exactly such text before the
request is rendered (and before its diagnostics fingerprint is taken), and the answer says what
was applied (the `X-Slotserve-Normalized` header). Each normalization names the client version
it was measured with; none is on by default, since each changes what the model reads.

- `claude-code` (Claude Code 2.x, Anthropic Messages API): the first system block is
  `x-anthropic-billing-header: cc_version=...; cc_entrypoint=...; cch=<nonce>;`, different on
  every request. The block is dropped. Claude Code's mid-conversation system text (token
  counters, `<system-reminder>`s) arrives as text blocks of user turns, which render in place
  already; nothing is hoisted by this server, so nothing else is changed.
"""

from __future__ import annotations

import enum

import msgspec

from .anthropic_protocol import CountTokensRequest

BILLING_HEADER = "x-anthropic-billing-header:"
NORMALIZED_HEADER = "X-Slotserve-Normalized"  # the answer's header naming what was applied


class Normalization(str, enum.Enum):
    """What `--normalize` may name."""

    CLAUDE_CODE = "claude-code"  # drop Claude Code's per-request billing-nonce system block


def normalize_messages(
    req: CountTokensRequest, active: frozenset[Normalization]
) -> tuple[CountTokensRequest, list[str]]:
    """The Messages request with the active normalizations applied, and what was applied."""
    applied: list[str] = []
    if Normalization.CLAUDE_CODE in active and isinstance(req.system, list):
        kept = [
            b
            for b in req.system
            if not (b.type == "text" and b.text is not None and b.text.lstrip().startswith(BILLING_HEADER))
        ]
        if len(kept) != len(req.system):
            req = msgspec.structs.replace(req, system=kept or None)
            applied.append(f"{Normalization.CLAUDE_CODE.value}:billing-header")
    return req, applied
