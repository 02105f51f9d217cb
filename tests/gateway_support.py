"""Stand-ins and helpers for the gateway tests: a byte tokenizer, a ChatML template, a Runtime
over `FakeSlotPool` + the real Scheduler, an ASGI driver for disconnects, a live uvicorn thread,
and a ScriptedScheduler whose exact replies pin tool calls and event sequences.

Byte tokenizer ids:  0..255 the bytes, 256 <|im_start|>, 257 <|im_end|> (eos), 258 <|endoftext|>.
With FakeSlotPool's pseudo-random logits the greedy output is arbitrary bytes, so UTF-8 hold-back
and U+FFFD handling are exercised by every test.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import threading
import time
import types
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import httpx
from process_support import free_port as free_port  # re-exported: the gateway tests import it from here
from slotserve.gateway.config import ServeConfig
from slotserve.gateway.runtime import Runtime
from slotserve.metrics import ServerMetrics
from slotserve.scheduler.config import SchedulerConfig
from slotserve.scheduler.fake_engine import FakeSlotPool
from slotserve.scheduler.request import (
    FinishEvent,
    FinishReason,
    GenerationRequest,
    PrefillProgress,
    ReuseInfo,
    ReuseSource,
    TokenEvent,
)
from slotserve.scheduler.scheduler import Scheduler

SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
IM_START, IM_END, ENDOFTEXT = 256, 257, 258
_SPECIAL_RE = re.compile("|".join(re.escape(s) for s in SPECIALS))


class ByteTokenizer:
    n_vocab = 259
    eos_token_ids = (IM_END,)
    add_bos_token = False
    token_bytes: list[bytes] = [bytes([b]) for b in range(256)] + [s.encode() for s in SPECIALS]

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        ids: list[int] = [ENDOFTEXT] if add_bos else []
        pos = 0
        for m in _SPECIAL_RE.finditer(text):
            ids.extend(text[pos : m.start()].encode())
            ids.append(256 + SPECIALS.index(m.group()))
            pos = m.end()
        ids.extend(text[pos:].encode())
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(self.token_bytes[i] for i in ids).decode("utf-8", errors="replace")


class ChatML:
    """The ChatML layout in plain Python (what the engine's jinja template renders)."""

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        if any(m["role"] not in ("system", "user", "assistant", "tool") for m in messages):
            raise ValueError("unsupported role")
        out = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return out + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def system_prefix(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None
    ) -> str | None:
        if messages and messages[0]["role"] == "system":
            return self.render(messages[:1], add_generation_prompt=False)
        return None


MODEL = "fake-model"


def make_runtime(
    *,
    num_slots: int = 2,
    ctx_len: int = 512,
    max_queue: int = 8,
    reuse: bool = True,
    metrics: ServerMetrics | None = None,
    timeout_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    pool_options: dict[str, Any] | None = None,
    **scheduler_config: Any,
) -> tuple[Runtime, FakeSlotPool]:
    """A Runtime over FakeSlotPool (segments of 64 tokens; `pool_options` go to it, e.g.
    recurrent=True); `timeout_s` is the scheduler's default per-request timeout, `clock` its time
    source; other keywords go to SchedulerConfig (e.g. kv_disk_dir)."""
    tok = ByteTokenizer()
    pool = FakeSlotPool(num_slots, ctx_len, n_vocab=tok.n_vocab, **(pool_options or {}))
    sched = Scheduler(
        pool,
        SchedulerConfig(
            max_queue=max_queue,
            reuse_enabled=reuse,
            segment_tokens=64,
            step_token_budget=64,
            default_timeout_s=timeout_s,
            **scheduler_config,
        ),
        token_bytes=tok.token_bytes,
        eos_token_ids=set(tok.eos_token_ids),
        stats_sink=metrics.sink if metrics is not None else None,
        clock=clock,
    )
    runtime = Runtime(
        scheduler=sched,
        tokenizer=tok,
        chat=ChatML(),
        model_names=(MODEL, "alias"),
        ctx_len=ctx_len,
        num_slots=num_slots,
        kv_bytes=pool.kv_bytes,
        kernel_variant="fake",
        turn_captures=pool.restored_min_truncate_len(ctx_len) > 0,
        model_path="fake.gguf",
        created=1700000000,
        extra={"pool": pool},
    )
    return runtime, pool


def serve_config(**overrides: Any) -> ServeConfig:
    base: dict[str, Any] = {"max_tokens_limit": 64, "default_max_tokens": 16}
    base.update(overrides)
    return ServeConfig(**base)


@contextlib.asynccontextmanager
async def running_app(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan and give an httpx client bound to it (no sockets)."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


def sse_events(body: str) -> list[Any]:
    """Parse an SSE body into JSON payloads (and the string "[DONE]"); asserts the framing."""
    assert body.endswith("\n\n"), body[-50:]
    events = []
    for block in body.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def chat_body(messages: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "temperature": 0, **extra}


class ASGIDriver:
    """Call the ASGI app directly with a receive() we control, to model a client leaving."""

    def __init__(self, app: Any):
        self.app = app

    async def request(
        self,
        method: str,
        path: str,
        body: bytes,
        disconnect: asyncio.Event,
        *,
        hold_body: asyncio.Event | None = None,
    ) -> tuple[list[dict[str, Any]], asyncio.Task[None]]:
        """Start a request; returns (sent messages, task running the app). Setting `disconnect`
        makes receive() report http.disconnect. `hold_body`: the first body message waits for
        this event (a slow client that reads nothing until then)."""
        sent: list[dict[str, Any]] = []
        body_sent = False

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            is_first_body = (
                message["type"] == "http.response.body" and sent[-1]["type"] == "http.response.start"
            )
            if hold_body is not None and is_first_body:
                await hold_body.wait()
            sent.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1),
            "server": ("test", 80),
            "state": {},
        }
        task = asyncio.ensure_future(self.app(scope, receive, send))
        return sent, task


def body_of(sent: list[dict[str, Any]]) -> str:
    """The response body an ASGIDriver request sent, as text."""
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()


async def wait_until(pred: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait (on the event loop) until pred() is true; AssertionError after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


class LiveServer:
    """The app under a real uvicorn server in a thread, on 127.0.0.1 and a free port."""

    def __init__(self, app: Any, runtime: Runtime, config: ServeConfig):
        from slotserve.gateway.server import DrainingServer, uvicorn_config

        self.config = config
        self.stuck = threading.Event()  # set by the shutdown watchdog instead of ending pytest
        self.server = DrainingServer(
            uvicorn_config(app, config),
            runtime.scheduler,
            config.drain_grace_s,
            stop_timeout_s=config.shutdown_timeout_s,
            on_stuck=self.stuck.set,
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = config.url

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@contextlib.contextmanager
def live_server(app: Any, runtime: Runtime, config: ServeConfig) -> Iterator[LiveServer]:
    with LiveServer(app, runtime, config) as server:
        yield server


# ------------------------------------------------------------------ a scripted scheduler


@dataclasses.dataclass
class Reply:
    """What a ScriptedScheduler answers one request with: these texts as token events, then a
    finish with `reason`, `stop_sequence`, and `reused` prompt tokens reported as reused."""

    texts: tuple[str, ...]
    reason: FinishReason = FinishReason.STOP
    stop_sequence: str | None = None
    reused: int = 0
    error: str | None = None


class ScriptedHandle:
    def __init__(self, gen: GenerationRequest, reply: Reply):
        self.gen = gen
        self.reply = reply
        self.request_id = gen.request_id
        self.num_cancels = 0

    def __aiter__(self) -> AsyncIterator[TokenEvent | FinishEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[TokenEvent | FinishEvent]:
        r, n = self.reply, len(self.gen.prompt_ids)
        for t in r.texts:
            yield TokenEvent((1,), t)
        reuse = ReuseInfo(ReuseSource.REWIND if r.reused else ReuseSource.NONE, r.reused, n - r.reused, 0)
        yield FinishEvent(r.reason, "", n, len(r.texts), reuse, r.error, {}, r.stop_sequence)

    async def batches(self) -> AsyncIterator[list[TokenEvent | FinishEvent]]:
        async for event in self._events():  # one at a time: a consumer that keeps up
            yield [event]

    async def cancel(self) -> bool:
        self.num_cancels += 1
        return False

    def progress(self) -> PrefillProgress:
        n = len(self.gen.prompt_ids)
        return PrefillProgress(n, n, self.reply.reused)


class ScriptedScheduler:
    """A scheduler double for exact output: each `submit` records the GenerationRequest and
    answers with the next Reply (or raises `admission_error`, when set)."""

    def __init__(self, *replies: Reply):
        self.replies = list(replies)
        self.submitted: list[GenerationRequest] = []
        self.admission_error: Exception | None = None

    async def __aenter__(self) -> ScriptedScheduler:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def submit(self, gen: GenerationRequest) -> ScriptedHandle:
        if self.admission_error is not None:
            raise self.admission_error
        self.submitted.append(gen)
        return ScriptedHandle(gen, self.replies.pop(0))

    async def drain(self, grace_s: float) -> None:
        return None

    def stats(self) -> Any:
        return types.SimpleNamespace(draining=False)

    def slots(self) -> list[Any]:
        return []


def scripted_runtime(*replies: Reply) -> tuple[Runtime, ScriptedScheduler]:
    """A Runtime over a ScriptedScheduler, with the byte tokenizer and ChatML."""
    sched = ScriptedScheduler(*replies)
    tok = ByteTokenizer()
    runtime = Runtime(
        scheduler=sched,
        tokenizer=tok,
        chat=ChatML(),
        model_names=(MODEL,),
        ctx_len=512,
        num_slots=1,
        kernel_variant="fake",
        created=1700000000,
    )
    return runtime, sched


def named_sse_events(body: str) -> list[tuple[str, Any]]:
    """Parse a named-event SSE body (`event: NAME` + `data: JSON`) into (name, payload) pairs."""
    assert body.endswith("\n\n"), body[-50:]
    out = []
    for block in body.split("\n\n")[:-1]:
        name_line, data_line = block.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: "), block
        out.append((name_line[len("event: ") :], json.loads(data_line[len("data: ") :])))
    return out
