"""Cancel storm: for --soak-seconds, clients abandon streams after a few chunks, give up on
plain requests, leave in the middle of their bodies, or run to the end, all at once. Afterwards
every slot is idle, every level gauge reads zero, the cancels were acknowledged and counted, and
the server answers a greedy request exactly as a cold server does. Run over full KV and over
recurrent state (FakeSlotPool(recurrent=True): slots that can only be extended or restored), and
over the real engine with recurrent state (`slotserve serve` on the tiny qwen35 and granitehybrid
fixtures); each
of full KV, the fake recurrent state and qwen35 also with speculative drafts verified in its
steps (the recurrent ones cut back through a rollback ring)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_support import make_runtime, running_app, serve_config
from slotserve.gateway.app import create_app
from soak_support import ServerProcess, fake_server, scrape, start_serve, tail, wait_idle

pytestmark = pytest.mark.soak

MAX_REQUESTS = 3000  # the count bound beside the time bound
CLIENTS = 12
PROBE = {
    "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "probe " * 20},
    ],
    "max_tokens": 12,
    "temperature": 0,
}


def body(rng: random.Random, stream: bool) -> dict:
    words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(rng.randint(5, 120)))
    return {
        "messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": words}],
        "max_tokens": rng.randint(4, 48),
        "temperature": rng.choice([0, 0.7]),
        "seed": rng.randint(0, 1000),
        "stream": stream,
    }


async def abandon_stream(client: httpx.AsyncClient, rng: random.Random) -> str:
    chunks = rng.randint(0, 6)
    async with client.stream("POST", "/v1/chat/completions", json=body(rng, True)) as r:
        if r.status_code != 200:
            return f"status {r.status_code}"
        seen = 0
        async for _ in r.aiter_lines():
            seen += 1
            if seen > chunks:
                return "abandoned stream"  # leaving the block closes the connection
    return "finished stream"


async def give_up(client: httpx.AsyncClient, rng: random.Random) -> str:
    # the whole body is sent (connect and write have the client's 30 s): only the wait for the
    # answer is cut short. The server may still see this client leave during its body: the
    # handler reads a body already received only when it runs, and a disconnect comes first.
    timeout = httpx.Timeout(30.0, read=rng.uniform(0.002, 0.05))
    try:
        r = await client.post("/v1/chat/completions", json=body(rng, False), timeout=timeout)
    except httpx.TimeoutException:
        return "gave up"
    return f"status {r.status_code}"


async def finish(client: httpx.AsyncClient, rng: random.Random) -> str:
    async with client.stream("POST", "/v1/chat/completions", json=body(rng, True)) as r:
        lines = [line async for line in r.aiter_lines() if line]
    if r.status_code != 200:
        return f"status {r.status_code}"
    assert lines[-1] == "data: [DONE]", lines[-3:]
    return "finished stream"


def leave_mid_body(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 200\r\n\r\n" + b'{"messages": ['
        )
    return "left mid-body"


async def storm(url: str, port: int, seconds: float, seed: int) -> collections.Counter:
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    seen: collections.Counter = collections.Counter()
    started = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal started
        while time.monotonic() < deadline and started < MAX_REQUESTS:
            started += 1
            action = rng.choices(["abandon", "give_up", "finish", "mid_body"], weights=[5, 3, 2, 1])[0]
            if action == "abandon":
                seen[await abandon_stream(client, rng)] += 1
            elif action == "give_up":
                seen[await give_up(client, rng)] += 1
            elif action == "finish":
                seen[await finish(client, rng)] += 1
            else:
                seen[await asyncio.to_thread(leave_mid_body, port)] += 1

    async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as client:
        await asyncio.gather(*(worker(client) for _ in range(CLIENTS)))
    return seen


async def cold_answer(pool_options: dict, model: Path | None, tmp_path: Path) -> str:
    if model is not None:  # the real engine: a server without reuse
        server = start_serve(tmp_path / "cold.log", serve_argv(model, "--parallel", "1", "--no-reuse"))
        try:
            r = httpx.post(server.url + "/v1/chat/completions", json=PROBE, timeout=60, trust_env=False)
        finally:
            server.stop()
        return str(r.json()["choices"][0]["message"]["content"])
    runtime, _ = make_runtime(num_slots=1, reuse=False, pool_options=pool_options)
    async with running_app(create_app(runtime, serve_config())) as client:
        r2 = await client.post("/v1/chat/completions", json=PROBE)
    return str(r2.json()["choices"][0]["message"]["content"])


def serve_argv(model: Path, *extra: str) -> list[str]:
    return [
        "--model",
        str(model),
        "--ctx-size",
        "1024",
        "--max-tokens-limit",
        "64",
        "--log-level",
        "warning",
        *extra,
    ]


@contextlib.contextmanager
def storm_server(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[ServerProcess, Path | None]]:
    """The fake engine (full KV or recurrent) in a server process, or `slotserve serve` on the
    tiny qwen35 or granitehybrid fixture (recurrent state on the real engine), 3 slots, queue 16."""
    if kind.startswith(("qwen35", "granitehybrid")):
        factory = "granite_model_factory" if kind.startswith("granitehybrid") else "qwen35_model_factory"
        model: Path = request.getfixturevalue(factory)("Q8_0")
        spec = ("--speculative", "ngram") if kind.endswith("speculative") else ()
        server = start_serve(
            tmp_path / "serve.log", serve_argv(model, "--parallel", "3", "--max-queue", "16", *spec)
        )
        try:
            yield server, model
        finally:
            if server.proc.poll() is None:
                server.proc.kill()
                server.proc.wait()
        return
    runtime = {"num_slots": 3, "ctx_len": 1024, "max_queue": 16, "pool_options": POOLS[kind]}
    if kind.startswith(
        "speculative"
    ):  # drafts verified in every step: cancels land between draft and verification
        runtime.update(draft_max=6, spec_cost_gate=False)
    with fake_server(tmp_path, runtime=runtime, config={"max_tokens_limit": 64}, step_s=0.002) as server:
        yield server, None


# speculative: a fake pool whose output copies its prompt (an induction head), drafting on
POOLS = {
    "kv": {},
    "recurrent": {"recurrent": True},
    "qwen35": {"recurrent": True},
    "granitehybrid": {"recurrent": True},  # Mamba2 state
    # drafts on the real engine's recurrent state: its pool keeps --draft-max + 1 = 9 states
    "qwen35-speculative": {"recurrent": True, "rollback": 9},
    "speculative": {"copy_bias": 12.0},
    # the same on a recurrent state, whose rejected rows are cut back through its rollback ring
    "speculative-recurrent": {"copy_bias": 12.0, "recurrent": True, "rollback": 7},
}


@pytest.mark.parametrize("kind", sorted(POOLS))
async def test_cancel_storm_leaves_every_slot_idle_and_gauges_at_zero(
    soak_seconds: float, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    pool_options = POOLS[kind]
    with storm_server(kind, tmp_path, request) as (server, model):
        seen = await storm(server.url, server.port, soak_seconds, seed=14)
        m = wait_idle(server.url)
        mid_body = 'slotserve_requests_total{outcome="cancelled",stage="gateway"}'
        deadline = time.monotonic() + 10  # a closed socket is noticed by the server a little later
        while m[mid_body] < seen["left mid-body"] and time.monotonic() < deadline:
            time.sleep(0.05)
            m = scrape(server.url)
        slots = httpx.get(server.url + "/slots", timeout=10).json()["data"]
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            warm = (await client.post("/v1/chat/completions", json=PROBE)).json()["choices"][0]["message"][
                "content"
            ]
            again = (await client.post("/v1/chat/completions", json=PROBE)).json()  # reuses the first
        after = scrape(server.url)
        rc = server.stop()
    total = sum(seen.values())
    print(f"\nsoak cancel-storm: {soak_seconds:g} s, {total} requests {dict(seen)}")
    assert rc == 0, tail(server)
    assert seen["abandoned stream"] + seen["gave up"] > 0 and seen["finished stream"] > 0
    assert all(s["request_id"] is None and s["state"] in ("idle", "empty") for s in slots), slots
    assert m["slotserve_running_requests"] == 0 and m["slotserve_queue_depth"] == 0
    assert m['slotserve_slots{state="prefill"}'] == 0 and m['slotserve_slots{state="decode"}'] == 0
    cancels = sum(v for k, v in m.items() if k.startswith("slotserve_cancels_total"))
    assert cancels > 0
    scheduler_cancelled = m['slotserve_requests_total{outcome="cancelled",stage="scheduler"}']
    assert scheduler_cancelled == cancels  # every cancel acknowledged once, and counted once
    # every client that left during its body, and those giving up whose close the server saw
    # before its handler read the body they had sent (it never reached the scheduler)
    assert seen["left mid-body"] <= m[mid_body] <= seen["left mid-body"] + seen["gave up"]
    assert after['slotserve_requests_total{outcome="error",stage="scheduler"}'] == 0
    assert after['slotserve_requests_total{outcome="error",stage="gateway"}'] == 0
    assert warm == await cold_answer(pool_options, model, tmp_path)  # no slot was left corrupted
    if kind.startswith("speculative"):  # (the cold answer drafted nothing)
        assert m["slotserve_spec_drafted_tokens_total"] > 0 and m["slotserve_spec_accepted_tokens_total"] > 0
    if kind == "qwen35-speculative":  # (random weights: drafts are seldom right, but they are verified)
        assert m["slotserve_spec_drafted_tokens_total"] > 0
    assert again["choices"][0]["message"]["content"] == warm
    # a resend: rewound (full KV, or a rollback ring that reaches back past the answer), or
    # restored from the prompt_end checkpoint at L - 1 (recurrent)
    reused = (again["slotserve"]["reuse_source"], again["slotserve"]["prefilled_tokens"])
    sources = ("checkpoint_memory", "rewind") if pool_options.get("rollback") else ("rewind",)
    if pool_options.get("recurrent") and not pool_options.get("rollback"):
        sources = ("checkpoint_memory",)
    assert reused[0] in sources and reused[1] == 1, reused
    text = server.log.read_text()
    assert "Traceback" not in text and "ERROR" not in text, text[-3000:]
