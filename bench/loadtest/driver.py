"""Send a workload's requests: closed loop, open loop (Poisson), or at trace offsets.

Design: ready conversations wait in one FIFO queue. A conversation is in the queue or in
flight, never both, so its turns go out one after another; a conversation whose request
finishes goes to the back, which interleaves conversations round-robin (with more
conversations than server slots, every turn comes back to an evicted slot).
- Closed loop: C workers each take the next ready conversation, send, wait, repeat.
- Open loop: one dispatcher sends the next ready conversation's request at Poisson arrival
  times of rate R, without waiting for replies. When every conversation is in flight an
  arrival waits for the first to come back (so give open-loop runs enough conversations).
- Trace offsets: every recorded request is sent at its `offset_s`, independent of replies.
The run stops dispatching after `max_requests` or `duration_s`, whichever comes first; requests
in flight then finish (each is bounded by the per-request timeout), so a run lasts at most
duration + timeout.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from .client import Exchange, SendParams, send
from .workloads import Conversation, Outcome, RequestSpec


@dataclass(frozen=True, slots=True)
class DriveConfig:
    """How to drive. Exactly one of `concurrency`, `rate`, `use_offsets` picks the loop."""

    base_url: str  # e.g. http://127.0.0.1:8080 (no trailing /v1)
    params: SendParams
    concurrency: int | None = None  # closed loop: requests in flight
    rate: float | None = None  # open loop: Poisson arrivals per second
    use_offsets: bool = False  # trace replay at each request's offset_s
    max_requests: int | None = None
    duration_s: float = 300.0
    seed: int = 0  # arrival times of the open loop

    def __post_init__(self) -> None:
        modes = (self.concurrency is not None) + (self.rate is not None) + self.use_offsets
        if modes != 1:
            raise ValueError("choose exactly one of --concurrency C, --rate R (or trace offsets)")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1 (got {self.concurrency})")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"--rate must be > 0 requests/s (got {self.rate})")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"--requests must be >= 1 (got {self.max_requests})")
        if not self.duration_s > 0:
            raise ValueError(f"--duration must be > 0 seconds (got {self.duration_s})")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"--url must start with http:// or https:// (got {self.base_url!r})")


@dataclass(frozen=True, slots=True)
class DriveOutcome:
    exchanges: list[Exchange]  # in dispatch order
    t_start: float  # perf_counter at the start
    started_at: str  # ISO 8601 wall clock at the start
    duration_s: float  # start -> end of the last request


def make_client(params: SendParams) -> httpx.AsyncClient:
    # NOTE: trust_env=False: a proxy from the environment must never see benchmark traffic.
    headers = {"Authorization": f"Bearer {params.api_key}"} if params.api_key else None
    return httpx.AsyncClient(
        timeout=httpx.Timeout(params.timeout_s, connect=10.0),
        trust_env=False,
        headers=headers,
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
    )


class _Run:
    """Shared state of one run: the ready queue, the budget, the finished exchanges."""

    def __init__(
        self,
        conversations: Sequence[Conversation],
        cfg: DriveConfig,
        client: httpx.AsyncClient,
        on_done: Callable[[Exchange], None] | None,
    ) -> None:
        self.cfg, self.client, self.on_done = cfg, client, on_done
        self.queue: asyncio.Queue[Conversation | None] = asyncio.Queue()
        for conv in conversations:
            self.queue.put_nowait(conv)
        self.num_open = len(conversations)  # conversations not yet finished
        self.num_sent = 0
        self.is_stopped = False
        self.exchanges: list[Exchange] = []
        self.t_start = time.perf_counter()
        self.deadline = self.t_start + cfg.duration_s

    def stop(self) -> None:
        """Stop dispatching; wake every waiter (in-flight requests still finish)."""
        if not self.is_stopped:
            self.is_stopped = True
            for _ in range((self.cfg.concurrency or 1) + 1):
                self.queue.put_nowait(None)

    def _take_budget(self) -> int | None:
        """Index for one more request, or None (and stop) when the budget is spent."""
        cfg = self.cfg
        if self.is_stopped or time.perf_counter() >= self.deadline:
            self.stop()
            return None
        index = self.num_sent
        self.num_sent += 1
        if cfg.max_requests is not None and self.num_sent >= cfg.max_requests:
            self.stop()
        return index

    async def next_request(self) -> tuple[Conversation, RequestSpec, int] | None:
        """The next ready conversation's request, or None when the run is over."""
        while True:
            conv = await self.queue.get()
            if conv is None or self.is_stopped:
                return None
            spec = conv.next_request()
            if spec is None:
                self.num_open -= 1
                if self.num_open == 0:
                    self.stop()
                continue
            index = self._take_budget()
            return None if index is None else (conv, spec, index)

    async def exchange(self, spec: RequestSpec, index: int) -> Exchange:
        ex = await send(self.client, self.cfg.base_url, spec, index, self.cfg.params)
        self.exchanges.append(ex)
        if self.on_done is not None:
            self.on_done(ex)
        return ex

    async def serve(self, conv: Conversation, spec: RequestSpec, index: int) -> None:
        ex = await self.exchange(spec, index)
        conv.record_reply(spec, ex.outcome, ex.text)
        self.queue.put_nowait(conv)  # to the back: round-robin over conversations

    async def closed_loop(self, concurrency: int) -> None:
        async def worker() -> None:
            while (item := await self.next_request()) is not None:
                await self.serve(*item)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def open_loop(self, rate: float) -> None:
        rng = random.Random(f"{self.cfg.seed}/arrivals")
        tasks: set[asyncio.Task[None]] = set()
        t_next = self.t_start
        while True:
            t_next += rng.expovariate(rate)
            if t_next >= self.deadline:
                self.stop()
                break
            await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
            item = await self.next_request()
            if item is None:
                break
            tasks.add(asyncio.create_task(self.serve(*item)))
        await asyncio.gather(*tasks)

    async def offsets(self, conversations: Sequence[Conversation]) -> None:
        specs: list[RequestSpec] = []
        for conv in conversations:  # trace conversations: fixed specs, independent of replies
            while (spec := conv.next_request()) is not None:
                specs.append(spec)
                conv.record_reply(spec, Outcome.OK, "")  # advance to the next line
        specs.sort(key=lambda s: s.offset_s or 0.0)  # stable: file order within an offset
        tasks: list[asyncio.Task[Exchange]] = []
        for spec in specs:
            t_due = self.t_start + (spec.offset_s or 0.0)
            if t_due >= self.deadline:
                break
            await asyncio.sleep(max(0.0, t_due - time.perf_counter()))
            index = self._take_budget()
            if index is None:
                break
            tasks.append(asyncio.create_task(self.exchange(spec, index)))
        await asyncio.gather(*tasks)


async def drive(
    conversations: Sequence[Conversation], cfg: DriveConfig, on_done: Callable[[Exchange], None] | None = None
) -> DriveOutcome:
    """Run the workload against `cfg.base_url`; `on_done` sees each exchange as it ends."""
    started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    async with make_client(cfg.params) as client:
        run = _Run(conversations, cfg, client, on_done)
        timer = asyncio.get_running_loop().call_at(
            asyncio.get_running_loop().time() + cfg.duration_s, run.stop
        )
        try:
            if cfg.use_offsets:
                await run.offsets(conversations)
            elif cfg.rate is not None:
                await run.open_loop(cfg.rate)
            else:
                assert cfg.concurrency is not None
                await run.closed_loop(cfg.concurrency)
        finally:
            timer.cancel()
    exchanges = sorted(run.exchanges, key=lambda e: e.index)
    t_last = max((e.t_end for e in exchanges), default=run.t_start)
    return DriveOutcome(
        exchanges=exchanges, t_start=run.t_start, started_at=started_at, duration_s=t_last - run.t_start
    )


async def discover_model(base_url: str, params: SendParams) -> str | None:
    """The first model id the server lists at /v1/models, or None when it lists none.

    Raises httpx.HTTPError (ConnectError...) when nothing answers at `base_url`."""
    async with make_client(params) as client:
        resp = await client.get(base_url + "/v1/models", timeout=10.0)
        if resp.status_code != 200:
            return None
        try:
            data = resp.json().get("data") or []
            return str(data[0]["id"]) if data else None
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
