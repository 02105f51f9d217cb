"""deploy/prometheus against a real Prometheus: promtool checks, and a live scrape of slotserve.

The live test installs Debian's `prometheus` package when it is missing (CI runs as root), starts
it on a free loopback port with a 1 s scrape and evaluation interval and the rules from
deploy/prometheus/rules.yml, drives a short multi-turn load, and reads the recorded hit rate back
through Prometheus' HTTP API. A machine without apt-get FAILS here, with the fix in the message.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from slotserve.metrics import ServerMetrics
from slotserve.scheduler.request import FinishReason, ReuseSource
from slotserve.scheduler.stats import RequestStats, SchedulerStats, SlotLevel

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus" / "rules.yml"
RULES_TEST = REPO / "deploy" / "prometheus" / "rules_test.yml"
HIT_RATE = "job:slotserve_reuse_hit_rate:ratio_rate5m"
REUSE_RATIO = "job:slotserve_reuse_ratio:ratio_rate5m"
SCRAPE_JOB = "slotserve"


# ---------------------------------------------------------------- Prometheus harness


def ensure_prometheus() -> tuple[str, str]:
    """Paths of `prometheus` and `promtool`, installing Debian's package first if needed."""
    found = shutil.which("prometheus"), shutil.which("promtool")
    if all(found):
        return found  # type: ignore[return-value]
    apt = shutil.which("apt-get")
    if apt is None:
        pytest.fail("prometheus/promtool are not installed and apt-get is not available: install "
                    "Prometheus 2.x (both binaries on PATH) to run the deploy/prometheus tests")
    if os.geteuid() != 0:
        pytest.fail("prometheus is not installed and installing it needs root: run "
                    "`apt-get update && apt-get install -y prometheus` (or run the tests as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "--no-install-recommends", "prometheus"]
    result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:  # stale or missing package lists: update once and retry
        subprocess.run([apt, "update"], env=env, capture_output=True, text=True, timeout=600)
        result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    found = shutil.which("prometheus"), shutil.which("promtool")
    if result.returncode != 0 or not all(found):
        pytest.fail(f"`{' '.join(install)}` failed (exit {result.returncode}):\n{result.stdout[-2000:]}"
                    f"\n{result.stderr[-2000:]}")
    return found  # type: ignore[return-value]


@pytest.fixture(scope="module")
def prometheus_bins() -> tuple[str, str]:
    return ensure_prometheus()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A Prometheus process on loopback; `query` runs an instant PromQL query."""

    def __init__(self, url: str, proc: subprocess.Popen, log_path: Path):
        self.url = url
        self.proc = proc
        self.log_path = log_path

    def query(self, expr: str) -> list[dict]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_for(self, expr: str, ok, timeout_s: float, what: str) -> list[dict]:
        """Poll `expr` until ok(result) holds; fail with the last result and the log tail."""
        deadline = time.monotonic() + timeout_s
        result: list[dict] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if ok(result):
                return result
            time.sleep(0.25)
        pytest.fail(f"timed out after {timeout_s}s waiting for {what}: {expr} -> {result}\n"
                    f"prometheus log:\n{self.log_path.read_text()[-3000:]}")


@contextlib.contextmanager
def run_prometheus(binary: str, workdir: Path, target: str) -> Iterator[Prometheus]:
    """Prometheus scraping `target` (host:port) every second, with deploy/prometheus/rules.yml."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": SCRAPE_JOB, "static_configs": [{"targets": [target]}]}],
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = workdir / "prometheus.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={config_path}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{prom.url}/-/ready", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready after 30s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def exposed_sample_names(metrics_text: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(metrics_text) for s in fam.samples}


def referenced_metric_names(text: str) -> set[str]:
    """`slotserve_*` metric names used in PromQL inside `text`, recording-rule names excluded."""
    return set(re.findall(r"(?<![:\w])slotserve_[a-z0-9_]+(?![:\w])", text))


# ---------------------------------------------------------------- promtool


def test_promtool_check_rules(prometheus_bins):
    _, promtool = prometheus_bins
    result = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_rule_unit_tests(prometheus_bins):
    _, promtool = prometheus_bins
    result = subprocess.run([promtool, "test", "rules", RULES_TEST.name], cwd=RULES_TEST.parent,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- live scrape (stand-in exporter)


class _MetricsHandler(BaseHTTPRequestHandler):
    metrics: ServerMetrics

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        body, content_type = self.metrics.render()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serve_metrics(metrics: ServerMetrics) -> Iterator[str]:
    handler = type("Handler", (_MetricsHandler,), {"metrics": metrics})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_recording_rule_reads_the_hit_rate_of_a_scraped_exporter(prometheus_bins, tmp_path):
    """Stand-in exporter: ServerMetrics fed the events of 2 conversations x 4 turns."""
    prometheus, _ = prometheus_bins
    metrics = ServerMetrics(strict=True)
    metrics.bind(lambda: SchedulerStats(0, 64, 0, (SlotLevel(0, "idle", 10), SlotLevel(1, "idle", 20)),
                                        4096, 0, 0, 0, False))
    with serve_metrics(metrics) as target, run_prometheus(prometheus, tmp_path, target) as prom:
        prom.wait_for(f'up{{job="{SCRAPE_JOB}"}}', lambda r: r and r[0]["value"][1] == "1", 20, "first scrape")
        num_requests = num_reused = prompt_total = reused_total = 0
        for conversation in range(2):
            prompt = 40 + conversation
            for turn in range(4):
                reused = 0 if turn == 0 else prompt - 25  # later turns rewind to the previous prompt
                metrics.sink.on_request(RequestStats(
                    "ok", FinishReason.STOP, prompt, reused, ReuseSource.REWIND if reused else ReuseSource.NONE,
                    prompt - reused, 8, 0.001, 0.05, 0.2, (0.02,) * 7))
                num_requests += 1
                num_reused += reused > 0
                prompt_total += prompt
                reused_total += reused
                prompt += 30
                time.sleep(0.3)  # spread over several scrapes, as real traffic is
        expected = num_reused / num_requests
        assert expected == 0.75
        result = prom.wait_for(
            HIT_RATE, lambda r: r and float(r[0]["value"][1]) == pytest.approx(expected, abs=1e-9), 20,
            f"hit rate {expected}")
        assert result[0]["metric"] == {"__name__": HIT_RATE, "job": SCRAPE_JOB}
        ratio = prom.wait_for(
            REUSE_RATIO, lambda r: r and float(r[0]["value"][1]) == pytest.approx(reused_total / prompt_total, abs=1e-9),
            10, "reuse ratio")
        assert 0 < float(ratio[0]["value"][1]) < 1
