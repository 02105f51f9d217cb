"""The one skeleton of a generation endpoint, shared by the three front doors.

Design: every generation route (OpenAI's chat and text completions in `app.py`, Anthropic's
Messages in `anthropic_api.py`, OpenAI's Responses in `responses_api.py`) runs the same steps:

    read the body (its Struct)  ->  check the model name  ->  plan (the API's translation)
      ->  submit (n choices; refused: 429/400/503)  ->  stream (SSE)  or  collect
      ->  client gone: `errors.client_closed()`;  a failed finish: its error;  else the answer

A front door supplies only what differs: its body Struct and prompt field (`FrontDoor`), and a
`plan` function that turns a decoded body into a `Generation`: the scheduler requests, the
response headers, its stream format and its whole-answer body. Errors raised anywhere are
`APIError`s that `Gateway.route` renders in the door's own error shape.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from ..scheduler.request import FinishEvent, GenerationRequest
from .errors import APIError, client_closed, json_response
from .openai_reply import divergence_info, failure
from .prompt_parts import PromptSource
from .state import Gateway, Handler
from .streaming import Collected, EventStream, SSEResponse, StreamFormat, collect_choices


class GenerationBody(Protocol):
    """What the skeleton reads of every generation request body (a msgspec Struct)."""

    @property
    def model(self) -> str | None: ...

    @property
    def stream(self) -> bool: ...

    @property
    def return_progress(self) -> bool: ...


class Generation:
    """One planned request, as its front door answers it.

    `requests` are submitted together (n choices of one request: `translate.choice_requests`);
    `headers` go on the answer, streamed or whole. Subclasses give `stream_format` (the SSE
    spelling) and `answer` (the whole body from every choice, once none failed), and may
    rewrite an admission error in `refused`.
    """

    def __init__(
        self,
        requests: list[GenerationRequest],
        headers: dict[str, str],
        parts: PromptSource | None = None,
    ) -> None:
        self.requests = requests
        self.headers = headers
        self.parts = parts  # a chat prompt's rendered parts: where a divergence falls

    def stream_format(self) -> StreamFormat:
        raise NotImplementedError

    def answer(self, choices: list[Collected]) -> object:
        """The JSON body (a msgspec Struct) of a request that was not streamed."""
        raise NotImplementedError

    def refused(self, err: APIError) -> APIError:
        """The error to answer when the scheduler refused the request (default: as it is)."""
        return err


log = logging.getLogger("slotserve.gateway")

Body = TypeVar("Body", bound=GenerationBody)


@dataclass(frozen=True)
class FrontDoor(Generic[Body]):
    """How one generation endpoint reads its body and plans it."""

    name: str  # the handler's name (logs, tracebacks)
    body: type[Body]  # the request Struct
    prompt_param: str  # the body field that holds the prompt (named by admission errors)
    plan: Callable[[Gateway, Body, str], Generation]  # (gw, request, model name) -> Generation


async def serve(gw: Gateway, request: Request, door: FrontDoor[Body]) -> Response:
    """Run the skeleton (module docstring) for one HTTP request through `door`."""
    req = await gw.read_body(request, door.body)
    model = gw.check_model(req.model)
    gen = door.plan(gw, req, model)
    key = session_key(request, req)
    if key is not None:
        for r in gen.requests:
            r.session_key = key
    try:
        handle = await gw.submit_choices(gen.requests, door.prompt_param)
    except APIError as err:
        raise gen.refused(err) from None
    if req.stream:
        body = EventStream(
            handle,
            gen.stream_format(),
            progress=req.return_progress,
            on_first_finish=lambda f: report(gw, gen, f),
        )
        return SSEResponse(body, headers=gen.headers, keepalive_s=gw.config.stream_keepalive_s)
    got = await collect_choices(handle, request.receive)
    if got is None:  # the client left; every choice was cancelled and acknowledged
        raise client_closed()
    report(gw, gen, got[0].finish)
    for choice in got:
        failed = failure(choice.finish)
        if failed is not None:
            raise failed
    return json_response(gen.answer(got), headers=gen.headers)


# where clients name their conversation, first found wins: headers, then body fields
SESSION_HEADERS = ("x-session-id", "x-claude-code-session-id")
SESSION_FIELDS = ("prompt_cache_key", "user")
_SESSION_SALT = os.urandom(16)  # per process: keys are compared, never shown or kept raw


def session_key(request: Request, body: object) -> str | None:
    """The hashed session key of a request (policy.Affinity), or None: a session header,
    `prompt_cache_key` (OpenAI chat and Responses), `user`, or Anthropic's `metadata.user_id`."""
    raw: str | None = None
    for name in SESSION_HEADERS:
        raw = raw or request.headers.get(name)
    for field in SESSION_FIELDS:
        value = getattr(body, field, None)
        raw = raw or (value if isinstance(value, str) else None)
    metadata = getattr(body, "metadata", None)
    if raw is None and isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        raw = metadata["user_id"]
    if not raw:
        return None
    return hashlib.blake2b(raw.encode(), digest_size=12, key=_SESSION_SALT).hexdigest()


def report(gw: Gateway, gen: Generation, finish: FinishEvent) -> None:
    """Count and log where a request's prompt diverged from what the server held, if it reused
    less than its whole prompt but the last token (once per request: its first choice)."""
    info = divergence_info(finish, gen.parts)
    if info is None:
        return
    gw.metrics.on_prefix_divergence(info.part.kind, info.reason)
    if log.isEnabledFor(logging.DEBUG):
        where = info.part.kind + (f"[{info.part.index}]" if info.part.index is not None else "")
        log.debug(
            "prefix divergence request=%s offset=%d part=%s role=%s reason=%s reused=%d near=%r|%r",
            gen.requests[0].request_id,
            info.offset,
            where,
            info.part.role,
            info.reason,
            finish.reuse.reused_tokens if finish.reuse is not None else 0,
            info.text_before,
            info.text_after,
        )


def handler(door: FrontDoor[Body]) -> Handler:
    """The route handler (for `Gateway.route`) of one generation endpoint."""

    async def generate(gw: Gateway, request: Request) -> Response:
        return await serve(gw, request, door)

    generate.__name__ = generate.__qualname__ = door.name
    return generate
