"""From exchanges to records and a summary; the end-of-run table and `compare`.

Which requests count where:
- TTFT (overall, by turn, and over returning turns: turn index >= 1): every request that
  streamed a first token (completed or aborted);
- ITL and end-to-end: completed requests;
- requests/s, goodput: completed requests over the run's duration (first send -> last end);
- output tokens/s: completion tokens of every request, aborted ones included;
- reuse ratio and oracle ratio: requests whose usage reported cached tokens, both over the same
  prompt-token denominator, so `oracle_reuse_ratio >= reuse_ratio` whenever the server's
  counts are honest and its tokenisation matches /tokenize.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from rich.console import Console, RenderableType
from rich.table import Table

from .client import Exchange
from .results import Percentiles, RequestRecord, Results, Summary


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _pcts(values: Sequence[float]) -> Percentiles:
    return Percentiles(
        n=len(values), p50=percentile(values, 50), p90=percentile(values, 90), p99=percentile(values, 99)
    )


def to_records(
    exchanges: Sequence[Exchange],
    t_start: float,
    oracle: Sequence[int | None],
    oracle_once: Sequence[int | None] | None = None,
) -> list[RequestRecord]:
    """One JSON record per exchange; `oracle` and `oracle_once` are aligned with `exchanges`
    (without `oracle_once`, the records carry `oracle` there too)."""
    records = []
    once = oracle if oracle_once is None else oracle_once
    for ex, orc, orc_once in zip(exchanges, oracle, once, strict=True):
        times = ex.token_times
        records.append(
            RequestRecord(
                index=ex.index,
                conversation_id=ex.spec.conversation_id,
                turn_index=ex.spec.turn_index,
                attempt=ex.spec.attempt,
                status=ex.outcome.value,
                http_status=ex.http_status,
                error=ex.error,
                start_s=ex.t_send - t_start,
                ttft_s=times[0] - ex.t_send if times else None,
                e2e_s=ex.t_end - ex.t_send,
                itl_s=[b - a for a, b in zip(times, times[1:])],
                max_tokens=ex.spec.max_tokens,
                prompt_tokens=ex.prompt_tokens,
                cached_tokens=ex.cached_tokens,
                completion_tokens=ex.completion_tokens if ex.completion_tokens is not None else len(times),
                oracle_cached_tokens=orc,
                oracle_once_cached_tokens=orc_once,
                finish_reason=ex.finish_reason,
            )
        )
    return records


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    slo_ttft_s: float,
    oracle_source: str,
    oracle_len_mismatches: int = 0,
) -> Summary:
    ok = [r for r in records if r.status == "ok"]
    streamed = [r for r in records if r.status in ("ok", "aborted") and r.ttft_s is not None]
    ttfts = [r.ttft_s for r in streamed if r.ttft_s is not None]
    itls = [x for r in ok for x in r.itl_s]
    e2es = [r.e2e_s for r in ok]
    by_turn: dict[int, list[float]] = defaultdict(list)
    for r in streamed:
        assert r.ttft_s is not None
        by_turn[r.turn_index].append(r.ttft_s)
    num_good = sum(r.ttft_s is not None and r.ttft_s <= slo_ttft_s for r in ok)
    counted = [r for r in records if r.prompt_tokens is not None and r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens or 0 for r in counted)
    cached = sum(r.cached_tokens or 0 for r in counted)
    oracle = sum(r.oracle_cached_tokens or 0 for r in counted)
    once = sum(
        (r.oracle_once_cached_tokens if r.oracle_once_cached_tokens is not None else r.oracle_cached_tokens)
        or 0
        for r in counted
    )
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    ttft, itl, e2e = _pcts(ttfts), _pcts(itls), _pcts(e2es)
    returning = [x for turn, xs in by_turn.items() if turn >= 1 for x in xs]
    return Summary(
        num_requests=len(records),
        num_ok=len(ok),
        num_aborted=sum(r.status == "aborted" for r in records),
        num_errors=sum(r.status in ("error", "timeout") for r in records),
        duration_s=duration_s,
        ttft_p50=ttft.p50,
        ttft_p90=ttft.p90,
        ttft_p99=ttft.p99,
        itl_p50=itl.p50,
        itl_p90=itl.p90,
        itl_p99=itl.p99,
        e2e_p50=e2e.p50,
        e2e_p90=e2e.p90,
        e2e_p99=e2e.p99,
        ttft_by_turn={t: _pcts(v) for t, v in sorted(by_turn.items())},
        ttft_returning=_pcts(returning) if returning else None,
        requests_per_s=per_s(len(ok)),
        output_tokens_per_s=per_s(sum(r.completion_tokens or 0 for r in records)),
        slo_ttft_s=slo_ttft_s,
        goodput_per_s=per_s(num_good),
        slo_attainment=num_good / len(ok) if ok else None,
        prompt_tokens=prompt,
        cached_tokens=cached,
        oracle_cached_tokens=oracle,
        completion_tokens=sum(r.completion_tokens or 0 for r in records),
        reuse_ratio=cached / prompt if prompt else None,
        oracle_reuse_ratio=oracle / prompt if prompt else None,
        oracle_once_cached_tokens=once,
        oracle_once_reuse_ratio=once / prompt if prompt else None,
        oracle_source=oracle_source,
        oracle_len_mismatches=oracle_len_mismatches,
        errors=dict(
            Counter((r.error or r.status)[:200] for r in records if r.status in ("error", "timeout"))
        ),
    )


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def summary_tables(results: Results) -> list[RenderableType]:
    """The end-of-run report: a headline, latency percentiles, then throughput and reuse."""
    s, c = results.summary, results.config
    headline = (
        f"{c.workload} against {c.url}: {s.num_ok}/{s.num_requests} ok, "
        f"{s.num_aborted} aborted, {s.num_errors} errors in {s.duration_s:.1f} s"
    )
    lat = Table()
    for col in ("latency (ms)", "n", "p50", "p90", "p99"):
        lat.add_column(col, justify="left" if col.startswith("lat") else "right")
    ok_n = s.num_ok
    lat.add_row(
        "TTFT",
        str(sum(p.n for p in s.ttft_by_turn.values())),
        _ms(s.ttft_p50),
        _ms(s.ttft_p90),
        _ms(s.ttft_p99),
    )
    for turn, p in s.ttft_by_turn.items():
        lat.add_row(f"  TTFT turn {turn}", str(p.n), _ms(p.p50), _ms(p.p90), _ms(p.p99))
    if s.ttft_returning is not None and len(s.ttft_by_turn) > 2:
        p = s.ttft_returning
        lat.add_row("  TTFT turns >= 1", str(p.n), _ms(p.p50), _ms(p.p90), _ms(p.p99))
    lat.add_row("ITL", "", _ms(s.itl_p50), _ms(s.itl_p90), _ms(s.itl_p99))
    lat.add_row("end-to-end", str(ok_n), _ms(s.e2e_p50), _ms(s.e2e_p90), _ms(s.e2e_p99))
    thr = Table()
    thr.add_column("metric")
    thr.add_column("value", justify="right")
    thr.add_row("requests/s", _num(s.requests_per_s))
    thr.add_row("output tokens/s", _num(s.output_tokens_per_s, "{:.1f}"))
    thr.add_row(f"goodput/s (TTFT <= {s.slo_ttft_s * 1000:.0f} ms)", _num(s.goodput_per_s))
    thr.add_row("SLO attainment", _num(s.slo_attainment, "{:.1%}"))
    thr.add_row(
        "reuse ratio (cached / prompt)",
        _num(s.reuse_ratio, "{:.1%}") + f"  ({s.cached_tokens}/{s.prompt_tokens})",
    )
    thr.add_row(
        f"oracle maximum ({s.oracle_source})",
        _num(s.oracle_reuse_ratio, "{:.1%}") + f"  ({s.oracle_cached_tokens}/{s.prompt_tokens})",
    )
    thr.add_row(
        "oracle, shared prefixes once",
        _num(s.oracle_once_reuse_ratio, "{:.1%}") + f"  ({s.oracle_once_cached_tokens}/{s.prompt_tokens})",
    )
    tables: list[RenderableType] = [headline, lat, thr]
    if s.errors:
        err = Table()
        err.add_column("count", justify="right")
        err.add_column("error")
        for msg, n in sorted(s.errors.items(), key=lambda kv: -kv[1]):
            err.add_row(str(n), msg)
        tables.append(err)
    return tables


# (label, summary attribute, unit): unit "ms" prints seconds as milliseconds.
COMPARED = (
    ("TTFT p50", "ttft_p50", "ms"),
    ("TTFT p90", "ttft_p90", "ms"),
    ("TTFT p99", "ttft_p99", "ms"),
    ("ITL p50", "itl_p50", "ms"),
    ("ITL p90", "itl_p90", "ms"),
    ("end-to-end p50", "e2e_p50", "ms"),
    ("end-to-end p90", "e2e_p90", "ms"),
    ("requests/s", "requests_per_s", ""),
    ("output tokens/s", "output_tokens_per_s", ""),
    ("goodput/s", "goodput_per_s", ""),
    ("reuse ratio", "reuse_ratio", "%"),
    ("oracle reuse ratio", "oracle_reuse_ratio", "%"),
    ("once-oracle reuse ratio", "oracle_once_reuse_ratio", "%"),
)


def compare_rows(a: Summary, b: Summary) -> list[tuple[str, str, float | None, float | None]]:
    """(label, unit, A, B) for every compared metric, TTFT p50 per shared turn included."""
    rows = [(label, unit, getattr(a, attr), getattr(b, attr)) for label, attr, unit in COMPARED]
    ra, rb = a.ttft_returning, b.ttft_returning
    if ra is not None and rb is not None:
        rows.append(("TTFT p50 turns >= 1", "ms", ra.p50, rb.p50))
        rows.append(("TTFT p99 turns >= 1", "ms", ra.p99, rb.p99))
    for turn in sorted(set(a.ttft_by_turn) & set(b.ttft_by_turn)):
        rows.append((f"TTFT p50 turn {turn}", "ms", a.ttft_by_turn[turn].p50, b.ttft_by_turn[turn].p50))
    return rows


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or a == 0 else b / a


def compare_header(a: Results, b: Results, name_a: str, name_b: str) -> str:
    return "\n".join(
        f"{k} = {name} ({r.config.workload}, {r.config.url}, {r.config.started_at})"
        for k, name, r in (("A", name_a, a), ("B", name_b, b))
    )


def compare_table(a: Results, b: Results) -> Table:
    table = Table()
    for col in ("metric", "A", "B", "B / A"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for label, unit, va, vb in compare_rows(a.summary, b.summary):
        fmt = _ms if unit == "ms" else (lambda x: _num(x, "{:.1%}")) if unit == "%" else _num
        label = f"{label} (ms)" if unit == "ms" else label
        table.add_row(label, fmt(va), fmt(vb), _num(ratio(va, vb), "{:.2f}x"))
    return table


def print_tables(tables: Sequence[RenderableType], console: Console | None = None) -> None:
    console = console or Console()
    for t in tables:
        console.print(t, highlight=False)
