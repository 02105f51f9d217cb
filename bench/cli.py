"""`slotserve bench KIND`: one module per benchmark, each with `configure(parser)` and `run(args)`."""

from __future__ import annotations

import argparse
import importlib

BENCHMARKS: dict[str, tuple[str, str]] = {
    "engine": ("slotserve.bench.engine", "prefill/decode tokens/s of the C engine"),
    "kernels": ("slotserve.bench.kernels", "single-thread matmul GB/s of weights per tensor type"),
    "routing": ("slotserve.bench.routing", "prefix routing cost against N slots"),
    "serve": (
        "slotserve.bench.serve",
        "served decode tokens/s at 1/4/8 streams and TTFT vs the engine and a bandwidth bound",
    ),
    "structured": ("slotserve.bench.structured", "decode tokens/s under a json_schema constraint vs none"),
    "tools": (
        "slotserve.bench.tools",
        "tool-call recall and false calls of a served model (tool_choice auto)",
    ),
    "versus": (
        "slotserve.bench.versus",
        "slotserve against llama.cpp's llama-bench on the same files, alternating, ratios per round",
    ),
    "replica-sim": (
        "slotserve.bench.replica_sim",
        "N replicas x M slots: cache-aware vs round-robin vs random routing",
    ),
}


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True, metavar="KIND")
    for name, (module_name, help_text) in BENCHMARKS.items():
        cmd = sub.add_parser(name, help=help_text)
        cmd.set_defaults(_bench_module=module_name)
        try:
            importlib.import_module(module_name).configure(cmd)
        except ImportError as exc:
            cmd.set_defaults(_bench_error=exc)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "_bench_error", None) is not None:
        raise SystemExit(f"slotserve bench {args.bench}: unavailable ({args._bench_error})")
    return int(importlib.import_module(args._bench_module).run(args) or 0)
