"""Helpers of the soak and fault suite (tests/soak/): server processes on 127.0.0.1 (the fake
engine, or `slotserve serve` on a GGUF), Prometheus text read back, resident memory sampled.

Every loop here is bounded twice: by a deadline and by a count.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from gateway_support import free_port
from process_support import log_tail, wait_http_ready
from slotserve.scheduler.disk_store import _FIXED, _MAGIC, _TAIL

TESTS = Path(__file__).resolve().parent

# A server over FakeSlotPool in its own process (so its memory can be measured and it can be
# signalled): argv[1] is JSON {"runtime": make_runtime kwargs, "config": ServeConfig kwargs,
# "step_s": seconds each engine forward sleeps, "fsync_s": seconds each fsync sleeps}.
FAKE_SERVER = textwrap.dedent("""
    import json, sys, time
    from gateway_support import make_runtime, serve_config
    from slotserve.gateway.app import create_app
    from slotserve.gateway.server import DrainingServer, uvicorn_config
    from slotserve.metrics import ServerMetrics

    spec = json.loads(sys.argv[1])
    if spec.get("fsync_s"):  # a slow disk, so a kill -9 catches checkpoint writes mid-way
        import os
        _fsync = os.fsync
        os.fsync = lambda fd: (time.sleep(spec["fsync_s"]), _fsync(fd))[1]
    metrics = ServerMetrics()
    runtime, pool = make_runtime(metrics=metrics, **spec["runtime"])
    step_s = spec["step_s"]
    if step_s:
        pool.forward_hook = lambda batch: time.sleep(step_s)
    config = serve_config(**spec["config"])
    server = DrainingServer(uvicorn_config(create_app(runtime, config, metrics=metrics), config),
                            runtime.scheduler, config.drain_grace_s, stop_timeout_s=config.shutdown_timeout_s)
    server.run()
""")


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    port: int
    log: Path
    exit_code: int | None = field(default=None)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics(self) -> dict[str, float]:
        return scrape(self.url)

    def rss_bytes(self) -> int:
        return rss_bytes(self.proc.pid)

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM and wait; returns the exit status (kills it if it does not stop)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.exit_code = self.proc.wait()
        return self.exit_code


@contextmanager
def fake_server(
    log_dir: Path,
    *,
    runtime: dict[str, Any],
    config: dict[str, Any],
    step_s: float = 0.0,
    fsync_s: float = 0.0,
) -> Iterator[ServerProcess]:
    port = free_port()
    config = {"port": port, "log_level": "warning", **config}
    spec = {"runtime": runtime, "config": config, "step_s": step_s, "fsync_s": fsync_s}
    log = log_dir / f"fake-server-{port}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", FAKE_SERVER, json.dumps(spec)],
            cwd=TESTS,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = ServerProcess(proc, port, log)
    try:
        wait_http_ready(proc, server.url + "/ready", what="fake server", log=log)
        yield server
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start_serve(log: Path, argv: list[str], *, python_prelude: str | None = None) -> ServerProcess:
    """`slotserve serve ARGV --port P` in a process (with `python_prelude` run first in it, e.g.
    to slow the disk down); waits until /ready."""
    port = free_port()
    args = [*argv, "--port", str(port)]
    if python_prelude is None:
        cmd = [sys.executable, "-m", "slotserve", "serve", *args]
    else:
        code = (
            python_prelude
            + "\nimport sys\nfrom slotserve.cli import main\nraise SystemExit(main(['serve', *sys.argv[1:]]))\n"
        )
        cmd = [sys.executable, "-c", code, *args]
    with open(log, "a") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    server = ServerProcess(proc, port, log)
    try:
        wait_http_ready(proc, server.url + "/ready", what="slotserve serve", log=log)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return server


def scrape(url: str) -> dict[str, float]:
    """GET /metrics as {'name{label="v",...}': value} (labels sorted as exposed)."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10, trust_env=False).text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def rss_bytes(pid: int) -> int:
    """Resident set size of process `pid` (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class RSSSampler:
    """Samples a process's resident memory every `interval_s` on a thread, with timestamps."""

    def __init__(self, pid: int, interval_s: float = 0.1):
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), rss_bytes(self.pid)))
            except (OSError, AssertionError):
                return
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RSSSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def after(self, t: float) -> list[int]:
        return [rss for ts, rss in self.samples if ts >= t]


def wait_idle(url: str, timeout_s: float = 15) -> dict[str, float]:
    """Poll /metrics until no request runs or waits; returns that scrape."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = scrape(url)
        busy = m["slotserve_running_requests"] + m["slotserve_queue_depth"]
        busy += m['slotserve_slots{state="prefill"}'] + m['slotserve_slots{state="decode"}']
        if busy == 0:
            return m
        assert time.monotonic() < deadline, f"still busy after {timeout_s} s: {busy}"
        time.sleep(0.05)


def tail(server: ServerProcess) -> str:
    return log_tail(server.log)


# -- disk checkpoint files -------------------------------------------------------------------


def check_file(path: Path) -> None:
    """A checkpoint file is whole: header fields consistent and the checksum right."""
    raw = path.read_bytes()
    magic, _version, _fp, n, rule_len = _FIXED.unpack_from(raw, 0)
    assert magic == _MAGIC
    off = _FIXED.size + rule_len
    data_len, checksum = _TAIL.unpack_from(raw, off)
    off += _TAIL.size
    tokens, data = raw[off : off + 4 * n], raw[off + 4 * n :]
    assert len(data) == data_len, f"{path.name}: truncated"
    assert hashlib.sha256(tokens + data).digest() == checksum, f"{path.name}: checksum"


def model_dir(root: Path) -> Path:
    dirs = [d for d in root.iterdir() if d.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def file_tokens(path: Path) -> list[int]:
    raw = path.read_bytes()
    n, rule_len = _FIXED.unpack_from(raw, 0)[3:]
    off = _FIXED.size + rule_len + _TAIL.size
    return list(np.frombuffer(raw[off : off + 4 * n], dtype=np.int32))
