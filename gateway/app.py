"""The HTTP routes: an OpenAI-compatible API over one `Runtime`.

Design: `create_app(runtime, config, metrics=...)` returns a Starlette app whose lifespan starts
and stops the scheduler. Each route is built by `Gateway.route` (state.py), which checks the API
key when the route is protected and turns `APIError` into OpenAI's error JSON; any other
exception is a bug in slotserve and becomes a logged 500. Request bodies are read under
--max-body-bytes and decoded by msgspec into the Structs of `protocol.py`; the generation routes
run the one skeleton of `endpoint.py` with `translate.py`'s plans and `openai_reply.py`'s answers
(`openai_stream.py`'s streamed).

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
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response

from . import anthropic_api, endpoint, openai_reply, openai_stream, responses_api, router_compat, translate
from . import protocol as p
from .config import ServeConfig
from .endpoint import FrontDoor, Generation
from .errors import APIError, bad_request, draining, error_response, json_response, not_ready
from .http_guard import HTTPGuard, mark_accounted
from .runtime import PromptError, Runtime
from .state import Gateway, MetricsExporter
from .streaming import Collected, StreamFormat

log = logging.getLogger("slotserve.gateway")


# ------------------------------------------------------------------ generation routes


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class OpenAIAnswers:
    """How chat or text completions spell their answers."""

    # (id, model, include usage, spec) -> the stream format
    stream_format: Callable[[str, str, bool, openai_reply.OutputSpec], StreamFormat]
    # (id, model, created, collected choices, spec) -> the response Struct
    to_response: Callable[[str, str, int, list[Collected], openai_reply.OutputSpec], object]


class OpenAIGeneration(Generation):
    """A chat or text completion request, planned: its n choices, answered in OpenAI's shapes."""

    def __init__(
        self, answers: OpenAIAnswers, planned: translate.Planned, request_id: str, model: str, usage: bool
    ):
        super().__init__(
            translate.choice_requests(planned), {"X-Request-Id": planned.gen.request_id}, planned.spec.parts
        )
        self.answers = answers
        self.planned = planned
        self.request_id = request_id
        self.model = model
        self.include_usage = usage
        self.created = int(time.time())

    def stream_format(self) -> StreamFormat:
        return self.answers.stream_format(self.request_id, self.model, self.include_usage, self.planned.spec)

    def answer(self, choices: list[Collected]) -> object:
        return self.answers.to_response(self.request_id, self.model, self.created, choices, self.planned.spec)


OpenAIBody = TypeVar("OpenAIBody", p.ChatCompletionRequest, p.CompletionRequest)


@dataclass(frozen=True)
class OpenAIKind(Generic[OpenAIBody]):
    """How chat or text completions plan a request."""

    id_prefix: str  # response ids: f"{id_prefix}-<hex>"
    # (request, config, runtime, id) -> the translated request
    to_request: Callable[[OpenAIBody, ServeConfig, Runtime, str], translate.Planned]
    answers: OpenAIAnswers

    def plan(self, gw: Gateway, req: OpenAIBody, model: str) -> Generation:
        rid = _new_id(self.id_prefix)
        planned = self.to_request(req, gw.config, gw.runtime, rid)
        usage = bool(req.stream_options and req.stream_options.include_usage)
        return OpenAIGeneration(self.answers, planned, rid, model, usage)


CHAT = FrontDoor(
    "chatcmpl_generate",
    p.ChatCompletionRequest,
    "messages",
    OpenAIKind(
        "chatcmpl",
        translate.chat_completion_plan,
        OpenAIAnswers(openai_stream.ChatStream, openai_reply.chat_completion),
    ).plan,
)
COMPLETION = FrontDoor(
    "cmpl_generate",
    p.CompletionRequest,
    "prompt",
    OpenAIKind(
        "cmpl",
        translate.completion_plan,
        OpenAIAnswers(openai_stream.CompletionStream, openai_reply.completion),
    ).plan,
)


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
        route("/v1/chat/completions", endpoint.handler(CHAT), ["POST"]),
        route("/v1/completions", endpoint.handler(COMPLETION), ["POST"]),
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
