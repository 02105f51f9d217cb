"""The HTTP routes: an OpenAI-compatible API over one `Runtime`.

Design: `create_app(runtime, config, metrics=...)` returns a Starlette app whose lifespan starts
and stops the scheduler. Each route is built by `Gateway.route`, which checks the API key when
the route is protected and turns `APIError` into OpenAI's error JSON; any other exception is a
bug in slotserve and becomes a logged 500. Request bodies are read under --max-body-bytes and
decoded by msgspec into the Structs of `protocol.py`; `translate.py` maps them to the scheduler.

    route                        key   what
    POST /v1/chat/completions    yes   chat (stream or not)
    POST /v1/completions         yes   text completion (stream or not)
    GET  /v1/models[/{model}]    yes   served names
    POST /tokenize, /detokenize  yes   llama.cpp and vLLM shapes
    GET  /slots                  yes   per-slot state, no prompt text (--no-slots-endpoint: 404)
    GET  /health                 no    liveness
    GET  /ready                  no    model loaded and not draining
    GET  /metrics                no    Prometheus text
    POST /v1/messages[/count_tokens] yes  Anthropic's Messages API (anthropic_api.py)
    POST /v1/responses           yes   OpenAI's Responses API (responses_api.py)
    (plus the routes routers call, from router_compat.py)

JSON bodies must say `Content-Type: application/json` (415 otherwise). CORS is off unless
--cors-allow-origin names the browser origins to allow.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from ..scheduler.api import HandleAPI
from ..scheduler.request import Draining, GenerationRequest, PromptTooLong, QueueFull
from ..scheduler.stats import Outcome, SchedulerStats, StatsSink
from . import anthropic_api, openai_reply, responses_api, router_compat, translate
from . import protocol as p
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
    json_response,
    model_not_found,
    not_ready,
    queue_full,
    unauthorized,
    unsupported_media_type,
)
from .http_guard import HTTPGuard, mark_accounted
from .runtime import PromptError, Runtime
from .streaming import (
    ChoiceGroup,
    Collected,
    EventStream,
    SSEResponse,
    StreamFormat,
    cancel_quietly,
    collect_choices,
)

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


class Gateway:
    """Per-app state, owned by the app: the runtime, limits, metrics, and whether it is serving."""

    def __init__(self, runtime: Runtime, config: ServeConfig, metrics: MetricsExporter | None):
        self.runtime = runtime
        self.config = config
        if metrics is None:  # levels only: pushed series need the sink given to the Scheduler
            from slotserve.metrics import ServerMetrics

            metrics = ServerMetrics()
        self.metrics = metrics
        self.is_serving = False  # set while the lifespan holds the scheduler
        self._api_key = config.api_key.encode() if config.api_key is not None else None
        self._decoders: dict[type, msgspec.json.Decoder] = {}  # body Struct -> its decoder, built once

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
        decoder = self._decoders.get(kind)
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


# ------------------------------------------------------------------ generation routes


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class GenerationKind:
    """How one generation endpoint reads its body and spells its answers."""

    body: type  # the request Struct (protocol.py)
    id_prefix: str  # response ids: f"{id_prefix}-<hex>"
    prompt_param: str  # the body field that holds the prompt (named by admission errors)
    to_request: Callable[[Any, ServeConfig, Runtime, str], translate.Planned]  # (req, config, runtime, id)
    stream_format: Callable[
        [str, str, bool, openai_reply.OutputSpec], StreamFormat
    ]  # (id, model, usage, spec)
    # (id, model, created, collected choices, spec) -> the response Struct
    to_response: Callable[[str, str, int, list[Collected], openai_reply.OutputSpec], Any]


CHAT = GenerationKind(
    p.ChatCompletionRequest,
    "chatcmpl",
    "messages",
    translate.chat_plan,
    openai_reply.ChatStream,
    openai_reply.chat_completion,
)
COMPLETION = GenerationKind(
    p.CompletionRequest,
    "cmpl",
    "prompt",
    translate.completion_plan,
    openai_reply.CompletionStream,
    openai_reply.completion,
)


def generation_handler(kind: GenerationKind) -> Handler:
    """The route handler of one generation endpoint: decode, translate, submit, then answer with
    an SSE stream or one JSON body."""

    async def generate(gw: Gateway, request: Request) -> Response:
        req: Any = await gw.read_body(request, kind.body)  # kind.body: a protocol.py Struct
        model = gw.check_model(req.model)
        rid = _new_id(kind.id_prefix)
        planned = kind.to_request(req, gw.config, gw.runtime, rid)
        created = int(time.time())
        handle = await gw.submit_choices(translate.choice_requests(planned), kind.prompt_param)
        headers = {"X-Request-Id": planned.gen.request_id}
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return SSEResponse(
                EventStream(handle, kind.stream_format(rid, model, include_usage, planned.spec)),
                headers=headers,
            )
        got = await collect_choices(handle, request.receive)
        if got is None:  # the client left; the request was cancelled and acknowledged
            return error_response(APIError(499, "client closed the request", code="client_closed_request"))
        for choice in got:
            err = openai_reply.failure(choice.finish)
            if err is not None:
                raise err
        return json_response(kind.to_response(rid, model, created, got, planned.spec), headers=headers)

    generate.__name__ = f"{kind.id_prefix}_generate"
    return generate


# ------------------------------------------------------------------ other routes


def _model_card(gw: Gateway, name: str) -> p.ModelCard:
    created = gw.runtime.created
    return p.ModelCard(
        id=name,
        created=created,
        max_model_len=gw.runtime.ctx_len,
        created_at=datetime.datetime.fromtimestamp(created, datetime.timezone.utc)
        .isoformat()
        .replace("+00:00", "Z"),
        display_name=name,
    )


async def list_models(gw: Gateway, request: Request) -> Response:
    names = gw.runtime.model_names
    cards = [_model_card(gw, n) for n in names]
    return json_response(p.ModelList(data=cards, first_id=names[0], last_id=names[-1]))


async def get_model(gw: Gateway, request: Request) -> Response:
    name = request.path_params["model"]
    return json_response(_model_card(gw, gw.check_model(name)))


async def tokenize(gw: Gateway, request: Request) -> Response:
    req = await gw.read_body(request, p.TokenizeRequest)
    gw.check_model(req.model)
    given = [f for f in ("content", "prompt", "messages") if getattr(req, f) is not None]
    if len(given) != 1:
        raise bad_request("give exactly one of content, prompt or messages", param="content")
    if req.messages is not None:
        try:
            ids, _ = gw.runtime.encode_chat(
                translate.chat_messages(req), add_generation_prompt=req.add_generation_prompt
            )
        except PromptError as exc:
            raise bad_request(str(exc), param="messages") from None
    else:
        add_bos = req.add_special if req.add_special is not None else req.add_special_tokens
        if req.content is not None:
            ids = gw.runtime.encode_text(req.content, add_bos=bool(add_bos))
        else:
            assert req.prompt is not None
            ids = (
                gw.runtime.encode_prompt(req.prompt)
                if add_bos is None
                else gw.runtime.encode_text(req.prompt, add_bos=add_bos)
            )
    return json_response(p.TokenizeResponse(tokens=ids, count=len(ids), max_model_len=gw.runtime.ctx_len))


async def detokenize(gw: Gateway, request: Request) -> Response:
    req = await gw.read_body(request, p.DetokenizeRequest)
    gw.check_model(req.model)
    n_vocab = gw.runtime.n_vocab
    if any(t >= n_vocab for t in req.tokens):
        raise bad_request(f"token ids must be in 0..{n_vocab - 1}", param="tokens")
    text = gw.runtime.decode(req.tokens)
    return json_response(p.DetokenizeResponse(content=text, prompt=text))


async def slots(gw: Gateway, request: Request) -> Response:
    if gw.config.no_slots_endpoint:
        raise APIError(404, "GET /slots is turned off (--no-slots-endpoint)", code="not_found")
    views = gw.runtime.scheduler.slots()
    return json_response({"object": "list", "data": msgspec.to_builtins(views)})


async def health(gw: Gateway, request: Request) -> Response:
    return json_response({"status": "ok"})


async def ready(gw: Gateway, request: Request) -> Response:
    mark_accounted()  # a 503 here answers a probe; it refuses no work
    if not gw.is_serving:
        raise not_ready("the model is not loaded yet")
    if gw.is_draining():
        raise draining()
    return json_response({"status": "ready"})


async def metrics_text(gw: Gateway, request: Request) -> Response:
    body, content_type = gw.metrics.render(gw.runtime.scheduler.stats())
    return Response(body, media_type=content_type)


# ------------------------------------------------------------------ the app


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = "not_found" if exc.status_code == 404 else "method_not_allowed" if exc.status_code == 405 else None
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return error_response(APIError(exc.status_code, message, code=code, headers=dict(exc.headers or {})))


def cors_middleware(origins: tuple[str, ...]) -> Middleware:
    """CORS for the browser origins of --cors-allow-origin: preflights are answered for them,
    and responses carry Access-Control-Allow-Origin. No credentials (cookies): the API key
    travels in the Authorization header, which a preflight may allow."""
    return Middleware(
        CORSMiddleware,
        allow_origins=list(origins),
        allow_methods=["GET", "POST"],
        allow_headers=["*"],  # the OpenAI SDKs send Authorization, Content-Type and x-stainless-*
        expose_headers=["X-Request-Id", "Retry-After"],
        allow_credentials=False,
        max_age=600,
    )


def create_app(runtime: Runtime, config: ServeConfig, *, metrics: MetricsExporter | None = None) -> Starlette:
    """The ASGI app. Its lifespan enters `runtime.scheduler` (starting the step loop) and leaves
    it on shutdown; `app.state.gateway` is the `Gateway` (tests and the server read it)."""
    gw = Gateway(runtime, config, metrics)

    route = gw.route
    routes = [
        route("/v1/chat/completions", generation_handler(CHAT), ["POST"]),
        route("/v1/completions", generation_handler(COMPLETION), ["POST"]),
        route("/v1/models", list_models, ["GET"]),
        route("/v1/models/{model:path}", get_model, ["GET"]),
        route("/tokenize", tokenize, ["POST"]),
        route("/detokenize", detokenize, ["POST"]),
        route("/slots", slots, ["GET"]),
        route("/health", health, ["GET"], protected=False),
        route("/ready", ready, ["GET"], protected=False),
        route("/metrics", metrics_text, ["GET"], protected=False),
    ]
    routes += router_compat.routes(gw)  # /model_info, /server_info, /v1/*/render (scale-out routers)
    routes += anthropic_api.routes(gw)  # /v1/messages, /v1/messages/count_tokens (Anthropic's API)
    routes += responses_api.routes(gw)  # /v1/responses (OpenAI's Responses API)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            async with runtime.scheduler:
                gw.is_serving = True
                try:
                    yield
                finally:
                    gw.is_serving = False
        finally:
            for close in runtime.closers:
                close()

    middleware = [] if not config.cors_allow_origin else [cors_middleware(config.cors_allow_origin)]
    middleware.append(
        Middleware(HTTPGuard, body_timeout_s=config.body_timeout_s, count=gw.metrics.on_gateway_request)
    )
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error},
    )
    app.state.gateway = gw
    return app
