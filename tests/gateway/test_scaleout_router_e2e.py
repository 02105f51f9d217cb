"""slotserve replicas behind the SGLang Model Gateway (`sglang-router`), end to end on loopback.

Two `slotserve serve` replicas on the tiny fixture model, the router in front, multi-turn
conversations replayed through the router, twice: with `--policy cache_aware` every later turn
must land where the conversation lives (the replica reuses at least the whole previous prompt),
with `--policy round_robin` on the same traffic they must not. Both reuse ratios are printed
(`pytest -s`) and asserted apart.

Each run starts fresh replicas and a fresh router; every subprocess is killed in `finally`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from process_support import free_port, serve_command, wait_http_ready

pytestmark = [pytest.mark.router, pytest.mark.slow]

NUM_REPLICAS = 2
SLOTS = 6  # more than the conversations: a replica never evicts one, whatever the router does
# Five conversations (odd, so round robin moves every conversation to the other replica each
# turn), each opened by a distinct word so no two share a first block or a text prefix.
OPENERS = ("Amsterdam", "Budapest", "Copenhagen", "Dubrovnik", "Edinburgh")
TURNS = 3
MAX_TOKENS = 6


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, n: int = 30) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return f"--- {self.name} ---\n" + "\n".join(lines[-n:])


def spawn(name: str, argv: list[str], log_dir: Path) -> Proc:
    log = log_dir / f"{name}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    return Proc(name, popen, log)


def stop(procs: list[Proc]) -> None:
    for p in procs:
        if p.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGKILL)
            p.popen.wait(timeout=5)


def wait_until(check, what: str, procs: list[Proc], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        for p in procs:
            if p.popen.poll() is not None:
                raise AssertionError(
                    f"{p.name} exited with {p.popen.returncode} while waiting for {what}\n{p.tail()}"
                )
        with contextlib.suppress(httpx.HTTPError):
            if check():
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n" + "\n".join(p.tail() for p in procs))
        time.sleep(0.2)


@contextlib.contextmanager
def cluster(model: Path, policy: str, log_dir: Path) -> Iterator[tuple[str, list[str]]]:
    """Start the replicas and the router; yield (router URL, replica URLs); kill everything after."""
    procs: list[Proc] = []
    try:
        urls = []
        for i in range(NUM_REPLICAS):
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            procs.append(
                spawn(
                    f"{policy}-replica{i}",
                    serve_command(
                        model,
                        port,
                        "--batched-session",
                        str(SLOTS),
                        "--ctx-size",
                        "1024",
                        "--threads",
                        "1",
                        "--log-level",
                        "warning",
                    ),  # fmt: skip
                    log_dir,
                )
            )
        for url, replica in zip(urls, procs, strict=True):
            wait_http_ready(replica.popen, f"{url}/ready", what=replica.name, log=replica.log, timeout_s=90)
        router_port = free_port()
        router = f"http://127.0.0.1:{router_port}"
        procs.append(
            spawn(
                f"{policy}-router",
                [
                    sys.executable,
                    "-m",
                    "sglang_router.launch_router",
                    "--worker-urls",
                    *urls,
                    "--policy",
                    policy,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(router_port),
                    "--prometheus-host",
                    "127.0.0.1",
                    "--prometheus-port",
                    str(free_port()),
                    "--log-level",
                    "warn",
                ],
                log_dir,
            )
        )

        def all_registered() -> bool:
            workers = httpx.get(f"{router}/workers", timeout=2).json().get("workers", [])
            return len(workers) == NUM_REPLICAS and all(w.get("is_healthy") for w in workers)

        wait_until(all_registered, "the router to register every replica", procs)
        yield router, urls
    except BaseException:
        print("\n".join(p.tail() for p in procs))
        raise
    finally:
        stop(procs)


@dataclass
class Turn:
    conversation: int
    turn: int
    prompt_tokens: int
    cached_tokens: int


def replay(router: str, model: str) -> list[Turn]:
    """Turn t of every conversation, then turn t+1 of every conversation, ..., through the router."""
    histories = [
        [{"role": "user", "content": f"{word} is a city. Tell me one fact about {word}, in a few words."}]
        for word in OPENERS
    ]
    out = []
    with httpx.Client(base_url=router, timeout=60) as client:
        for t in range(TURNS):
            for c, messages in enumerate(histories):
                r = client.post(
                    "/v1/chat/completions",
                    json={
                        "model": model,
                        "messages": messages,
                        "max_tokens": MAX_TOKENS,
                        "temperature": 0,
                    },
                )
                assert r.status_code == 200, r.text
                body = r.json()
                usage = body["usage"]
                out.append(
                    Turn(c, t, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"])
                )
                messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
                messages.append({"role": "user", "content": f"And another fact, number {t + 2}?"})
    return out


def summarize(turns: list[Turn]) -> tuple[float, int, int]:
    """(reuse ratio of turns >= 2, turns >= 2 kept home, turns >= 2)."""
    prev = {(x.conversation, x.turn): x for x in turns}
    later = [x for x in turns if x.turn > 0]
    home = sum(1 for x in later if x.cached_tokens >= prev[(x.conversation, x.turn - 1)].prompt_tokens)
    ratio = sum(x.cached_tokens for x in later) / sum(x.prompt_tokens for x in later)
    return ratio, home, len(later)


@pytest.fixture(scope="module")
def router_available() -> None:
    pytest.importorskip("sglang_router", reason="install the test extra: pip install -e '.[test]'")


def test_cache_aware_router_keeps_conversations_on_their_replica(tiny_model_path, tmp_path, router_available):
    results = {}
    for policy in ("cache_aware", "round_robin"):
        with cluster(tiny_model_path, policy, tmp_path) as (router, urls):
            model = httpx.get(f"{urls[0]}/v1/models", timeout=5).json()["data"][0]["id"]
            turns = replay(router, model)
            print(
                f"\n{policy} (conversation, turn, prompt_tokens, cached_tokens):",
                [(x.conversation, x.turn, x.prompt_tokens, x.cached_tokens) for x in turns],
            )
            # the worker endpoints the router reads at registration answer as it expects, and
            # it registered each replica under the served model name
            for url in urls:
                info = httpx.get(f"{url}/model_info", timeout=5)
                assert info.status_code == 200 and info.json()["is_generation"] is True
                assert httpx.get(f"{url}/server_info", timeout=5).json()["dp_size"] == 1
            workers = httpx.get(f"{router}/workers", timeout=5).json()["workers"]
            assert {w["model_id"] for w in workers} == {model}
        results[policy] = (turns, *summarize(turns))
    aware_turns, aware_ratio, aware_home, n_later = results["cache_aware"]
    rr_turns, rr_ratio, rr_home, _ = results["round_robin"]
    print(
        f"\nreuse ratio on turns >= 2: cache_aware {aware_ratio:.1%} ({aware_home}/{n_later} kept home), "
        f"round_robin {rr_ratio:.1%} ({rr_home}/{n_later} kept home)"
    )
    assert n_later == len(OPENERS) * (TURNS - 1)
    # cache-aware: every later turn reached the replica holding its conversation
    assert all(x.cached_tokens > 0 for x in aware_turns if x.turn > 0)
    assert aware_home == n_later
    # round robin, same traffic: conversations alternate between the replicas, so no later turn
    # finds its previous prompt (at most an older turn's, or the chat template's first tokens:
    # cached_tokens > 0 alone would not tell the policies apart)
    assert rr_home == 0
    assert aware_ratio > rr_ratio + 0.2
    # the two runs saw the same prompts
    assert [x.prompt_tokens for x in aware_turns if x.turn == 0] == [
        x.prompt_tokens for x in rr_turns if x.turn == 0
    ]
