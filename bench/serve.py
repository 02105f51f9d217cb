"""`slotserve bench serve`: what a user of the server gets, next to what the engine can do.

Design: one run, three parts, never overlapping:

1. served: `slotserve serve --parallel P` as a subprocess on a free loopback port. After /ready,
   the TTFT of a short chat prompt (median of TTFT_REPS requests, each a different question,
   so the template prefix may be reused but the question is not), then for each stream count
   S (default 1, 4, 8) S concurrent greedy streamed chat requests of --tokens tokens with
   `ignore_eos`, so every stream runs to `max_tokens` (checked: finish_reason "length" and
   usage.completion_tokens == --tokens). Aggregate decode tokens/s of a round is
   sum over streams of (completion_tokens - 1) / (last text chunk of any stream - first text
   chunk of any stream): the tokens after each stream's first, over the time after the first.
2. engine: right after each served round, while the server idles, the same model in this
   process: S slots decoding --tokens steps in one batch per step (bench/engine.py's
   `decode_rate`; no HTTP, no scheduler, no tokenizer). Served and engine rounds alternate
   --rounds times per stream count, so each ratio pairs figures taken seconds apart on a
   shared, noisy machine; the report gives the medians and the median of the per-round ratios.
   The server is stopped (SIGTERM) before part 3.
3. bandwidth: a triad a = b + s*c over float64 arrays far larger than any cache, in chunks so
   the two NumPy passes of each chunk meet in cache and memory sees 3 arrays (read b, read c,
   write a; the write-allocate read of a is not counted, as in STREAM). Best of BANDWIDTH_REPS
   (bandwidth.py), on as many threads as the engine used (each a contiguous share; NumPy releases the GIL).
   Decode only reads its weights, so a read pass (the engine's C read loop over one such
   array, `_engine.read_sum`) is measured beside it, with its own bound: the triad counts a
   third of its traffic as writes, and leaves out the write-allocate read, so its bound is
   the lower, conservative one.
   The one-slot decode bound is that bandwidth / the weight bytes one decode step reads
   (every tensor but the embedding table, which a step reads one row of, unless it is tied to
   the output).

The streaming client (--client): `raw` (default) is serve_client.py's `raw_stream`, which parses
JSON only for the events that decide the result; `httpx` is the load-test client
(bench/loadtest/client.py), which parses every chunk. The client runs on the same cores as the
server, so its CPU is taken from the engine's threads; each phase reports the client's CPU
seconds (time.process_time of this process, taken around the served rounds only) and the
server process's (utime + stime of /proc/PID/stat, serve_server.py).

NOTE: on a machine where one core cannot saturate memory, a one-thread triad gives a bound
that a multi-threaded engine beats; hence the triad's threads follow the engine's.

Modules: serve_server.py starts, polls and stops the server subprocess and reads its CPU time;
serve_client.py is the raw streaming client; bandwidth.py the triad and read passes and the
weight bytes a decode step reads (part 3).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .bandwidth import decode_weight_bytes, read_bandwidth, triad_bandwidth
from .engine_measure import decode_rate
from .machine import machine
from .serve_client import StreamResult, raw_stream
from .serve_server import free_port, server_cpu_seconds, start_server, stop_server, wait_ready

DEFAULT_STREAMS = (1, 4, 8)
DEFAULT_TOKENS = 256
DEFAULT_PARALLEL = 8
DEFAULT_ROUNDS = 3
TTFT_REPS = 3
TTFT_QUESTIONS = ("What is 2 + 2?", "Name a colour.", "Say hello.", "What day follows Monday?")
STREAM_PROMPT = "Write a long story about a lighthouse keeper and the sea."
CLIENTS = ("raw", "httpx")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        metavar="NAME|PATH",
        help="a known model's short name or a GGUF path (default: the default model, pulled if missing)",
    )
    parser.add_argument(
        "--tokens", type=int, default=DEFAULT_TOKENS, help=f"tokens per stream (default {DEFAULT_TOKENS})"
    )
    parser.add_argument(
        "--streams",
        type=int,
        action="append",
        help="concurrent streams to measure (repeatable; default 1, 4 and 8)",
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=DEFAULT_PARALLEL,
        help=f"the server's slots, --parallel (default {DEFAULT_PARALLEL})",
    )
    parser.add_argument(
        "--threads", type=int, help="engine threads, server and in-process (default: engine's)"
    )
    parser.add_argument("--ctx-size", type=int, help="the server's --ctx-size (default: the server's)")
    parser.add_argument(
        "--bandwidth-mib",
        type=int,
        default=256,
        help="MiB per triad array (default 256; three are allocated)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help=f"served + engine pairs per stream count, medians reported (default {DEFAULT_ROUNDS})",
    )
    parser.add_argument(
        "--client",
        choices=CLIENTS,
        default="raw",
        help="streaming client: raw (asyncio streams, parses only the chunks it checks; default) "
        "or httpx (the load-test client, parses every chunk)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


# --- part 1: the served figures ---


async def measure_served(
    url: str,
    tokens: int,
    streams: list[int],
    rounds: int,
    engine_decode: Callable[[int], float],
    client: str = "raw",
    server_cpu: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """TTFT of a short prompt, then for each stream count n, `rounds` times: a served round of
    n streams, then `engine_decode(n)` (blocking the loop: nothing else runs on it), so each
    served figure has an engine figure measured seconds apart. SystemExit if a stream fails or
    does not run to `tokens`. Each phase's client CPU (this process) and server CPU
    (`server_cpu()`) are summed over its served rounds only."""
    import httpx

    from .loadtest.client import SendParams, endpoint, request_body, send
    from .loadtest.workloads import RequestSpec

    async with httpx.AsyncClient(timeout=None, trust_env=False) as http:
        model_name = (await http.get(url + "/v1/models")).json()["data"][0]["id"]
        params = SendParams(model=model_name, temperature=0.0, ignore_eos=True, timeout_s=600.0)

        async def one(spec: RequestSpec, i: int) -> StreamResult:
            if client == "raw":
                return await raw_stream(url, endpoint(spec), request_body(spec, params), params.timeout_s)
            ex = await send(http, url, spec, i, params)
            t = ex.token_times
            return StreamResult(
                ex.t_send, t[0] if t else 0.0, t[-1] if t else 0.0, len(t),
                ex.completion_tokens, ex.finish_reason, ex.error,
            )  # fmt: skip

        cpu = {"client_cpu_s": 0.0, "server_cpu_s": 0.0, "wall_s": 0.0}

        async def round_of(specs: list[RequestSpec]) -> list[StreamResult]:
            c0, s0, w0 = time.process_time(), server_cpu() if server_cpu else 0.0, time.perf_counter()
            results = await asyncio.gather(*(one(s, i) for i, s in enumerate(specs)))
            cpu["wall_s"] += time.perf_counter() - w0
            cpu["client_cpu_s"] += time.process_time() - c0
            cpu["server_cpu_s"] += (server_cpu() if server_cpu else 0.0) - s0
            for res in results:
                if res.error is not None or not res.t_first:
                    raise SystemExit(f"slotserve bench serve: a request failed: {res.error or 'no text'}")
            return list(results)

        def take_cpu() -> dict[str, float]:
            taken = dict(cpu)
            for k in cpu:
                cpu[k] = 0.0
            return taken

        ttfts = []
        for i in range(TTFT_REPS):
            question = TTFT_QUESTIONS[i % len(TTFT_QUESTIONS)]
            spec = RequestSpec(f"ttft{i}", 0, 1, messages=({"role": "user", "content": question},))
            (res,) = await round_of([spec])
            ttfts.append(res.t_first - res.t_send)
        out: dict[str, Any] = {
            "model_name": model_name,
            "ttft_s": statistics.median(ttfts),
            "ttft_cpu": take_cpu(),
            "decode": {},
        }
        for n in streams:
            served, engine = [], []
            for r in range(rounds):
                rate, completion_tokens = await served_round(round_of, tokens, n, r)
                served.append(rate)
                engine.append(engine_decode(n))
            out["decode"][n] = {
                "served": served,
                "engine": engine,
                "completion_tokens": completion_tokens,
                "cpu": take_cpu(),
            }
    return out


async def served_round(round_of: Any, tokens: int, n: int, r: int) -> tuple[float, list[int]]:
    """Aggregate decode tokens/s of n concurrent streams of `tokens` tokens (module docstring)
    and each stream's completion tokens (the final usage chunk's); `round_of` sends the specs
    and checks for errors."""
    from .loadtest.workloads import RequestSpec

    specs = [
        RequestSpec(
            f"s{n}.{r}.{i}", 0, tokens, messages=({"role": "user", "content": f"{STREAM_PROMPT} ({r}.{i})"},)
        )
        for i in range(n)
    ]
    results = await round_of(specs)
    for res in results:
        if res.completion_tokens != tokens or res.finish_reason != "length":
            raise SystemExit(
                f"slotserve bench serve: a stream ended after {res.completion_tokens} of {tokens} "
                f"tokens (finish_reason {res.finish_reason!r})"
            )
    first = min(res.t_first for res in results)
    last = max(res.t_last for res in results)
    after_first = sum(res.completion_tokens - 1 for res in results)
    rate = after_first / (last - first) if last > first else float("nan")
    return rate, [res.completion_tokens for res in results]


# --- part 2: the engine (part 3, the machine: bandwidth.py) ---


def engine_decoder(
    model: Any, tokens: int, max_slots: int, threads: int | None
) -> tuple[Callable[[int], float], int]:
    """A function n -> aggregate decode tokens/s of n slots decoding `tokens` steps in one
    batch per step from empty slots (one pool, allocated here), and the engine's thread count."""
    import numpy as np
    from slotserve.engine_ext import SlotPool

    pool = SlotPool(model, max_slots, tokens + 16, threads=threads)
    rng = np.random.default_rng(0)

    def decode(n: int) -> float:
        slots = list(range(n))
        for s in slots:
            pool.truncate(s, 0)
        return decode_rate(pool, slots, tokens, rng, model.config.n_vocab)

    return decode, int(pool.n_threads)


def run(args: argparse.Namespace) -> int:
    from slotserve.engine_ext.loader import read_model
    from slotserve.engine_ext.model_cache import resolve_model

    streams = sorted(set(args.streams or DEFAULT_STREAMS))
    if args.tokens < 2 or min(streams) < 1 or args.bandwidth_mib < 1 or args.rounds < 1:
        raise SystemExit("--tokens must be >= 2, --streams, --rounds and --bandwidth-mib >= 1")
    if max(streams) > args.parallel:
        raise SystemExit(f"--streams {max(streams)} exceeds --parallel {args.parallel}")
    path = Path(resolve_model(args.model, progress=False))
    info: dict[str, Any] = {
        "command": "slotserve bench serve",
        "model": str(path),
        "tokens": args.tokens,
        "parallel": args.parallel,
        "rounds": args.rounds,
        "client": args.client,
        "machine": machine(),
    }

    model, _ = read_model(path)
    engine_decode, engine_threads = engine_decoder(model, args.tokens, max(streams), args.threads)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="slotserve-bench-serve-") as tmp:
        log = Path(tmp) / "serve.log"
        proc = start_server(path, args, port, log)
        try:
            wait_ready(proc, url, log)
            served = asyncio.run(
                measure_served(
                    url,
                    args.tokens,
                    streams,
                    args.rounds,
                    engine_decode,
                    args.client,
                    lambda: server_cpu_seconds(proc.pid),
                )
            )
        finally:
            stop_server(proc)
    del engine_decode  # frees the in-process pool before the bandwidth passes

    bandwidth = triad_bandwidth(args.bandwidth_mib, threads=engine_threads)
    read_bw = read_bandwidth(args.bandwidth_mib, threads=engine_threads)
    weight_bytes = decode_weight_bytes(model)
    bound = bandwidth / weight_bytes
    info["ttft_s"] = served["ttft_s"]
    info["ttft_cpu"] = {k: round(v, 3) for k, v in served["ttft_cpu"].items()}
    info["bandwidth_gb_s"] = bandwidth / 1e9
    info["bandwidth_threads"] = engine_threads
    info["read_bandwidth_gb_s"] = read_bw / 1e9
    info["one_slot_read_bound_tokens_per_s"] = read_bw / weight_bytes
    info["decode_weight_bytes"] = weight_bytes
    info["one_slot_bound_tokens_per_s"] = bound
    info["streams"] = {}
    for n in streams:
        d = served["decode"][n]
        ratios = [s / e for s, e in zip(d["served"], d["engine"])]
        info["streams"][str(n)] = {
            "served_tokens_per_s": statistics.median(d["served"]),
            "engine_tokens_per_s": statistics.median(d["engine"]),
            "served_over_engine": statistics.median(ratios),  # of each round's pair
            "served_over_engine_rounds": ratios,
            "completion_tokens": d["completion_tokens"],
            # CPU seconds over the served rounds only (wall_s: their wall time), client = this process
            "cpu": {k: round(v, 3) for k, v in d["cpu"].items()},
        }
    one = info["streams"].get("1")
    if one is not None:
        info["engine_one_slot_over_bound"] = one["engine_tokens_per_s"] / bound
        info["served_one_slot_over_bound"] = one["served_tokens_per_s"] / bound
        info["engine_one_slot_over_read_bound"] = (
            one["engine_tokens_per_s"] / info["one_slot_read_bound_tokens_per_s"]
        )
    info["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]

    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    m = info["machine"]
    print(f"model {path.name} | {m['cpu']}, {m['cpus']} CPUs | {args.tokens} tokens per stream")
    print(f"TTFT (short chat prompt, median of {TTFT_REPS}): {served['ttft_s'] * 1000:.1f} ms")
    print(f"medians of {args.rounds} rounds, each a served round then an engine round:")
    print(f"{'streams':>8} {'served tok/s':>13} {'engine tok/s':>13} {'served/engine':>14}  per round")
    for n in streams:
        r = info["streams"][str(n)]
        print(
            f"{n:>8} {r['served_tokens_per_s']:>13.1f} {r['engine_tokens_per_s']:>13.1f} "
            f"{r['served_over_engine']:>14.3f}  "
            + " ".join(f"{x:.2f}" for x in r["served_over_engine_rounds"])
        )
    print(f"CPU over the served rounds ({args.client} client, on the server's cores):")
    print(f"{'streams':>8} {'wall s':>8} {'client s':>9} {'server s':>9} {'client ms/token':>16}")
    for n in streams:
        c, total = (
            info["streams"][str(n)]["cpu"],
            sum(info["streams"][str(n)]["completion_tokens"]) * args.rounds,
        )
        print(
            f"{n:>8} {c['wall_s']:>8.2f} {c['client_cpu_s']:>9.2f} {c['server_cpu_s']:>9.2f} "
            f"{1000 * c['client_cpu_s'] / total:>16.3f}"
        )
    print(
        f"triad bandwidth {info['bandwidth_gb_s']:.2f} GB/s ({engine_threads} threads) | decode reads "
        f"{weight_bytes / 1e6:.1f} MB of weights | one-slot bound {bound:.1f} tok/s"
    )
    print(
        f"read bandwidth {info['read_bandwidth_gb_s']:.2f} GB/s | one-slot read bound "
        f"{info['one_slot_read_bound_tokens_per_s']:.1f} tok/s"
    )
    if one is not None:
        print(
            f"one-slot decode / triad bound: engine {info['engine_one_slot_over_bound']:.3f}, "
            f"served {info['served_one_slot_over_bound']:.3f} | engine / read bound "
            f"{info['engine_one_slot_over_read_bound']:.3f}"
        )
    return 0
