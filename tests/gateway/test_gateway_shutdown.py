"""SIGTERM with a hung engine: past --drain-grace-s + --shutdown-timeout-s the process exits 1.

The server runs in a subprocess (the watchdog ends the whole process) over FakeSlotPool whose
forward blocks forever once a request is in flight; the process sends itself SIGTERM.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from slotserve.gateway.server import EXIT_STUCK

TESTS = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading, time
    import httpx
    from gateway_support import make_runtime, serve_config, free_port
    from slotserve.gateway.app import create_app
    from slotserve.gateway.server import DrainingServer, uvicorn_config

    runtime, pool = make_runtime(num_slots=1)
    entered, never = threading.Event(), threading.Event()

    def hang(batch):
        entered.set()
        never.wait()  # the engine call that never returns

    pool.forward_hook = hang
    config = serve_config(port=free_port(), log_level="warning", drain_grace_s=0.2, shutdown_timeout_s=0.5)
    server = DrainingServer(uvicorn_config(create_app(runtime, config), config), runtime.scheduler,
                            config.drain_grace_s, stop_timeout_s=config.shutdown_timeout_s)

    def post():
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        try:
            httpx.post(config.url + "/v1/chat/completions", json=body, timeout=60)
        except httpx.HTTPError:
            pass

    def client():
        while not server.started:
            time.sleep(0.01)
        threading.Thread(target=post, daemon=True).start()
        assert entered.wait(10), "the request never reached the engine"
        print("sigterm", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=client, daemon=True).start()
    server.run()
    print("run returned", flush=True)
""")


def test_sigterm_with_a_hung_engine_exits_after_the_hard_deadline() -> None:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=TESTS, capture_output=True, text=True, timeout=60
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == EXIT_STUCK, (proc.stdout, proc.stderr)
    assert "sigterm" in proc.stdout and "run returned" not in proc.stdout
    assert "did not stop within" in proc.stderr
    assert elapsed < 30  # not the 60 s subprocess limit: the watchdog ended it
