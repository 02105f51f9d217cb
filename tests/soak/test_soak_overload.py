"""Overload: three times more clients than slots + queue, for --soak-seconds. Every answer is a
200 or a 429 with Retry-After (never a 5xx), and the server's resident memory stays flat:
after a warm-up (long enough to fill the checkpoint store's budget), no sample is more than 10%
above the smallest."""

from __future__ import annotations

import asyncio
import collections
import random
import time
from pathlib import Path

import httpx
import pytest
from soak_support import RSSSampler, fake_server, scrape, tail, wait_idle

pytestmark = pytest.mark.soak

MAX_REQUESTS = 20000
SLOTS, QUEUE = 2, 4
CLIENTS = 3 * (SLOTS + QUEUE)
CHECKPOINT_MB = 4
RSS_TOLERANCE = 1.10  # "flat": the largest sample after warm-up within 10% of the smallest


async def overload(url: str, seconds: float, seed: int) -> collections.Counter:
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    seen: collections.Counter = collections.Counter()
    started = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal started
        while time.monotonic() < deadline and started < MAX_REQUESTS:
            started += 1
            words = " ".join(rng.choice(["one", "two", "three"]) for _ in range(rng.randint(5, 300)))
            payload = {
                "messages": [{"role": "user", "content": words}],
                "max_tokens": rng.randint(1, 24),
                "temperature": 0.8,
                "stream": rng.random() < 0.5,
            }
            r = await client.post("/v1/chat/completions", json=payload)
            seen[r.status_code] += 1
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["code"] == "queue_full"
                await asyncio.sleep(0.01)  # a client that backs off a little (not Retry-After)

    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
        await asyncio.gather(*(worker(client) for _ in range(CLIENTS)))
    return seen


async def test_overload_is_answered_429_and_memory_stays_flat(soak_seconds: float, tmp_path: Path) -> None:
    # NOTE: the checkpoint store grows until its budget is full (256 MB or more by default) and is flat
    # from then on; a small budget makes "after warm-up" a few seconds, not minutes.
    runtime = {"num_slots": SLOTS, "ctx_len": 2048, "max_queue": QUEUE, "checkpoint_memory_mb": CHECKPOINT_MB}
    with fake_server(tmp_path, runtime=runtime, config={"max_tokens_limit": 64}, step_s=0.001) as server:
        with RSSSampler(server.proc.pid) as rss:
            warm = await overload(server.url, max(1.0, soak_seconds / 2), seed=1)  # warm-up
            measured_from = time.monotonic()
            seen = await overload(server.url, soak_seconds, seed=2)
        wait_idle(server.url)
        m = scrape(server.url)
        rc = server.stop()
    after = rss.after(measured_from)
    lo, hi = min(after), max(after)
    print(
        f"\nsoak overload: {soak_seconds:g} s after {max(1.0, soak_seconds / 2):g} s warm-up, {CLIENTS} clients, "
        f"{SLOTS} slots + queue {QUEUE}: {dict(seen)} (warm-up {dict(warm)}); RSS {lo / 2**20:.1f}..{hi / 2**20:.1f} MiB "
        f"over {len(after)} samples ({(hi / lo - 1) * 100:.1f}% spread), at start {rss.samples[0][1] / 2**20:.1f} MiB"
    )
    assert rc == 0, tail(server)
    assert set(seen) <= {200, 429} and seen[429] > 0 and seen[200] > 0, seen
    assert m['slotserve_requests_total{outcome="rejected",stage="scheduler"}'] >= seen[429]
    assert len(after) >= 5
    assert hi <= RSS_TOLERANCE * lo, f"RSS grew from {lo} to {hi} bytes under steady overload"
