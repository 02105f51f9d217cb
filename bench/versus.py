"""`slotserve bench versus`: slotserve against llama.cpp's llama-bench on the same files, in one
run, alternating, so every ratio compares figures taken minutes apart on the same host.

For each model and each of --rounds rounds, llama-bench and every --build run once each (odd
rounds llama-bench first, even rounds last), as separate processes:

    llama-bench -m FILE -t T -p PP -n TG -r REPS -o json [-d D]
    BUILD bench engine --model FILE --threads T --reps REPS --no-numpy --json --depth D

PP is 512 and TG 128, after D tokens (default 0): `bench engine --depth` times those two figures
alone (its other figures, the batches and pp2048, would make a round several minutes long). A --build is `LABEL=EXECUTABLE` (a slotserve console script: another
worktree's venv/bin/slotserve compares two builds in the same window); the default is this
interpreter's slotserve. The environment is inherited (SLOTSERVE_KERNELS=avx2 forces the AVX2
kernels of every build; llama.cpp's instruction set is the one its binary was built for).

Each run's line carries the 1-minute load average before it; the ratios are per round (a build's
figure over llama-bench's in the same round) and never averaged across rounds.

A decode step of a dense model reads every weight once, so on a shared host its speed follows
the memory bandwidth the host gives at that minute. `--probe` measures it before each run
(reading a 256 MiB array on --threads threads with the engine's C read loop, best of 5: bench
serve's read probe) and prints, for tg, the weight bytes each side read per second (tg x
`decode_bytes`: the file's tensors, less the token embedding when the output is not tied to it)
as a fraction of that probe. The fraction says how close each side is to the host's bound in
that round, which a ratio alone cannot: one round's ratio moves with the host, the fractions do
not. The builds' own processes do all the timed work, so this also runs builds whose C
extension differs from this one's (only --probe's read loop is this install's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_PP = 512
DEFAULT_TG = 128
PROBE_MIB = 256


@dataclass(frozen=True)
class Target:
    """One file both sides run: `engine_args` select it for `bench engine`."""

    label: str
    path: Path
    engine_args: tuple[str, ...]
    pp: int
    tg: int


@dataclass
class Run:
    who: str  # "llama-bench" or a build's label
    round: int
    load: float  # 1-minute load average before the run
    pp: float | None  # tokens/s
    tg: float | None
    extra: dict[str, Any] = field(default_factory=dict)
    probe: float | None = None  # read bandwidth before the run, GB/s (--probe)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--llama-bench", required=True, metavar="PATH", help="llama.cpp's llama-bench binary")
    parser.add_argument(
        "--model", action="append", default=[], metavar="PATH", help="a GGUF file both run (repeatable)"
    )
    parser.add_argument(
        "--synthetic",
        action="append",
        default=[],
        metavar="NAME",
        help="a `bench engine --synthetic` preset (repeatable; its file is written first if missing)",
    )
    parser.add_argument("--synthetic-dir", metavar="DIR", help="as `bench engine --synthetic-dir`")
    parser.add_argument(
        "--build",
        action="append",
        default=[],
        metavar="LABEL=EXE",
        help="a slotserve executable to measure (repeatable; default: this install's)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    parser.add_argument("--threads", type=int, default=2, help="threads on both sides (default 2)")
    parser.add_argument("--reps", type=int, default=2, help="timed runs per figure on both sides (default 2)")
    parser.add_argument("--depth", type=int, default=0, help="measure after N tokens (llama-bench -d N)")
    parser.add_argument(
        "--probe",
        action="store_true",
        help="measure the read bandwidth before each run and print tg's weight reads as a fraction of it",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")


def parse_builds(specs: list[str]) -> list[tuple[str, list[str]]]:
    """[(label, argv prefix)]; no spec: this interpreter's slotserve."""
    if not specs:
        return [("slotserve", [sys.executable, "-m", "slotserve"])]
    builds = []
    for spec in specs:
        label, sep, exe = spec.partition("=")
        if not sep or not label or not exe:
            raise SystemExit(f"--build {spec!r}: expected LABEL=EXECUTABLE")
        if shutil.which(exe) is None:
            raise SystemExit(f"--build {spec!r}: {exe} is not an executable")
        builds.append((label, [exe]))
    if len({label for label, _ in builds}) != len(builds):
        raise SystemExit("--build labels must differ")
    return builds


def targets(args: argparse.Namespace) -> list[Target]:
    out = [Target(Path(m).name, Path(m), ("--model", m), DEFAULT_PP, DEFAULT_TG) for m in args.model]
    for name in args.synthetic:
        from . import synthetic

        path, _ = synthetic.ensure_synthetic(name, args.synthetic_dir)
        extra = ("--synthetic-dir", args.synthetic_dir) if args.synthetic_dir else ()
        out.append(Target(name, path, ("--synthetic", name, *extra), DEFAULT_PP, DEFAULT_TG))
    if not out:
        raise SystemExit("give at least one --model or --synthetic")
    for t in out:
        if not t.path.is_file():
            raise SystemExit(f"{t.path}: no such file")
    return out


def decode_bytes(path: Path) -> int | None:
    """Weight bytes one decode token reads from `path` (bandwidth.decode_weight_bytes: every
    tensor, less the token embedding when the output is not tied to it). None for a mixture of
    experts (a token reads only its experts) or a file the engine cannot open."""
    from slotserve.engine_ext.gguf_file import load_model_file

    from .bandwidth import decode_weight_bytes

    try:
        model = load_model_file(path)
    except ValueError:  # not a GGUF, cut short, or not a model the engine runs
        return None
    if any("_exps" in name for name in model.tensors):
        return None
    return decode_weight_bytes(model)


def probe_gb_s(threads: int) -> float:
    from .bandwidth import read_bandwidth

    return round(read_bandwidth(PROBE_MIB, threads=threads) / 1e9, 1)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _run_json(argv: list[str]) -> Any:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{' '.join(argv)}: output is not JSON ({exc})") from None


def run_llama(exe: str, t: Target, rnd: int, threads: int, reps: int, depth: int) -> Run:
    argv = [exe, "-m", str(t.path), "-t", str(threads), "-p", str(t.pp), "-n", str(t.tg), "-r", str(reps)]
    argv += ["-o", "json", "-d", str(depth)]
    load = _load()
    rows = _run_json(argv)
    pp = next((r["avg_ts"] for r in rows if r.get("n_prompt") == t.pp and r.get("n_gen") == 0), None)
    tg = next((r["avg_ts"] for r in rows if r.get("n_gen") == t.tg and r.get("n_prompt") == 0), None)
    build = {k: rows[0].get(k) for k in ("build_commit", "build_number", "cpu_info")} if rows else {}
    return Run("llama-bench", rnd, load, pp, tg, build)


def run_build(label: str, prefix: list[str], t: Target, rnd: int, threads: int, reps: int, depth: int) -> Run:
    argv = prefix + ["bench", "engine", *t.engine_args, "--threads", str(threads), "--reps", str(reps)]
    argv += ["--no-numpy", "--json", "--depth", str(depth)]
    load = _load()
    info = _run_json(argv)
    res = info["results"][f"threads={threads}"]
    pp, tg = res.get(f"pp{t.pp}_d{depth}"), res.get(f"tg{t.tg}_d{depth}")
    return Run(label, rnd, load, pp, tg, {"kernel_variant": info.get("kernel_variant")})


def ratios(runs: list[Run]) -> dict[str, dict[str, list[float | None]]]:
    """{build: {"pp": [ratio per round], "tg": [...]}}: each against llama-bench's same round."""
    out: dict[str, dict[str, list[float | None]]] = {}
    rounds = sorted({r.round for r in runs})
    for r in runs:
        if r.who == "llama-bench" or r.who in out:
            continue
        out[r.who] = {"pp": [], "tg": []}
        for n in rounds:
            ours = next((x for x in runs if x.who == r.who and x.round == n), None)
            ref = next((x for x in runs if x.who == "llama-bench" and x.round == n), None)
            for kind in ("pp", "tg"):
                a = getattr(ours, kind) if ours else None
                b = getattr(ref, kind) if ref else None
                out[r.who][kind].append(round(a / b, 2) if a and b else None)
    return out


def read_fraction(r: Run, nbytes: int | None) -> float | None:
    """tg's weight reads per second over the probe before the run (None without both)."""
    if r.tg is None or r.probe is None or not nbytes:
        return None
    return round(r.tg * nbytes / 1e9 / r.probe, 2)


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def run(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.threads < 1 or args.reps < 1 or args.depth < 0:
        raise SystemExit("--rounds, --threads and --reps must be >= 1, --depth >= 0")
    if shutil.which(args.llama_bench) is None:
        raise SystemExit(f"--llama-bench {args.llama_bench}: not an executable")
    builds = parse_builds(args.build)
    todo = targets(args)
    from .engine import machine

    report: dict[str, Any] = {"machine": machine(), "command": " ".join(sys.argv), "models": {}}
    if not args.json:
        m = report["machine"]
        print(
            f"{m['cpu']}, {m['cpus']} CPUs, {args.threads} threads, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
        )
    for t in todo:
        runs: list[Run] = []
        nbytes = decode_bytes(t.path) if args.probe else None
        d = f" after {args.depth}" if args.depth else ""
        if not args.json:
            print(f"== {t.label}: pp{t.pp} and tg{t.tg}{d}, tokens/s")
        for rnd in range(1, args.rounds + 1):
            order: list[tuple[str, list[str] | None]] = [("llama-bench", None), *builds]
            if rnd % 2 == 0:
                order.reverse()
            for who, prefix in order:
                bw = probe_gb_s(args.threads) if args.probe else None  # right before the run
                if prefix is None:
                    r = run_llama(args.llama_bench, t, rnd, args.threads, args.reps, args.depth)
                else:
                    r = run_build(who, prefix, t, rnd, args.threads, args.reps, args.depth)
                runs.append(r)
                if bw is not None:
                    r.probe = bw
                    r.extra["tg_read_fraction"] = read_fraction(r, nbytes)
                if not args.json:
                    line = (
                        f"  round {rnd} {who:<14} load {r.load:5.2f}  pp {_fmt(r.pp):>8}  tg {_fmt(r.tg):>7}"
                    )
                    if r.probe is not None:
                        frac = r.extra["tg_read_fraction"]
                        line += f"  probe {r.probe:5.1f} GB/s  tg reads {_fmt(frac, '.2f')} of it"
                    print(line, flush=True)
        rat = ratios(runs)
        if not args.json:
            for who, k in rat.items():
                pp = " / ".join(_fmt(x, ".2f") + "x" for x in k["pp"])
                tg = " / ".join(_fmt(x, ".2f") + "x" for x in k["tg"])
                print(f"  {who} over llama-bench by round: pp {pp}; tg {tg}")
        report["models"][t.label] = {
            "path": str(t.path),
            "decode_bytes": nbytes,
            "runs": [vars(r) for r in runs],
            "ratios": rat,
        }
    report["load_average_after"] = _load()
    if args.json:
        print(json.dumps(report, indent=1))
    return 0
