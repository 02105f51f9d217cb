"""The server subprocess of `slotserve bench serve`: a free loopback port, `slotserve serve`
started with the benchmark's flags (speculative decoding off), /ready polled, SIGTERM to stop,
and the process's CPU seconds from /proc."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

READY_TIMEOUT_S = 180.0


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
        # served decode is compared with the engine's one-token steps and a bandwidth bound:
        # speculative drafts (on by default in `serve`) would change what a step computes
        "--speculative",
        "off",
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


def server_cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid` (all its threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) ": field 3 is fields[0]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
