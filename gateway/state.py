"""The state every route shares: one `Gateway` per app (runtime, limits, metrics, serving flag)
and the checks the routes have in common: the API key, the served model names, reading and
decoding a body under --max-body-bytes, submitting to the scheduler, and `Gateway.route`, which
wraps a handler into a Starlette route with the key check and the error mapping.

Design: the API modules (`app.py` for OpenAI's, `anthropic_api.py`, `responses_api.py`,
`router_compat.py`) import this module, never `app.py`, which imports them to assemble the app.
"""

from __future__ import annotations

import functools
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..scheduler.api import HandleAPI
from ..scheduler.request import Draining, GenerationRequest, PromptTooLong, QueueFull
from ..scheduler.stats import Outcome, SchedulerStats, StatsSink
from .config import ServeConfig
from .errors import (
    APIError,
    bad_request,
    body_too_large,
    client_closed,
    draining,
    error_response,
    from_decode_error,
    internal_error,
    model_not_found,
    queue_full,
    unauthorized,
    unsupported_media_type,
)
from .http_guard import mark_accounted
from .runtime import Runtime
from .streaming import ChoiceGroup, cancel_quietly

log = logging.getLogger("slotserve.gateway")

T = TypeVar("T")


class MetricsExporter(Protocol):
    """What GET /metrics needs (`slotserve.metrics.ServerMetrics` is one). `sink` is the
    StatsSink given to the Scheduler at construction (see `runtime.load_runtime`)."""

    @property
    def sink(self) -> StatsSink: ...

    def render(self, snapshot: SchedulerStats | None = None) -> tuple[bytes, str]: ...

    def on_gateway_request(self, outcome: Outcome) -> None:
        """Count a request that ended in the gateway, before the scheduler (http_guard.py)."""

    def on_prefix_divergence(self, part: str, reason: str) -> None:
        """Count a request whose prompt diverged in a rendered part (gateway/prompt_parts.py)."""


class Gateway:
    """Per-app state, owned by the app: the runtime, limits, metrics, and whether it is serving."""

    def __init__(self, runtime: Runtime, config: ServeConfig, metrics: MetricsExporter | None):
        self.runtime = runtime
        self.config = config
        if metrics is None:  # levels only: pushed series need the sink given to the Scheduler
            from ..metrics import ServerMetrics

            metrics = ServerMetrics()
        self.metrics = metrics
        self.is_serving = False  # set while the lifespan holds the scheduler
        self._api_key = config.api_key.encode() if config.api_key is not None else None
        # body Struct -> its decoder, built once (one decoder type per Struct: Any is the honest type here)
        self._decoders: dict[type, msgspec.json.Decoder[Any]] = {}

    # ---- checks shared by the routes

    def check_auth(self, request: Request) -> None:
        """The key as `Authorization: Bearer KEY` (OpenAI clients) or `x-api-key: KEY`
        (Anthropic clients), on every protected route; raises 401 otherwise."""
        if self._api_key is None:
            return
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer":
                raise unauthorized()
        else:
            token = request.headers.get("x-api-key", "")
        # NOTE: compare_digest runs in time independent of where the strings differ
        if not hmac.compare_digest(token.strip().encode(), self._api_key):
            raise unauthorized()

    def check_model(self, name: str | None) -> str:
        """The name to report; raises 404 for a name this server does not serve."""
        if name is None or name == "":
            return self.runtime.model_name
        if name not in self.runtime.model_names:
            raise model_not_found(name, self.runtime.model_names)
        return name

    async def read_body(self, request: Request, kind: type[T]) -> T:
        """Check the content type, read at most --max-body-bytes and decode into `kind` (415 /
        400 / 413 on failure, also for JSON nested too deeply to decode)."""
        check_json_content_type(request.headers.get("content-type"))
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise body_too_large(limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise body_too_large(limit)
            chunks.append(chunk)
        decoder: msgspec.json.Decoder[T] | None = self._decoders.get(kind)
        if decoder is None:
            decoder = self._decoders[kind] = msgspec.json.Decoder(kind)
        try:
            return decoder.decode(b"".join(chunks))
        except msgspec.DecodeError as exc:
            raise from_decode_error(exc) from None
        except RecursionError:  # msgspec's answer to arrays/objects nested past the recursion limit
            raise bad_request(
                "Request body is not valid JSON: nested too deeply", code="invalid_json"
            ) from None

    def submit(self, gen: GenerationRequest, prompt_param: str) -> HandleAPI:
        """Hand `gen` to the scheduler; admission errors become 429/400/503 (`prompt_param`
        names the request field that held the prompt)."""
        mark_accounted()  # the scheduler counts every request it sees, admitted or refused...
        try:
            return self.runtime.scheduler.submit(gen)
        except QueueFull as exc:
            raise queue_full(exc.retry_after_s) from None
        except PromptTooLong as exc:
            raise APIError(
                400,
                f"{exc} (each slot holds {self.runtime.ctx_len} tokens)",
                param=prompt_param,
                code="context_length_exceeded",
            ) from None
        except Draining:
            mark_accounted(False)  # ...but one refused while draining: HTTPGuard counts that
            raise draining() from None
        except ValueError as exc:  # the scheduler's own validation of the request
            raise bad_request(str(exc)) from None

    async def submit_choices(self, gens: list[GenerationRequest], prompt_param: str) -> ChoiceGroup:
        """Submit the n requests of one API request as a ChoiceGroup. If one is refused, those
        already submitted are cancelled (acknowledged) before the error is raised."""
        handles: list[HandleAPI] = []
        try:
            for gen in gens:
                handles.append(self.submit(gen, prompt_param))
        except APIError:
            for h in handles:
                await cancel_quietly(h)
            raise
        return ChoiceGroup(handles)

    def is_draining(self) -> bool:
        return bool(self.runtime.scheduler.stats().draining)

    def route(
        self,
        path: str,
        handler: Handler,
        methods: list[str],
        *,
        protected: bool = True,
        render_error: Callable[[APIError], Response] = error_response,
    ) -> Route:
        """A Starlette route calling `handler(self, request)`: the API key is checked first when
        `protected`, an `APIError` becomes an error response (OpenAI's JSON unless
        `render_error` spells it otherwise), any other exception a logged 500."""

        @functools.wraps(handler)
        async def endpoint(request: Request) -> Response:
            try:
                if protected:
                    self.check_auth(request)
                return await handler(self, request)
            except APIError as err:
                return render_error(err)
            except ClientDisconnect:  # gone while its body was read: not an error of ours
                log.debug("client disconnected during the body of %s %s", request.method, request.url.path)
                return render_error(client_closed())  # counted by HTTPGuard; nobody reads it
            except Exception:
                log.exception("unhandled error in %s %s", request.method, request.url.path)
                return render_error(internal_error())

        return Route(path, endpoint, methods=methods)


Handler = Callable[[Gateway, Request], Awaitable[Response]]


def check_json_content_type(header: str | None) -> None:
    """415 unless `header` is application/json, with no charset or a UTF-8 one.

    NOTE: this is also the CSRF guard of a keyless server: a web page may POST `text/plain` (or
    form data) cross-origin without a preflight, so a body is never taken as JSON unless it says
    it is; an application/json POST from a page needs a preflight, which only
    --cors-allow-origin answers.
    """
    media, _, params = (header or "").partition(";")
    if media.strip().lower() != "application/json":
        raise unsupported_media_type(header)
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            raise unsupported_media_type(header)
