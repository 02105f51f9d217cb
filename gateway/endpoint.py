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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from ..scheduler.request import GenerationRequest
from .errors import APIError, client_closed, json_response
from .openai_reply import failure
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

    def __init__(self, requests: list[GenerationRequest], headers: dict[str, str]) -> None:
        self.requests = requests
        self.headers = headers

    def stream_format(self) -> StreamFormat:
        raise NotImplementedError

    def answer(self, choices: list[Collected]) -> object:
        """The JSON body (a msgspec Struct) of a request that was not streamed."""
        raise NotImplementedError

    def refused(self, err: APIError) -> APIError:
        """The error to answer when the scheduler refused the request (default: as it is)."""
        return err


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
    try:
        handle = await gw.submit_choices(gen.requests, door.prompt_param)
    except APIError as err:
        raise gen.refused(err) from None
    if req.stream:
        body = EventStream(handle, gen.stream_format(), progress=req.return_progress)
        return SSEResponse(body, headers=gen.headers, keepalive_s=gw.config.stream_keepalive_s)
    got = await collect_choices(handle, request.receive)
    if got is None:  # the client left; every choice was cancelled and acknowledged
        raise client_closed()
    for choice in got:
        failed = failure(choice.finish)
        if failed is not None:
            raise failed
    return json_response(gen.answer(got), headers=gen.headers)


def handler(door: FrontDoor[Body]) -> Handler:
    """The route handler (for `Gateway.route`) of one generation endpoint."""

    async def generate(gw: Gateway, request: Request) -> Response:
        return await serve(gw, request, door)

    generate.__name__ = generate.__qualname__ = door.name
    return generate
