"""deploy/prometheus against a real Prometheus: promtool checks, and a live scrape of slotserve.

The live test installs Debian's `prometheus` package when it is missing (CI runs as root), starts
it on a free loopback port with a 1 s scrape and evaluation interval and the rules from
deploy/prometheus/rules.yml, drives a short multi-turn load, and reads the recorded hit rate back
through Prometheus' HTTP API. A machine without apt-get FAILS here, with the fix in the message.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from process_support import free_port, serve_command, wait_http_ready
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "rules.yml"
RULES_TEST = REPO / "deploy" / "prometheus" / "rules_test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "slotserve.json"
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
        pytest.fail(
            "prometheus/promtool are not installed and apt-get is not available: install "
            "Prometheus 2.x (both binaries on PATH) to run the deploy/prometheus tests"
        )
    if os.geteuid() != 0:
        pytest.fail(
            "prometheus is not installed and installing it needs root: run "
            "`apt-get update && apt-get install -y prometheus` (or run the tests as root)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "--no-install-recommends", "prometheus"]
    result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:  # stale or missing package lists: update once and retry
        subprocess.run([apt, "update"], env=env, capture_output=True, text=True, timeout=600)
        result = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
    found = shutil.which("prometheus"), shutil.which("promtool")
    if result.returncode != 0 or not all(found):
        pytest.fail(
            f"`{' '.join(install)}` failed (exit {result.returncode}):\n{result.stdout[-2000:]}"
            f"\n{result.stderr[-2000:]}"
        )
    return found  # type: ignore[return-value]


@pytest.fixture(scope="module")
def prometheus_bins() -> tuple[str, str]:
    return ensure_prometheus()


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
        pytest.fail(
            f"timed out after {timeout_s}s waiting for {what}: {expr} -> {result}\n"
            f"prometheus log:\n{self.log_path.read_text()[-3000:]}"
        )


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
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        wait_http_ready(proc, f"{prom.url}/-/ready", what="prometheus", log=log_path, timeout_s=30)
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
    result = subprocess.run(
        [promtool, "test", "rules", RULES_TEST.name], cwd=RULES_TEST.parent, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- live scrape of a real server


@contextlib.contextmanager
def run_slotserve(model: Path, workdir: Path, *args: str) -> Iterator[str]:
    """`slotserve serve --model model` on a free loopback port; yields its base URL when ready."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLOTSERVE_")}
    env["SLOTSERVE_HOME"] = str(workdir / "home")  # never pull or write outside the test dir
    log_path = workdir / "slotserve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            serve_command(model, port, "--log-level", "warning", *args),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(proc, f"{url}/ready", what="slotserve", log=log_path, timeout_s=60)
        yield url
    finally:
        proc.terminate()  # SIGTERM: drains (nothing runs) and exits
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def multi_turn_load(url: str, num_conversations: int, num_turns: int) -> list[dict]:
    """Agent-style chat: each turn resends the whole conversation. Returns every response body,
    in order (turn-major, so conversations compete for the slots)."""
    conversations = [
        [{"role": "user", "content": f"conversation {c}: list the steps of the plan"}]
        for c in range(num_conversations)
    ]
    bodies = []
    with httpx.Client(base_url=url, timeout=60) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        for turn in range(num_turns):
            for c, messages in enumerate(conversations):
                r = client.post(
                    "/v1/chat/completions",
                    json={"model": model, "messages": messages, "max_tokens": 6, "temperature": 0},
                )
                assert r.status_code == 200, r.text
                body = r.json()
                body["_conversation"], body["_turn"] = c, turn
                bodies.append(body)
                messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
                messages.append(
                    {"role": "user", "content": f"turn {turn}: and then what about step {turn + 2}"}
                )
    return bodies


def test_recording_rules_read_the_hit_rate_of_a_live_server(prometheus_bins, tiny_model_path, tmp_path):
    """slotserve (tiny model, 2 slots) under 3 conversations x 4 turns, scraped every second."""
    prometheus, _ = prometheus_bins
    with (
        run_slotserve(tiny_model_path, tmp_path, "--batched-session", "2", "--ctx-size", "1024") as url,
        run_prometheus(prometheus, tmp_path, url.removeprefix("http://")) as prom,
    ):
        prom.wait_for(
            f'slotserve_reuse_requests_total{{job="{SCRAPE_JOB}",source="none"}}',
            lambda r: len(r) == 1,
            20,
            "a first scrape with every counter at 0",
        )
        bodies = multi_turn_load(url, num_conversations=3, num_turns=4)

        reused = [b["slotserve"]["reused_tokens"] for b in bodies]
        prompt = [b["usage"]["prompt_tokens"] for b in bodies]
        assert [b["usage"]["prompt_tokens_details"]["cached_tokens"] for b in bodies] == reused
        assert reused[0] == 0, "the very first request has nothing to reuse"
        later = [r for b, r in zip(bodies, reused) if b["_turn"] > 0]
        assert all(r > 0 for r in later), f"a resent conversation must reuse its prefix: {later}"
        expected_hit_rate = sum(r > 0 for r in reused) / len(bodies)
        expected_reuse_ratio = sum(reused) / sum(prompt)
        assert 0.75 <= expected_hit_rate < 1  # 9 resent turns reuse; the first request cannot

        # the last scrape must include every request before the rule can be compared
        prom.wait_for(
            f'sum(slotserve_reuse_requests_total{{job="{SCRAPE_JOB}"}})',
            lambda r: r and float(r[0]["value"][1]) == len(bodies),
            20,
            "all requests scraped",
        )
        hit = prom.wait_for(
            HIT_RATE,
            lambda r: r and float(r[0]["value"][1]) == pytest.approx(expected_hit_rate, abs=1e-9),
            20,
            f"hit rate {expected_hit_rate}",
        )
        assert hit[0]["metric"] == {"__name__": HIT_RATE, "job": SCRAPE_JOB}
        prom.wait_for(
            REUSE_RATIO,
            lambda r: r and float(r[0]["value"][1]) == pytest.approx(expected_reuse_ratio, abs=1e-9),
            20,
            f"reuse ratio {expected_reuse_ratio}",
        )
        by_source = prom.query("job_source:slotserve_reuse_ratio:ratio_rate5m")
        assert sum(float(s["value"][1]) for s in by_source) == pytest.approx(expected_reuse_ratio, abs=1e-9)
        ttft = prom.wait_for(
            'job:slotserve_time_to_first_token_seconds:quantile_rate5m{quantile="0.5"}',
            lambda r: r and r[0]["value"][1] not in ("NaN", "+Inf"),
            10,
            "TTFT p50",
        )
        assert 0 < float(ttft[0]["value"][1]) <= 300

        # every metric the dashboard and the rules use is exported by the real server ...
        text = httpx.get(f"{url}/metrics", timeout=5).text
        exposed = exposed_sample_names(text)
        dropped = [line for line in text.splitlines() if line.startswith("slotserve_stats_dropped_total{")]
        assert dropped and all(line.endswith(" 0.0") for line in dropped), (
            f"stats contract breached: {dropped}"
        )
        for path in (DASHBOARD, RULES):
            missing = referenced_metric_names(path.read_text()) - exposed
            assert not missing, f"{path.name} uses metrics the server does not export: {sorted(missing)}"
        # ... and every dashboard query is valid PromQL that Prometheus evaluates
        for expr in dashboard_queries():
            prom.query(expr)


def dashboard_queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    subst = {"$job": SCRAPE_JOB, "$instance": ".*", "$__rate_interval": "1m"}
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for k, v in subst.items():
                expr = expr.replace(k, v)
            assert "$" not in expr, expr
            out.append(expr)
    assert len(out) >= 20
    return out


def test_promtool_checks_the_compose_prometheus_config(prometheus_bins, tmp_path):
    """deploy/compose/prometheus.yml, with its in-container rule path mapped to the repo file."""
    _, promtool = prometheus_bins
    config = yaml.safe_load((REPO / "deploy" / "compose" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/slotserve.yml"]
    config["rule_files"] = [str(RULES)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
