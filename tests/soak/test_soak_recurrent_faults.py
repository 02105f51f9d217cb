"""kill -9 and damaged checkpoints with recurrent state (FakeSlotPool(recurrent=True) behind
the real gateway and scheduler, in its own process): a recurrent slot can only be restored
from a checkpoint, so the disk tier is all a restart has. Kill the server while its checkpoints
are being written (slow fsync), damage every file of one prompt, restart on the same
--kv-disk-dir: every file left is whole, the damaged ones are dropped, the intact ones restore,
and every greedy answer equals a cold server's."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from gateway_support import make_runtime, running_app, serve_config
from slotserve.bench.loadtest.oracle import common_prefix_len
from slotserve.gateway.app import create_app
from soak_support import ServerProcess, check_file, fake_server, file_tokens, model_dir, scrape, tail

pytestmark = pytest.mark.soak

POOL = {"recurrent": True, "state_bytes": 4096}
NUM_PROMPTS = 5
MAX_CYCLES = 4


def messages(cycle: int, i: int) -> list[dict]:
    system = f"System {cycle}-{i}: " + f"you answer in the style of voice number {i}. " * 3
    return [{"role": "system", "content": system}, {"role": "user", "content": "Go on."}]


def runtime_spec(disk: Path, **kw) -> dict:
    return {
        "num_slots": 1,
        "ctx_len": 1024,
        "pool_options": POOL,
        "kv_disk_dir": str(disk),
        "kv_disk_space_mb": 64,
        "checkpoint_memory_mb": 0,
        **kw,
    }


def chat(url: str, msgs: list[dict]) -> dict:
    body = {"messages": msgs, "max_tokens": 6, "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()


def crash_while_writing(server: ServerProcess, disk: Path, cycle: int) -> tuple[int, int]:
    """Send the cycle's prompts; kill -9 the server once >= 3 files are whole and one is being
    written. Returns (files written whole this cycle, temporary files) at the kill."""
    before = len(list(disk.glob("*/*.kvc"))) if disk.exists() else 0
    seen: dict[str, int] = {}

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and server.proc.poll() is None:
            files = (
                [p.name for d in disk.iterdir() if d.is_dir() for p in d.iterdir()] if disk.exists() else []
            )
            tmp = sum(n.endswith(".tmp") for n in files)
            whole = sum(n.endswith(".kvc") for n in files) - before
            if tmp and whole >= 3:
                os.kill(server.proc.pid, signal.SIGKILL)
                seen.update(whole=whole, tmp=tmp)
                return
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    for i in range(NUM_PROMPTS):
        if server.proc.poll() is not None:
            break
        try:
            chat(server.url, messages(cycle, i))
        except httpx.HTTPError:
            break  # killed mid-request
    watcher.join(60)
    server.proc.wait(30)
    assert server.proc.returncode == -signal.SIGKILL, tail(server)
    return seen.get("whole", 0), seen.get("tmp", 0)


async def test_kill_9_and_damaged_checkpoints_with_recurrent_state_warm_equals_cold(
    tmp_path: Path, soak_seconds: float
) -> None:
    disk = tmp_path / "kv"
    cycles = max(1, min(MAX_CYCLES, int(soak_seconds // 3)))
    caught = []
    for cycle in range(cycles):
        with fake_server(tmp_path, runtime=runtime_spec(disk), config={}, fsync_s=0.25) as server:
            caught.append(crash_while_writing(server, disk, cycle))
        for path in model_dir(disk).glob("*.kvc"):
            check_file(path)  # the rename is atomic: a killed write leaves only a temporary file
    assert all(whole >= 3 and tmp >= 1 for whole, tmp in caught), caught

    prompts = [messages(c, i) for c in range(cycles) for i in range(NUM_PROMPTS)]
    cold_rt, _ = make_runtime(num_slots=1, ctx_len=1024, reuse=False, pool_options=POOL)
    ids = [cold_rt.encode_chat(m)[0] for m in prompts]
    async with running_app(create_app(cold_rt, serve_config())) as client:
        cold = []
        for m in prompts:
            r = await client.post(
                "/v1/chat/completions", json={"messages": m, "max_tokens": 6, "temperature": 0}
            )
            cold.append(r.json()["choices"][0]["message"]["content"])

    # damage every file of one prompt (as a bad sector would): its request must drop them and
    # prefill cold, while the others restore from disk
    owner = {
        p: max(range(len(prompts)), key=lambda i: common_prefix_len(file_tokens(p), ids[i]))
        for p in model_dir(disk).glob("*.kvc")
    }
    assert len(set(owner.values())) >= 2, "need files of two prompts: one damaged, one intact"
    damaged_prompt = min(owner.values())
    for path in [p for p, i in owner.items() if i == damaged_prompt]:
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))

    with fake_server(tmp_path, runtime=runtime_spec(disk), config={}) as server:
        deadline = time.monotonic() + 30
        while scrape(server.url)['slotserve_checkpoint_stored_bytes{tier="disk"}'] == 0:
            assert time.monotonic() < deadline, "the disk index was not rebuilt"
            time.sleep(0.05)
        assert not list(model_dir(disk).glob(".*.tmp")), "temporary files of the killed writer remain"
        order = [damaged_prompt, *(i for i in range(len(prompts)) if i != damaged_prompt)]
        warm = {i: chat(server.url, prompts[i]) for i in order}
        m = scrape(server.url)
        rc = server.stop()
    assert rc == 0, tail(server)
    sources = {i: (w["slotserve"]["reuse_source"], w["slotserve"]["reused_tokens"]) for i, w in warm.items()}
    print(
        f"\nsoak recurrent faults: {cycles} kill -9 cycles, caught {caught}; sources {[sources[i] for i in order]}"
    )
    for i, c in enumerate(cold):
        assert warm[i]["choices"][0]["message"]["content"] == c, i
    assert sources[damaged_prompt][0] != "checkpoint_disk"
    restored = [i for i in set(owner.values()) - {damaged_prompt} if sources[i][0] == "checkpoint_disk"]
    assert restored, sources
    for i in restored:  # a recurrent checkpoint restores only at its own length: a whole file
        assert any(file_tokens(p) == ids[i][: sources[i][1]] for p in owner if p.exists()), i
    assert m['slotserve_checkpoints_total{event="drop",rule="unknown",tier="disk"}'] >= 1
