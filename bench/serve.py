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
   write a; the write-allocate read of a is not counted, as in STREAM). Best of BANDWIDTH_REPS,
   on as many threads as the engine used (each a contiguous share; NumPy releases the GIL).
   Decode only reads its weights, so a read pass (chunked dot products of one such array with
   a cached vector of ones) is measured beside it, with its own bound: the triad counts a
   third of its traffic as writes, and leaves out the write-allocate read, so its bound is
   the lower, conservative one.
   The one-slot decode bound is that bandwidth / the weight bytes one decode step reads
   (every tensor but the embedding table, which a step reads one row of, unless it is tied to
   the output).

NOTE: on a machine where one core cannot saturate memory, a one-thread triad gives a bound
that a multi-threaded engine beats; hence the triad's threads follow the engine's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .engine import decode_rate, machine

DEFAULT_STREAMS = (1, 4, 8)
DEFAULT_TOKENS = 256
DEFAULT_PARALLEL = 8
DEFAULT_ROUNDS = 3
TTFT_REPS = 3
BANDWIDTH_REPS = 5
BANDWIDTH_CHUNK = 1 << 15  # float64 elements per triad chunk (256 KiB: three fit in L2)
READY_TIMEOUT_S = 180.0
TTFT_QUESTIONS = ("What is 2 + 2?", "Name a colour.", "Say hello.", "What day follows Monday?")
STREAM_PROMPT = "Write a long story about a lighthouse keeper and the sea."


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
    parser.add_argument("--json", action="store_true", help="print one JSON object")


# --- part 1: the served figures ---


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(model: Path, args: argparse.Namespace, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "slotserve",
        "serve",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--parallel",
        str(args.parallel),
        "--log-level",
        "warning",
    ]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    if args.ctx_size is not None:
        cmd += ["--ctx-size", str(args.ctx_size)]
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Poll GET /ready; SystemExit with the log's tail if the server exits or times out."""
    import httpx

    deadline = time.monotonic() + READY_TIMEOUT_S
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=1.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    state = f"exited with {proc.returncode}" if proc.poll() is not None else "not ready in time"
    raise SystemExit(f"slotserve bench serve: the server {state}:\n{log.read_text(errors='replace')[-2000:]}")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def measure_served(
    url: str, tokens: int, streams: list[int], rounds: int, engine_decode: Callable[[int], float]
) -> dict[str, Any]:
    """TTFT of a short prompt, then for each stream count n, `rounds` times: a served round of
    n streams, then `engine_decode(n)` (blocking the loop: nothing else runs on it), so each
    served figure has an engine figure measured seconds apart. SystemExit if a stream fails or
    does not run to `tokens`."""
    import httpx

    from .loadtest.client import SendParams, send
    from .loadtest.workloads import RequestSpec

    async with httpx.AsyncClient(timeout=None, trust_env=False) as client:
        model_name = (await client.get(url + "/v1/models")).json()["data"][0]["id"]
        params = SendParams(model=model_name, temperature=0.0, ignore_eos=True, timeout_s=600.0)

        async def round_of(specs: list[RequestSpec]) -> list[Any]:
            exchanges = await asyncio.gather(*(send(client, url, s, i, params) for i, s in enumerate(specs)))
            for ex in exchanges:
                if ex.error is not None or not ex.token_times:
                    raise SystemExit(f"slotserve bench serve: a request failed: {ex.error}")
            return list(exchanges)

        ttfts = []
        for i in range(TTFT_REPS):
            question = TTFT_QUESTIONS[i % len(TTFT_QUESTIONS)]
            spec = RequestSpec(f"ttft{i}", 0, 1, messages=({"role": "user", "content": question},))
            (ex,) = await round_of([spec])
            ttfts.append(ex.token_times[0] - ex.t_send)
        out: dict[str, Any] = {"model_name": model_name, "ttft_s": statistics.median(ttfts), "decode": {}}
        for n in streams:
            served, engine = [], []
            for r in range(rounds):
                rate, completion_tokens = await served_round(round_of, tokens, n, r)
                served.append(rate)
                engine.append(engine_decode(n))
            out["decode"][n] = {"served": served, "engine": engine, "completion_tokens": completion_tokens}
    return out


async def served_round(round_of: Any, tokens: int, n: int, r: int) -> tuple[float, list[int]]:
    """Aggregate decode tokens/s of n concurrent streams of `tokens` tokens (module docstring)
    and each stream's completion tokens; `round_of` sends the specs and checks for errors."""
    from .loadtest.workloads import RequestSpec

    specs = [
        RequestSpec(
            f"s{n}.{r}.{i}", 0, tokens, messages=({"role": "user", "content": f"{STREAM_PROMPT} ({r}.{i})"},)
        )
        for i in range(n)
    ]
    exchanges = await round_of(specs)
    for ex in exchanges:
        if ex.completion_tokens != tokens or ex.finish_reason != "length":
            raise SystemExit(
                f"slotserve bench serve: a stream ended after {ex.completion_tokens} of {tokens} "
                f"tokens (finish_reason {ex.finish_reason!r})"
            )
    first = min(ex.token_times[0] for ex in exchanges)
    last = max(ex.token_times[-1] for ex in exchanges)
    after_first = sum(ex.completion_tokens - 1 for ex in exchanges)
    rate = after_first / (last - first) if last > first else float("nan")
    return rate, [ex.completion_tokens for ex in exchanges]


# --- parts 2 and 3: the engine and the machine ---


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


def triad_bandwidth(mib: int, reps: int = BANDWIDTH_REPS, threads: int = 1) -> float:
    """Best-of-`reps` bytes/s of a = b + s*c over three float64 arrays of `mib` MiB each on
    `threads` threads, counting 3 arrays of traffic per pass (module docstring)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    n = mib * 1024 * 1024 // 8
    a, b, c = np.zeros(n), np.ones(n), np.full(n, 2.0)  # touched now: no page faults while timed
    share = -(-n // threads)  # elements per thread, rounded up

    def triad(lo: int, hi: int) -> None:
        for i in range(lo, hi, BANDWIDTH_CHUNK):
            j = min(i + BANDWIDTH_CHUNK, hi)
            np.multiply(c[i:j], 3.0, out=a[i:j])
            np.add(a[i:j], b[i:j], out=a[i:j])

    best = float("inf")
    with ThreadPoolExecutor(threads) as workers:
        for _ in range(reps):
            a[:] = 0.0
            t = time.perf_counter()
            list(workers.map(lambda k: triad(k * share, min(n, (k + 1) * share)), range(threads)))
            best = min(best, time.perf_counter() - t)
    if not (a == 7.0).all():  # 1 + 3 * 2: the threads covered the arrays
        raise AssertionError("triad produced a wrong value")
    return 3 * n * 8 / best


def read_bandwidth(mib: int, reps: int = BANDWIDTH_REPS, threads: int = 1) -> float:
    """Best-of-`reps` bytes/s of reading one float64 array of `mib` MiB on `threads` threads
    (chunked dot products with a vector of ones that stays in cache)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    n = mib * 1024 * 1024 // 8
    a, ones = np.ones(n), np.ones(BANDWIDTH_CHUNK)
    share = -(-n // threads)

    def read(lo: int, hi: int) -> float:
        total = 0.0
        for i in range(lo, hi, BANDWIDTH_CHUNK):
            j = min(i + BANDWIDTH_CHUNK, hi)
            total += float(np.dot(a[i:j], ones[: j - i]))
        return total

    best = float("inf")
    with ThreadPoolExecutor(threads) as workers:
        for _ in range(reps):
            t = time.perf_counter()
            total = sum(workers.map(lambda k: read(k * share, min(n, (k + 1) * share)), range(threads)))
            best = min(best, time.perf_counter() - t)
            if total != n:  # every element read once
                raise AssertionError(f"read pass summed {total}, expected {n}")
    return n * 8 / best


def decode_weight_bytes(model: Any) -> int:
    """Bytes of weights one decode step reads: every tensor but token_embd, which a step reads
    one row of, unless the output matrix is tied to it."""
    total = sum(t.data.nbytes for t in model.tensors.values())
    if not model.config.tied_output:
        total -= model.tensors["token_embd.weight"].data.nbytes
    return int(total)


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
            served = asyncio.run(measure_served(url, args.tokens, streams, args.rounds, engine_decode))
        finally:
            stop_server(proc)
    del engine_decode  # frees the in-process pool before the bandwidth passes

    bandwidth = triad_bandwidth(args.bandwidth_mib, threads=engine_threads)
    read_bw = read_bandwidth(args.bandwidth_mib, threads=engine_threads)
    weight_bytes = decode_weight_bytes(model)
    bound = bandwidth / weight_bytes
    info["ttft_s"] = served["ttft_s"]
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
