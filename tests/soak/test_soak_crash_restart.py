"""kill -9 while checkpoints are being written, then restart on the same --kv-disk-dir: every
checkpoint file left is whole (or removed), a file damaged on disk is dropped instead of used,
and the restarted server's greedy answers, restored from disk, equal a cold server's.

The server is the real `slotserve serve` on the tiny fixture model, and on the tiny qwen35 one
(recurrent state: a slot is restored only from a checkpoint at its own length); in the first run
its fsync sleeps 0.25 s, so writes are slow enough to be caught mid-way (the test asserts it
caught one).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from slotserve.bench.loadtest.oracle import common_prefix_len
from soak_support import ServerProcess, check_file, file_tokens, model_dir, scrape, start_serve, tail

pytestmark = pytest.mark.soak

SLOW_DISK = """
import os, time
_fsync = os.fsync
def _slow_fsync(fd):
    time.sleep(0.25)
    _fsync(fd)
os.fsync = _slow_fsync
"""
NUM_PROMPTS = 6
MAX_CYCLES = 8


def systems(cycle: int) -> list[str]:
    """Distinct system prompts (each a `hint` checkpoint of ~150 tokens, written to disk)."""
    return [
        f"System {cycle}-{i}: " + f"you answer in the style of voice number {i}. " * 4
        for i in range(NUM_PROMPTS)
    ]


def chat(server: ServerProcess, system: str) -> dict:
    body = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Go on."}],
        "max_tokens": 6,
        "temperature": 0,
    }
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()


def serve_args(model: Path, disk: Path, *extra: str) -> list[str]:
    return [
        "--model", str(model), "--parallel", "1", "--ctx-size", "512", "--log-level", "info",
        "--kv-disk-dir", str(disk), "--kv-disk-space-mb", "64", "--checkpoint-memory-mb", "0", *extra,
    ]  # fmt: skip


def crash_while_writing(model: Path, disk: Path, log: Path, cycle: int) -> tuple[int, int]:
    """Run a slow-disk server, send the prompts, kill -9 it once it wrote >= 3 files whole and one
    is being written. Returns (files it wrote whole, temporary files) at the moment of the kill."""
    before = len(list(disk.glob("*/*.kvc"))) if disk.exists() else 0  # from earlier cycles
    server = start_serve(log, serve_args(model, disk), python_prelude=SLOW_DISK)
    seen: dict[str, int] = {}

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and server.proc.poll() is None:
            files = [p.name for d in disk.iterdir() if d.is_dir() for p in d.iterdir()]
            tmp = sum(n.endswith(".tmp") for n in files)
            whole = sum(n.endswith(".kvc") for n in files) - before
            if tmp and whole >= 3:
                os.kill(server.proc.pid, signal.SIGKILL)
                seen.update(whole=whole, tmp=tmp)
                return
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for system in systems(cycle):
            if server.proc.poll() is not None:
                break
            try:
                chat(server, system)
            except httpx.HTTPError:
                break  # killed mid-request
        watcher.join(60)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        server.proc.wait()
    assert server.proc.returncode == -signal.SIGKILL, tail(server)
    return seen.get("whole", 0), seen.get("tmp", 0)


@pytest.fixture(params=["llama", "qwen35", "granitehybrid"])
def model_path(request: pytest.FixtureRequest) -> Path:
    """The tiny full-KV fixture, and the tiny qwen35 and granitehybrid ones (recurrent state:
    slots restored only from checkpoints at their own length)."""
    if request.param in ("qwen35", "granitehybrid"):
        factory = "qwen35_model_factory" if request.param == "qwen35" else "granite_model_factory"
        path: Path = request.getfixturevalue(factory)("Q8_0")
        return path
    path = request.getfixturevalue("tiny_model_path")
    return path


def test_kill_9_during_checkpoint_writes_then_restart_warm_equals_cold(
    model_path: Path, tmp_path: Path, soak_seconds: float
) -> None:
    tiny_model_path = model_path
    disk, log = tmp_path / "kv", tmp_path / "server.log"
    cycles = max(1, min(MAX_CYCLES, int(soak_seconds // 4)))
    caught = []
    for cycle in range(cycles):
        caught.append(crash_while_writing(tiny_model_path, disk, log, cycle))
        for path in model_dir(disk).glob("*.kvc"):
            check_file(path)  # the rename is atomic: a killed write leaves only a temporary file
    assert all(whole >= 3 and tmp >= 1 for whole, tmp in caught), caught

    # cold answers, and each prompt's token ids (to know which file holds which prompt)
    prompts = [s for c in range(cycles) for s in systems(c)]
    cold_server = start_serve(
        log, ["--model", str(tiny_model_path), "--parallel", "1", "--ctx-size", "512", "--no-reuse"]
    )
    try:
        cold = [chat(cold_server, s) for s in prompts]
        ids = [
            httpx.post(
                cold_server.url + "/tokenize",
                json={"messages": [{"role": "system", "content": s}, {"role": "user", "content": "Go on."}]},
                timeout=30,
                trust_env=False,
            ).json()["tokens"]
            for s in prompts
        ]
    finally:
        cold_server.stop()

    # which prompt each whole file serves; damage every file of one prompt (as a bad sector
    # would): its request must drop them and prefill cold, while the others restore from disk
    owner: dict[Path, int] = {}
    file_tokens_of: dict[Path, list[int]] = {}
    for path in model_dir(disk).glob("*.kvc"):
        toks = file_tokens_of[path] = file_tokens(path)
        owner[path] = max(range(len(prompts)), key=lambda i: common_prefix_len(toks, ids[i]))
    damaged_prompt = min(owner.values())
    assert len(set(owner.values())) >= 2, "need files of two prompts: one damaged, one intact"
    damaged = [p for p, i in owner.items() if i == damaged_prompt]
    for path in damaged:
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))

    server = start_serve(log, serve_args(tiny_model_path, disk))
    try:
        deadline = time.monotonic() + 30
        while scrape(server.url)['slotserve_checkpoint_stored_bytes{tier="disk"}'] == 0:
            assert time.monotonic() < deadline, "the disk index was not rebuilt"
            time.sleep(0.05)
        assert not list(model_dir(disk).glob(".*.tmp")), "temporary files of the killed writer remain"
        order = [damaged_prompt] + [i for i in sorted(set(owner.values())) if i != damaged_prompt]
        order += [i for i in range(len(prompts)) if i not in order]
        warm = {i: chat(server, prompts[i]) for i in order}
        m = scrape(server.url)
    finally:
        rc = server.stop()
    assert rc == 0, tail(server)
    sources = {i: w["slotserve"]["reuse_source"] for i, w in warm.items()}
    print(
        f"\nsoak crash-restart: {cycles} kill -9 cycles, caught (whole, tmp) files {caught}; "
        f"{len(damaged)} files damaged; prompts with files {sorted(set(owner.values()))}; warm sources {[sources[i] for i in order]}"
    )
    for i, c in enumerate(cold):
        assert warm[i]["choices"][0]["message"]["content"] == c["choices"][0]["message"]["content"], i
    assert sources[damaged_prompt] != "checkpoint_disk"
    assert any(sources[i] == "checkpoint_disk" for i in set(owner.values()) - {damaged_prompt})
    assert m['slotserve_checkpoints_total{event="drop",rule="unknown",tier="disk"}'] >= 1
    # the damaged file its request matched (the longest common prefix with its prompt: the
    # system-prompt hint, or a longer file that starts with it, since a file replaces the files
    # that are prefixes of it) was removed, or written again whole by that request's own capture.
    # With recurrent state a file can only be restored at its own length, so the request only
    # ever reads the files that are a prefix of its prompt less its last token: those count.
    prompt = ids[damaged_prompt]
    usable = [
        p
        for p in damaged
        if not any(kind in model_path.name for kind in ("qwen35", "granite"))  # the recurrent fixtures
        or common_prefix_len(file_tokens_of[p], prompt) == len(file_tokens_of[p]) < len(prompt)
    ]
    matched = max(usable, key=lambda p: common_prefix_len(file_tokens_of[p], prompt))
    assert common_prefix_len(file_tokens_of[matched], ids[damaged_prompt]) >= 100  # the system turn
    if matched.exists():
        check_file(matched)
