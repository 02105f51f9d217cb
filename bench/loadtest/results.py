"""The JSON results file: run config, one record per request, and the summary.

Schema (`schema` = "slotserve.loadtest/1"); times in seconds, token counts as the server's
usage reports them (null when it sent none):

    {"schema": ..., "config": RunConfig, "requests": [RequestRecord, ...], "summary": Summary}

`load` validates types and raises ValueError naming the offending field; `save` then `load`
returns an equal `Results`.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

SCHEMA = "slotserve.loadtest/1"


class RunConfig(msgspec.Struct, kw_only=True):
    url: str
    model: str
    workload: str
    seed: int
    mode: str  # "closed" | "open" | "offsets"
    concurrency: int | None
    rate: float | None
    max_requests: int | None
    duration_s: float
    timeout_s: float
    temperature: float
    slo_ttft_s: float
    sizes: dict[str, int]  # WorkloadConfig fields (synthetic workloads)
    trace: str | None
    started_at: str  # ISO 8601, UTC


class RequestRecord(msgspec.Struct, kw_only=True):
    index: int  # dispatch order
    conversation_id: str
    turn_index: int  # 0-based turn within the conversation
    attempt: int  # 1 = the resend after an abort
    status: str  # "ok" | "aborted" | "error" | "timeout"
    http_status: int | None
    error: str | None
    start_s: float  # send time, seconds after the run started
    ttft_s: float | None  # send -> first text chunk
    e2e_s: float  # send -> end of stream (or abort, error, timeout)
    itl_s: list[float]  # gaps between text chunks
    max_tokens: int
    prompt_tokens: int | None  # usage.prompt_tokens
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens
    completion_tokens: int | None  # usage.completion_tokens (else streamed chunks)
    oracle_cached_tokens: int | None  # what a perfect cache would reuse (docs/loadtest.md)
    oracle_once_cached_tokens: int | None = None  # the same, each shared prefix computed once
    finish_reason: str | None


class Percentiles(msgspec.Struct, kw_only=True):
    n: int
    p50: float | None
    p90: float | None
    p99: float | None


class Summary(msgspec.Struct, kw_only=True):
    num_requests: int
    num_ok: int
    num_aborted: int  # planned aborts (abort-resend)
    num_errors: int  # errors and timeouts
    duration_s: float
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    itl_p50: float | None
    itl_p90: float | None
    itl_p99: float | None
    e2e_p50: float | None
    e2e_p90: float | None
    e2e_p99: float | None
    ttft_by_turn: dict[int, Percentiles]
    ttft_returning: Percentiles | None = None  # turn index >= 1 (None: no such request streamed)
    requests_per_s: float  # completed (ok) requests / duration
    output_tokens_per_s: float  # completion tokens of every request / duration
    slo_ttft_s: float
    goodput_per_s: float  # ok requests with TTFT <= slo_ttft_s / duration
    slo_attainment: float | None  # share of ok requests with TTFT <= slo_ttft_s
    prompt_tokens: int  # sums over requests that reported usage with cached tokens
    cached_tokens: int
    oracle_cached_tokens: int
    completion_tokens: int  # over every request
    reuse_ratio: float | None  # cached_tokens / prompt_tokens
    oracle_reuse_ratio: float | None  # oracle_cached_tokens / prompt_tokens
    oracle_once_cached_tokens: int = 0  # the once oracle's sum (each shared prefix computed once)
    oracle_once_reuse_ratio: float | None = None  # oracle_once_cached_tokens / prompt_tokens
    oracle_source: str  # "tokenize" (exact token ids) | "usage" (message-level estimate)
    oracle_len_mismatches: int  # prompts where /tokenize and usage.prompt_tokens disagree
    errors: dict[str, int]  # error message -> count


class Results(msgspec.Struct, kw_only=True):
    schema: str = SCHEMA
    config: RunConfig
    requests: list[RequestRecord]
    summary: Summary


def save(results: Results, path: str | Path) -> None:
    Path(path).write_bytes(msgspec.json.format(msgspec.json.encode(results), indent=1))


def load(path: str | Path) -> Results:
    """Read a results file written by `save` (any schema version is refused but this one)."""
    raw = Path(path).read_bytes()
    try:
        results = msgspec.json.decode(raw, type=Results)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise ValueError(
            f"{path}: not a loadtest results file ({exc}); write one with "
            "`slotserve loadtest run ... --json PATH`"
        ) from None
    if results.schema != SCHEMA:
        raise ValueError(f"{path}: schema {results.schema!r}, this harness reads {SCHEMA!r}")
    return results
