"""`slotserve loadtest run|compare`: the load harness's command line (docs/loadtest.md)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from .names import SYNTHETIC_WORKLOADS

if TYPE_CHECKING:
    from .driver import DriveConfig

API_KEY_ENV = "SLOTSERVE_LOADTEST_API_KEY"  # the --api-key default
# the synthetic workloads, then workloads.PRESETS, then trace (workloads.py not imported: fast --help)
WORKLOADS = (*SYNTHETIC_WORKLOADS, "sessions", "trace")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="loadtest_command", required=True, metavar="{run,compare}")
    run_p = sub.add_parser("run", help="drive an endpoint with one workload, write JSON results")
    run_p.add_argument(
        "--url", required=True, help="base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8080"
    )
    run_p.add_argument("--workload", required=True, choices=WORKLOADS)
    run_p.add_argument("--trace", metavar="FILE", help="JSONL trace (with --workload trace)")
    loop = run_p.add_mutually_exclusive_group()
    loop.add_argument(
        "--concurrency",
        type=int,
        metavar="C",
        help="closed loop: C requests in flight (default 4; trace: its offsets)",
    )
    loop.add_argument("--rate", type=float, metavar="R", help="open loop: Poisson, R requests/s")
    run_p.add_argument(
        "--requests", type=int, metavar="N", help="stop after N requests (default: the whole workload)"
    )
    run_p.add_argument(
        "--duration",
        type=float,
        default=300.0,
        metavar="S",
        help="stop sending after S seconds (default 300)",
    )
    run_p.add_argument("--seed", type=int, default=0, metavar="K")
    run_p.add_argument("--json", required=True, metavar="PATH", help="write results here")
    run_p.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")
    run_p.add_argument("--model", help="model name to send (default: the first in /v1/models)")
    run_p.add_argument(
        "--api-key",
        metavar="KEY",
        default=os.environ.get(API_KEY_ENV) or None,
        help=f"send 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}, which keeps the "
        "key out of the process list)",
    )
    sizes = run_p.add_argument_group(
        "workload sizes (lengths in words, ~1 token each; sessions: 8 conversations, 3 turns, "
        "system 1400, turn 40, reply 32, C = 4)"
    )
    sizes.add_argument(
        "--conversations",
        type=int,
        metavar="N",
        help=("conversations (default: C; shared-prefix and oversubscribed: 4 x C; open loop: 8)"),
    )
    sizes.add_argument(
        "--turns",
        type=int,
        help="turns per conversation (default 4; shared-prefix 1; agent: tool rounds + 1)",
    )
    sizes.add_argument("--system-len", type=int, help="system prompt (default 400)")
    sizes.add_argument("--turn-len", type=int, help="user message (default 40)")
    sizes.add_argument("--reply-len", type=int, help="max_tokens per reply (32)")
    sizes.add_argument("--tool-result-len", type=int, help="agent tool result (80)")
    sizes.add_argument(
        "--abort-after",
        type=int,
        help="abort-resend: disconnect after this many tokens (default 4)",
    )
    run_p.add_argument(
        "--slo-ttft",
        type=float,
        default=1.0,
        metavar="S",
        help="TTFT objective for goodput, seconds (default 1.0)",
    )
    run_p.add_argument(
        "--timeout", type=float, default=120.0, metavar="S", help="per-request timeout, seconds (default 120)"
    )
    run_p.add_argument("--temperature", type=float, default=0.0, help="default 0 (greedy)")
    run_p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="send ignore_eos=true (non-standard) so replies run to max_tokens",
    )
    run_p.add_argument(
        "--logprobs",
        action="store_true",
        help="ask for each token's logprob, so tokens that print nothing (random-weight models) still time TTFT",
    )
    run_p.add_argument("--quiet", action="store_true", help="no progress bar")
    cmp_p = sub.add_parser("compare", help="print two results files side by side with ratios")
    cmp_p.add_argument("a", metavar="A.json")
    cmp_p.add_argument("b", metavar="B.json")


def run(args: argparse.Namespace) -> int:
    try:
        if args.loadtest_command == "compare":
            return _compare(args)
        return _run(args)
    except ValueError as exc:
        print(f"slotserve loadtest: {exc}", file=sys.stderr)
        return 2


def _compare(args: argparse.Namespace) -> int:
    from rich.console import Console

    from . import report, results

    a, b = results.load(args.a), results.load(args.b)
    console = Console(soft_wrap=True)
    console.print(report.compare_header(a, b, args.a, args.b), highlight=False)
    console.print(report.compare_table(a, b))
    return 0


def _run(args: argparse.Namespace) -> int:
    import asyncio

    from .client import SendParams
    from .driver import DriveConfig
    from .trace import load_trace
    from .workloads import PRESETS, WorkloadConfig, build_conversations, num_planned_requests

    if (args.workload == "trace") != (args.trace is not None):
        raise ValueError("--workload trace needs --trace FILE, and --trace needs --workload trace")
    if args.slo_ttft <= 0 or args.timeout <= 0:
        raise ValueError("--slo-ttft and --timeout must be > 0 seconds")
    url = args.url.rstrip("/").removesuffix("/v1")
    preset = PRESETS.get(args.workload)
    workload = preset.workload if preset else args.workload  # what builds the requests
    defaults = preset.sizes if preset else WorkloadConfig()
    concurrency = args.concurrency
    if concurrency is None and args.rate is None and args.workload != "trace":
        concurrency = preset.concurrency if preset else 4
    # Validated before anything connects; the model name is filled in once known.
    cfg = DriveConfig(
        base_url=url,
        params=SendParams(
            model=args.model or "",
            temperature=args.temperature,
            seed=args.seed,
            ignore_eos=args.ignore_eos,
            logprobs=args.logprobs,
            timeout_s=args.timeout,
            api_key=args.api_key,
        ),
        concurrency=concurrency,
        rate=args.rate,
        use_offsets=concurrency is None and args.rate is None,
        max_requests=args.requests,
        duration_s=args.duration,
        seed=args.seed,
    )
    sizes: dict[str, int] = {}
    conversations: list[Any]  # TraceConversation or Conversation: the driver takes either
    if args.workload == "trace":
        conversations = load_trace(args.trace)
        planned = sum(len(c.specs) for c in conversations)
    else:
        base = concurrency if concurrency is not None else 8
        is_many = workload in ("shared-prefix", "oversubscribed")
        num_conversations = preset.sizes.num_conversations if preset else 4 * base if is_many else base
        wl = WorkloadConfig(
            seed=args.seed,
            num_conversations=_given(args.conversations, num_conversations),
            num_turns=_given(args.turns, 1 if workload == "shared-prefix" else defaults.num_turns),
            system_len=_given(args.system_len, defaults.system_len),
            turn_len=_given(args.turn_len, defaults.turn_len),
            reply_len=_given(args.reply_len, defaults.reply_len),
            tool_result_len=_given(args.tool_result_len, defaults.tool_result_len),
            abort_after=_given(args.abort_after, defaults.abort_after),
        )
        conversations = build_conversations(workload, wl)
        planned = num_planned_requests(workload, wl)
        sizes = {k: getattr(wl, k) for k in wl.__dataclass_fields__ if k != "seed"}
    total = min(planned, args.requests) if args.requests else planned
    return asyncio.run(_run_async(args, cfg, conversations, sizes, total))


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


async def _run_async(
    args: argparse.Namespace, cfg: DriveConfig, conversations: list, sizes: dict[str, int], total: int
) -> int:
    import dataclasses

    import httpx
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import report, results
    from .client import Exchange
    from .driver import discover_model, drive, make_client
    from .oracle import compute_oracle

    err = Console(stderr=True, soft_wrap=True)
    url = cfg.base_url
    try:
        model = args.model or await discover_model(url, cfg.params) or "default"
    except httpx.HTTPError as exc:
        err.print(
            f"slotserve loadtest: cannot reach {url} ({type(exc).__name__}: {exc}); "
            "start the server or fix --url"
        )
        return 2
    params = dataclasses.replace(cfg.params, model=model)
    cfg = dataclasses.replace(cfg, params=params)
    mode = "offsets" if cfg.use_offsets else "open" if cfg.rate is not None else "closed"
    err.print(
        f"loadtest: {args.workload}, {len(conversations)} conversations, up to {total} "
        f"requests, {mode} loop, model {model!r}, against {url}"
    )
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        disable=args.quiet,
    )
    counts = {"ok": 0, "aborted": 0, "error": 0, "timeout": 0}

    with progress:
        task = progress.add_task("requests", total=total)

        def on_done(ex: Exchange) -> None:
            counts[ex.outcome.value] += 1
            ttft = f"{(ex.token_times[0] - ex.t_send) * 1000:.0f} ms" if ex.token_times else "-"
            progress.update(
                task,
                advance=1,
                description=(
                    f"ok {counts['ok']} aborted {counts['aborted']} "
                    f"failed {counts['error'] + counts['timeout']}  last TTFT {ttft}"
                ),
            )

        outcome = await drive(conversations, cfg, on_done)
    async with make_client(params) as client:
        oracle = await compute_oracle(outcome.exchanges, client, url, model)
    if oracle.note:
        err.print(f"oracle: {oracle.note}; estimating from usage counts (docs/loadtest.md)")
    if oracle.num_len_mismatches:
        err.print(
            f"oracle: {oracle.num_len_mismatches} prompts where /tokenize and usage "
            "disagree on the length; the oracle may be off for them"
        )
    records = report.to_records(outcome.exchanges, outcome.t_start, oracle.values, oracle.once)
    run_cfg = results.RunConfig(
        url=url,
        model=model,
        workload=args.workload,
        seed=args.seed,
        mode=mode,
        concurrency=cfg.concurrency,
        rate=cfg.rate,
        max_requests=cfg.max_requests,
        duration_s=cfg.duration_s,
        timeout_s=args.timeout,
        temperature=args.temperature,
        slo_ttft_s=args.slo_ttft,
        sizes=sizes,
        trace=args.trace,
        started_at=outcome.started_at,
    )
    res = results.Results(
        config=run_cfg,
        requests=records,
        summary=report.summarize(
            records, outcome.duration_s, args.slo_ttft, oracle.source, oracle.num_len_mismatches
        ),
    )
    results.save(res, args.json)
    report.print_tables(report.summary_tables(res), Console(soft_wrap=True))
    err.print(f"results: {args.json}")
    if args.plots:
        from .plots import write_plots

        for path in write_plots(res, args.plots):
            err.print(f"plot: {path}")
    return 0 if res.summary.num_ok or res.summary.num_aborted else 1
