"""SIGTERM while streams are running and queued: every stream ends cleanly (its last event
`data: [DONE]`, finish reason `length`), a request sent during the drain gets 503 `draining`,
and the process exits 0. Repeated (a fresh process each round) while --soak-seconds lasts."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from soak_support import fake_server, scrape, tail

pytestmark = pytest.mark.soak

SLOTS, STREAMS, MAX_ROUNDS = 2, 6, 10
BODY = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 40, "ignore_eos": True, "stream": True}


def stream(url: str, out: dict) -> None:
    lines = []
    with httpx.stream("POST", url + "/v1/chat/completions", json=BODY, timeout=60, trust_env=False) as r:
        out["status"] = r.status_code
        for line in r.iter_lines():
            if line:
                lines.append(line)
    out["lines"] = lines


def one_round(tmp_path: Path) -> tuple[int, float]:
    runtime = {"num_slots": SLOTS, "max_queue": 16}
    with fake_server(tmp_path, runtime=runtime, config={"drain_grace_s": 30}, step_s=0.02) as server:
        results = [{} for _ in range(STREAMS)]
        threads = [threading.Thread(target=stream, args=(server.url, results[i])) for i in range(STREAMS)]
        for t in threads:
            t.start()
        wait_until = time.monotonic() + 30
        while True:  # every request admitted: both slots stream, the rest wait in the queue
            m = scrape(server.url)
            if m["slotserve_running_requests"] + m["slotserve_queue_depth"] == STREAMS:
                break
            assert time.monotonic() < wait_until, "the streams were not all admitted"
            time.sleep(0.01)
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while (
            httpx.get(server.url + "/ready", timeout=10).status_code != 503
        ):  # the drain starts within a tick
            assert time.monotonic() < deadline, "the drain did not start"
            time.sleep(0.01)
        probe = {**BODY, "stream": False, "max_tokens": 1}
        r = httpx.post(server.url + "/v1/chat/completions", json=probe, timeout=10)  # streams still run
        refused = r.json()["error"]["code"] if r.status_code == 503 else r.status_code
        for t in threads:
            t.join(60)
        rc = server.proc.wait(60)
        took = time.monotonic() - sent
    assert rc == 0, tail(server)
    assert refused == "draining"
    for res in results:
        assert res["status"] == 200 and res["lines"][-1] == "data: [DONE]", res
        last = json.loads(res["lines"][-2][len("data: ") :])
        assert last["choices"][0]["finish_reason"] == "length", last  # finished, not cancelled
    text = server.log.read_text()
    assert "Traceback" not in text and "ERROR" not in text, text[-3000:]
    return rc, took


def test_sigterm_with_active_streams_ends_them_cleanly_and_exits_0(
    soak_seconds: float, tmp_path: Path
) -> None:
    deadline = time.monotonic() + soak_seconds
    rounds = []
    while not rounds or (time.monotonic() < deadline and len(rounds) < MAX_ROUNDS):
        rounds.append(one_round(tmp_path))
    print(
        f"\nsoak sigterm: {len(rounds)} rounds of {STREAMS} streams on {SLOTS} slots; SIGTERM to exit "
        f"{', '.join(f'{took:.1f}' for _, took in rounds)} s"
    )
