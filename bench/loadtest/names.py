"""The synthetic workloads' names, in a module of their own so that the command line (cli.py)
can list them as --workload choices without importing workloads.py (a fast --help)."""

from __future__ import annotations

SYNTHETIC_WORKLOADS = (
    "multi-turn",
    "agent",
    "abort-resend",
    "shared-prefix",
    "oversubscribed",
    "edit-turn",
    "code-edit",
    "claude-code",
    "codex",
)
