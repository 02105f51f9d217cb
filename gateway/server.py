"""Run the app under uvicorn; SIGTERM drains before exiting.

Design: `DrainingServer` is a uvicorn.Server whose first SIGTERM (or Ctrl-C) does not stop the
listener at once: it asks the scheduler to drain (stop admitting, so new requests get 503 and
GET /ready turns 503; let running requests finish within --drain-grace-s, then cancel them),
and only then lets uvicorn shut down. A second signal exits without waiting. The signal is not
re-raised after shutdown (uvicorn's default), so a drained server exits 0.

The signal handler only sets a flag (it runs between bytecodes of the loop thread); uvicorn's
`on_tick` (every 0.1 s, on the loop) starts the drain task.

A hung engine (a forward that never returns) would make the drain wait forever: the cancels it
sends are acknowledged only at a step boundary. So the drain also arms a watchdog thread: if
the server has not finished `--drain-grace-s` + `--shutdown-timeout-s` seconds after the signal,
it logs an error and ends the process with status 1 (`os._exit`: the stuck engine thread and
the shielded cancel waits would block a normal interpreter exit). A thread, not a loop task, so
it fires even when the event loop itself is blocked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn
from starlette.types import ASGIApp

from .config import LogLevel, ServeConfig
from .transport import protocol_class

if TYPE_CHECKING:  # imported where used: `slotserve serve --help` loads none of them
    from ..metrics import ServerMetrics
    from ..scheduler.api import SchedulerAPI
    from .runtime import Runtime

log = logging.getLogger("slotserve.gateway")


EXIT_STUCK = 1  # status when the watchdog ends a server whose scheduler did not stop


def exit_stuck() -> None:
    """The watchdog's default action: flush the logs and end the process with EXIT_STUCK."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_STUCK)


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first signal drains the scheduler (module docstring).

    stop_timeout_s: after the grace period, how long the scheduler may take to stop before the
    watchdog calls `on_stuck` (default `exit_stuck`; runs on the watchdog thread).
    """

    def __init__(
        self,
        config: uvicorn.Config,
        scheduler: SchedulerAPI,
        grace_s: float,
        banner: str | None = None,
        *,
        stop_timeout_s: float = 10.0,
        on_stuck: Callable[[], None] = exit_stuck,
    ):
        super().__init__(config)
        self.scheduler = scheduler
        self.grace_s = grace_s
        self.stop_timeout_s = stop_timeout_s
        self.on_stuck = on_stuck
        self.banner = banner  # printed once the socket is bound
        self.is_drain_requested = False
        self._drain_task: asyncio.Task[None] | None = None
        self._watchdog: threading.Timer | None = None  # armed when the drain starts

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            super().run(sockets=sockets)
        finally:
            if self._watchdog is not None:
                self._watchdog.cancel()  # finished in time

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.is_drain_requested or not self.started:
            # second signal, or not serving yet: leave now
            self.force_exit = self.is_drain_requested
            self.should_exit = True
            return
        log.info("received %s: draining (grace %.0fs)", signal.Signals(sig).name, self.grace_s)
        self.is_drain_requested = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.banner:
            print(self.banner, flush=True)

    def request_drain(self) -> None:
        """Start the drain as a signal would (for tests and embedding; call on the loop)."""
        self.is_drain_requested = True

    async def on_tick(self, counter: int) -> bool:
        if self.is_drain_requested and self._drain_task is None:
            self._arm_watchdog()
            self._drain_task = asyncio.get_running_loop().create_task(self._drain())
        return await super().on_tick(counter)

    def _arm_watchdog(self) -> None:
        timeout = self.grace_s + self.stop_timeout_s

        def fire() -> None:
            log.error(
                "the scheduler did not stop within %.0fs of the drain (grace %.0fs + %.0fs; "
                "an engine call is stuck?): exiting with status %d",
                timeout,
                self.grace_s,
                self.stop_timeout_s,
                EXIT_STUCK,
            )
            self.on_stuck()

        self._watchdog = threading.Timer(timeout, fire)
        self._watchdog.name = "slotserve-shutdown-watchdog"
        self._watchdog.daemon = True
        self._watchdog.start()

    async def _drain(self) -> None:
        try:
            await self.scheduler.drain(self.grace_s)
        except Exception:
            log.exception("drain failed; shutting down anyway")
        finally:
            self.should_exit = True


def uvicorn_config(app: ASGIApp, config: ServeConfig) -> uvicorn.Config:
    """uvicorn's Config for `app`: slotserve's h11 protocol (header deadline, connection cap:
    transport.py), the keep-alive timeout and TLS from `config`."""
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level.value,
        lifespan="on",
        timeout_graceful_shutdown=5,  # backstop only: the drain has already finished requests
        server_header=False,
        http=protocol_class(header_timeout_s=config.header_timeout_s, max_connections=config.max_connections),
        timeout_keep_alive=config.keep_alive_timeout_s,  # type: ignore[arg-type]  # float works
        ssl_certfile=config.ssl_certfile,
        ssl_keyfile=config.ssl_keyfile,
    )


def check_tls_files(config: ServeConfig) -> None:
    """Load --ssl-certfile/--ssl-keyfile once before the model, so a bad path or a key that
    does not match fails at once with a ValueError naming the flags (not a traceback later)."""
    if not config.is_tls:
        return
    assert config.ssl_certfile is not None  # is_tls means a certfile was given
    import ssl

    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
            config.ssl_certfile, config.ssl_keyfile
        )
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"--ssl-certfile {config.ssl_certfile} / --ssl-keyfile {config.ssl_keyfile}: "
            f"cannot load the certificate and key ({exc})"
        ) from None


def summary_line(runtime: Runtime, config: ServeConfig) -> str:
    """The one line printed at start: model, slots, context per slot, KV memory, the checkpoint
    budget and how it was chosen, kernels, chat template (the GGUF's, a built-in one, a file,
    none), URL."""
    kv_mib = runtime.kv_bytes / (1024 * 1024)
    reuse = "off (--no-reuse)" if config.no_reuse else "on"
    window = runtime.kv_window
    ring = f" (sliding window {window} kept in rings)" if window is not None else ""
    budget = runtime.checkpoint_budget
    checkpoints = f" | {budget.describe()}" if budget is not None else ""
    chat = (
        "none (chat requests get 400)" if runtime.chat is None else getattr(runtime.chat, "origin", "custom")
    )
    return (
        f"slotserve: model {runtime.model_name} ({runtime.model_path}) | {runtime.num_slots} slots x "
        f"{runtime.ctx_len} tokens | KV {kv_mib:.1f} MiB {runtime.kv_type}{ring}{checkpoints} | kernels "
        f"{runtime.kernel_variant} | reuse {reuse} | chat template {chat} | {config.url}"
    )


def server_metrics(model_name: str) -> ServerMetrics:
    """The server's `ServerMetrics`: slotserve's series plus the vllm:-named router gauges
    labelled `model_name`, both made from the one stats snapshot each scrape takes."""
    from ..metrics import ServerMetrics
    from ..metrics.router_compat import router_compat_maker

    return ServerMetrics(extra_levels=[router_compat_maker(model_name)])


def serve(config: ServeConfig) -> int:
    """Load the model, serve until SIGTERM/SIGINT, drain, return 0."""
    from .app import create_app
    from .runtime import build_runtime, open_served_model

    logging.basicConfig(
        level=logging.DEBUG if config.log_level is LogLevel.TRACE else config.log_level.value.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        check_tls_files(config)
    except ValueError as exc:
        print(f"slotserve serve: {exc}", file=sys.stderr)
        return 2
    model = open_served_model(config)
    metrics = server_metrics(model.model_names[0])
    runtime = build_runtime(config, model, stats_sink=metrics.sink)
    app = create_app(runtime, config, metrics=metrics)
    server = DrainingServer(
        uvicorn_config(app, config),
        runtime.scheduler,
        config.drain_grace_s,
        banner=summary_line(runtime, config),
        stop_timeout_s=config.shutdown_timeout_s,
    )
    server.run()
    if server.started or server.is_drain_requested:
        return 0
    print("slotserve serve: the server did not start (see the log above)", file=sys.stderr)
    return 1
