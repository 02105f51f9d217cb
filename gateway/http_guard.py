"""The ASGI layer around every request: the body deadline and the count of requests that end in
the gateway.

Design: `HTTPGuard` wraps the app's `receive` and `send`. Until the body is complete, each
`receive()` is bounded by what is left of --body-timeout-s, counted from the request's head;
past it `receive()` raises `BodyTimeout`, an `APIError` the route renders as 408 (the response
says `Connection: close`, so uvicorn closes the socket). A request never holds a slot while its
body is read: the handler submits only a decoded body.

Every request the scheduler sees is counted by the scheduler (`slotserve_requests_total` with
`stage="scheduler"`). The others end here: no route (404/405), no key (401), a body too large,
undeclared, slow or malformed (413/415/408/400), a client gone during its body (499), a refusal
while draining (503). `HTTPGuard` counts each of those once, by its response status, with
`stage="gateway"`: the handler marks a request the scheduler accounts for with
`mark_accounted()` (a ContextVar holds the per-request record; the handler runs in the
middleware's task, so it sees the same record). Successful responses the scheduler never saw
(/health, /metrics, /v1/models) are not counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

import anyio
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..scheduler.stats import Outcome
from .errors import BodyTimeout, error_response

log = logging.getLogger("slotserve.gateway")

CLIENT_CLOSED = 499  # nginx's status for a client that closed the request: never sent


@dataclass(slots=True)
class _Accounting:
    """What the guard knows of one request."""

    is_accounted: bool = False  # counted by the scheduler, or not a refusal (GET /ready 503)


_current: ContextVar[_Accounting | None] = ContextVar("slotserve_request_accounting", default=None)


def mark_accounted(value: bool = True) -> None:
    """Say that the current request's outcome is counted elsewhere (the scheduler counted it as
    admitted or rejected) or is not a refusal; the guard then does not count it."""
    record = _current.get()
    if record is not None:
        record.is_accounted = value


def gateway_outcome(status: int) -> Outcome:
    """The `outcome` label of a request that ended in the gateway with `status`."""
    if status == CLIENT_CLOSED:
        return Outcome.CANCELLED
    if status == 408:
        return Outcome.TIMEOUT
    if status >= 500 and status not in (503, 529):
        return Outcome.ERROR
    return Outcome.REJECTED  # 4xx, and 503 / Anthropic's 529 (draining, not ready): refused


class HTTPGuard:
    """ASGI middleware: body deadline and gateway-side request counting (module docstring).

    count: called with the `outcome` of each request that ended in the gateway (from the loop).
    """

    def __init__(self, app: ASGIApp, *, body_timeout_s: float, count: Callable[[Outcome], None]):
        self.app = app
        self.body_timeout_s = body_timeout_s
        self.count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = _Accounting()
        token = _current.set(record)
        deadline = anyio.current_time() + self.body_timeout_s
        is_body_done = False
        status: int | None = None

        async def guarded_receive() -> Message:
            nonlocal is_body_done
            if is_body_done:
                return await receive()
            try:
                with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout(self.body_timeout_s) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                is_body_done = True
            return message

        async def watched_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, guarded_receive, watched_send)
        except ClientDisconnect:  # a route not built by Gateway.route: the same answer
            log.debug("client disconnected during the body of %s %s", scope["method"], scope["path"])
            if status is None:
                status = CLIENT_CLOSED
        except BodyTimeout as err:
            if status is not None:
                raise
            await error_response(err)(scope, receive, watched_send)
        finally:
            _current.reset(token)
            if status is not None and status >= 400 and not record.is_accounted:
                self.count(gateway_outcome(status))
