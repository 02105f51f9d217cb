"""Slow and broken clients against a real `slotserve serve` process on 127.0.0.1, with raw
sockets: a head that never comes, a body at a trickle, a client gone mid-body, idle keep-alive
connections, and more connections than --max-connections."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from gateway_support import free_port
from process_support import log_tail, wait_http_ready

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.5
KEEP_ALIVE_S = 1.0
MAX_CONNECTIONS = 6


@dataclass
class Served:
    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith(f"{name}{{") and line.split("}")[0][len(name) + 1 :].split(",") == want.split(
                ","
            ):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"no sample {name}{{{want}}}")


@pytest.fixture(scope="module")
def served(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    port = free_port()
    log = tmp_path_factory.mktemp("conn") / "server.log"
    argv = [
        sys.executable, "-m", "slotserve", "serve", "--model", str(tiny_model_path), "--parallel", "1",
        "--ctx-size", "128", "--port", str(port), "--log-level", "info",
        "--header-timeout-s", str(HEADER_TIMEOUT_S), "--body-timeout-s", str(BODY_TIMEOUT_S),
        "--keep-alive-timeout-s", str(KEEP_ALIVE_S), "--max-connections", str(MAX_CONNECTIONS),
    ]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    try:
        wait_http_ready(proc, f"http://127.0.0.1:{port}/ready", what="slotserve serve", log=log)
        yield Served(proc, port, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=30) == 0, log_tail(log)
        finally:
            if proc.poll() is None:
                proc.kill()


def read_until_closed(sock: socket.socket, timeout_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes (or `timeout_s`), and when it closed."""
    start = time.monotonic()
    data = b""
    while time.monotonic() - start < timeout_s:
        sock.settimeout(max(0.05, timeout_s - (time.monotonic() - start)))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return data, time.monotonic() - start
        if not chunk:
            return data, time.monotonic() - start
        data += chunk
    raise AssertionError(f"the server kept the connection open for {timeout_s} s; got {data!r}")


def error_code(response: bytes) -> tuple[int, str]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["error"]["code"]


def assert_clean_log(served: Served) -> None:
    text = served.log.read_text(errors="replace")
    assert "Traceback" not in text and " ERROR " not in text, text[-3000:]


def test_a_socket_that_sends_nothing_is_closed_within_the_header_timeout(served: Served) -> None:
    with served.connect() as sock:
        data, closed_after = read_until_closed(sock, HEADER_TIMEOUT_S + 5)
    assert HEADER_TIMEOUT_S * 0.8 <= closed_after <= HEADER_TIMEOUT_S + 3
    assert error_code(data) == (408, "request_timeout")


def test_half_a_head_is_closed_within_the_header_timeout(served: Served) -> None:
    with served.connect() as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
        data, closed_after = read_until_closed(sock, HEADER_TIMEOUT_S + 5)
    assert closed_after <= HEADER_TIMEOUT_S + 3
    assert error_code(data) == (408, "request_timeout")


def test_the_header_deadline_applies_again_on_a_kept_alive_connection(served: Served) -> None:
    with served.connect() as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b'"ok"}'):
            chunk = sock.recv(65536)
            assert chunk, first
            first += chunk
        sock.sendall(b"GET /health HTTP/1.1\r\nHo")  # the next request stalls mid-head
        data, closed_after = read_until_closed(sock, HEADER_TIMEOUT_S + 5)
    assert first.startswith(b"HTTP/1.1 200")
    assert closed_after <= HEADER_TIMEOUT_S + 3
    assert error_code(data) == (408, "request_timeout")


HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n"
)


def test_a_body_at_a_trickle_gets_408_and_holds_no_slot(served: Served) -> None:
    before = served.metric("slotserve_requests_total", outcome="timeout", stage="gateway")
    with served.connect() as sock:
        sock.sendall(HEAD)
        start = time.monotonic()
        data = b""
        sock.settimeout(0.3)
        for _ in range(int((BODY_TIMEOUT_S + 5) / 0.3)):  # one byte every 0.3 s until answered
            try:
                sock.sendall(b"{")
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            data += chunk
            if not chunk or data.endswith(b"}}"):
                break
        elapsed = time.monotonic() - start
    assert BODY_TIMEOUT_S * 0.8 <= elapsed <= BODY_TIMEOUT_S + 3
    assert error_code(data) == (408, "request_timeout")
    assert b"connection: close" in data.lower()
    slots = httpx.get(served.url + "/slots", timeout=10).json()["data"]
    assert all(s["request_id"] is None for s in slots)
    assert served.metric("slotserve_requests_total", outcome="timeout", stage="gateway") == before + 1


def test_a_client_gone_mid_body_is_a_counted_cancel_and_no_error(served: Served) -> None:
    before = served.metric("slotserve_requests_total", outcome="cancelled", stage="gateway")
    with served.connect() as sock:
        sock.sendall(HEAD + b"{")
        time.sleep(0.1)
    deadline = time.monotonic() + 10
    while served.metric("slotserve_requests_total", outcome="cancelled", stage="gateway") != before + 1:
        assert time.monotonic() < deadline, "the cancel was not counted"
        time.sleep(0.05)
    # nothing else disturbed: the next request is answered
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(served.url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
    assert_clean_log(served)


def test_an_idle_keep_alive_connection_is_closed(served: Served) -> None:
    with served.connect() as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        data, closed_after = read_until_closed(sock, KEEP_ALIVE_S + 5)
    assert data.startswith(b"HTTP/1.1 200") and data.count(b"HTTP/1.1") == 1
    assert b"connection: close" not in data.lower()  # kept alive, then closed when idle
    assert KEEP_ALIVE_S * 0.8 <= closed_after <= KEEP_ALIVE_S + 3


def test_connections_past_the_cap_are_refused_and_the_cap_frees(served: Served) -> None:
    held = [served.connect() for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.1)  # let the server accept them all
        with served.connect() as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            data, closed_after = read_until_closed(extra, 5)
        assert closed_after < HEADER_TIMEOUT_S  # refused at once, not after the header timeout
        assert data == b"" or error_code(data) == (503, "too_many_connections")
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while True:
        try:
            if httpx.get(served.url + "/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the cap did not free"
        time.sleep(0.05)
    assert "refused 1 connection(s)" in served.log.read_text()
    assert_clean_log(served)
