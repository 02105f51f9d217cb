"""KV events from a real `slotserve serve` (tiny fixture model) to a ZMQ subscriber on loopback.

The subscriber binds, the server connects (`--kv-events-endpoint tcp://127.0.0.1:PORT`), and a
random mix of multi-turn requests, concurrent requests and streams cancelled mid-way runs
against 3 slots (so slots are rewound, copied and overwritten). Afterwards the block forest the
subscriber rebuilt from the raw frames must agree with GET /slots: a chain reaching exactly each
slot's depth (tokens // block size), no chain deeper than any slot, every leaf owned by a slot of
that depth, and an unbroken sequence of batches.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import msgpack
import pytest
from process_support import free_port, serve_command, wait_http_ready

pytestmark = pytest.mark.slow

BLOCK = 4
SLOTS = 3


class Forest:
    """Live blocks with parent links and depths, rebuilt from BlockStored/BlockRemoved/AllBlocksCleared."""

    def __init__(self) -> None:
        self.parent: dict[int, int | None] = {}
        self.depth: dict[int, int] = {}
        self.batches: list[int] = []

    def apply(self, frames: list[bytes]) -> None:
        self.batches.append(int.from_bytes(frames[1], "big"))
        ts, events, *_ = msgpack.unpackb(frames[2])
        for ev in events:
            if ev[0] == "AllBlocksCleared":
                self.parent.clear()
                self.depth.clear()
            elif ev[0] == "BlockStored":
                _, hashes, parent, token_ids, block_size, _lora, _medium = ev
                assert block_size == BLOCK and len(token_ids) == BLOCK * len(hashes)
                d = 0 if parent is None else self.depth[parent]  # KeyError: parent not live
                for h in hashes:
                    assert h not in self.parent, "stored twice"
                    self.parent[h], self.depth[h] = parent, d + 1
                    parent, d = h, d + 1
            elif ev[0] == "BlockRemoved":
                for h in ev[1]:
                    del self.parent[h]  # KeyError: removed but not live
                    del self.depth[h]
            else:
                raise AssertionError(f"unknown event {ev[0]!r}")

    def leaves(self) -> list[int]:
        parents = {p for p in self.parent.values() if p is not None}
        return [h for h in self.parent if h not in parents]

    def check_against(self, slot_depths: list[int]) -> str | None:
        """None when the forest is consistent with the slots' depths, else what is wrong."""
        live_depths = collections.Counter(self.depth.values())
        for d in {d for d in slot_depths if d > 0}:
            if live_depths[d] == 0:
                return f"no live block at depth {d} (a slot holds {d} full blocks)"
        if self.depth and max(self.depth.values()) > max(slot_depths, default=0):
            return f"a chain of depth {max(self.depth.values())} outlives every slot ({slot_depths})"
        for k, n in live_depths.items():
            if n > sum(1 for d in slot_depths if d >= k):
                return f"{n} live blocks at depth {k}, but only {sum(1 for d in slot_depths if d >= k)} slots that deep"
        available = collections.Counter(slot_depths)
        for leaf in self.leaves():
            d = self.depth[leaf]
            if available[d] == 0:
                return f"a leaf at depth {d} that no slot holds ({slot_depths})"
            available[d] -= 1
        return None


def test_live_server_events_match_slots(tiny_model_path, tmp_path):
    zmq = pytest.importorskip("zmq")
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    zport = sub.bind_to_random_port("tcp://127.0.0.1")
    frames: list[list[bytes]] = []
    stop = threading.Event()

    def receive() -> None:
        while not stop.is_set():
            if sub.poll(20):
                frames.append(sub.recv_multipart())

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            serve_command(
                tiny_model_path,
                port,
                "--batched-session",
                str(SLOTS),
                "--ctx-size",
                "512",
                "--threads",
                "1",
                "--kv-events-endpoint",
                f"tcp://127.0.0.1:{zport}",
                "--kv-events-topic",
                "kv@127.0.0.1@tiny",
                "--kv-events-block-size",
                str(BLOCK),
                "--log-level",
                "warning",
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        wait_http_ready(server, f"{url}/ready", what="slotserve serve", log=log, timeout_s=90)
        model = httpx.get(f"{url}/v1/models", timeout=5).json()["data"][0]["id"]

        rng = random.Random(7)
        words = ["amber", "birch", "cedar", "delta", "ember"]
        histories = {w: [{"role": "user", "content": f"{w} {w}: tell me about {w}."}] for w in words}
        locks = {w: threading.Lock() for w in words}

        def one(i: int) -> str:
            w = rng.choice(words)
            with locks[w], httpx.Client(base_url=url, timeout=60) as client:
                messages = histories[w]
                body = {
                    "model": model,
                    "messages": messages,
                    "max_tokens": rng.randint(2, 12),
                    "temperature": 0,
                }
                if rng.random() < 0.35:  # a stream the client abandons after a chunk or two
                    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                        assert r.status_code == 200
                        for n, _ in enumerate(r.iter_lines()):
                            if n >= rng.randint(1, 3):
                                break
                    return "cancelled"
                r = client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                messages.append(
                    {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}
                )
                messages.append({"role": "user", "content": f"more about {w}, part {i}"})
                return "ok"

        with ThreadPoolExecutor(max_workers=3) as pool:
            outcomes = collections.Counter(pool.map(one, range(40)))
        assert outcomes["cancelled"] >= 5 and outcomes["ok"] >= 10, outcomes

        # settle: no slot busy, then the subscriber's view must match /slots
        problem: str | None = "not checked"
        deadline = time.monotonic() + 15
        while problem is not None and time.monotonic() < deadline:
            views = httpx.get(f"{url}/slots", timeout=5).json()["data"]
            if any(v["state"] in ("prefill", "decode") for v in views):
                time.sleep(0.1)
                continue
            time.sleep(0.3)  # events of the last engine call are on their way
            forest = Forest()
            for f in list(frames):
                forest.apply(f)
            problem = forest.check_against([v["num_tokens"] // BLOCK for v in views])
        assert problem is None, problem
        assert {f[0] for f in frames} == {b"kv@127.0.0.1@tiny"}
        assert forest.batches == list(range(forest.batches[0], forest.batches[0] + len(forest.batches)))
        assert len(forest.parent) >= max(v["num_tokens"] for v in views) // BLOCK > 0
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=5)
        stop.set()
        receiver.join()
        sub.close()
        ctx.term()
