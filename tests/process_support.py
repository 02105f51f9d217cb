"""Subprocess helpers shared by the tests that start real servers (slotserve, Prometheus)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(model: Path | str, port: int, *flags: str) -> list[str]:
    """The argv of `slotserve serve --model MODEL` on 127.0.0.1:PORT with `flags`, run by this
    interpreter (the tests' installed slotserve)."""
    return [sys.executable, "-m", "slotserve", "serve", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(port), *flags]  # fmt: skip


def log_tail(log: Path | None, num_chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-num_chars:] if log is not None and log.exists() else ""


def wait_http_ready(
    proc: subprocess.Popen, url: str, *, what: str, log: Path | None = None, timeout_s: float = 60.0
) -> None:
    """Poll `url` until it answers 200. Fails the test, with the tail of `log` (or, without a
    log, the exited process's piped stderr), if `proc` exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            output = log_tail(log) if log is not None else (proc.stderr.read() if proc.stderr else "")
            pytest.fail(f"{what} exited with {proc.returncode}:\n{output}")
        try:
            if httpx.get(url, timeout=1.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not ready after {timeout_s:.0f} s:\n{log_tail(log)}")
        time.sleep(0.1)
