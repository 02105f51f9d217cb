"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Every failure a handler can meet becomes an `APIError` with its HTTP status; `error_response`
renders it. `json_response` is the one way a JSON body (error or not) leaves the gateway.
`from_decode_error` maps msgspec's decode/validation messages (which end in "- at `$.field`")
to a 400 whose `param` names the field. Only a bug in slotserve may produce a 500; bad input
never does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec
from starlette.responses import Response


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody


class APIError(Exception):
    """An HTTP error a handler raises; rendered by `error_response`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> ErrorEnvelope:
        return ErrorEnvelope(ErrorBody(self.message, self.type, self.param, self.code))


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(name: str, served: tuple[str, ...]) -> APIError:
    return APIError(
        404,
        f"The model `{name}` does not exist; this server serves: {', '.join(served)}",
        code="model_not_found",
        param="model",
    )


def unauthorized() -> APIError:
    return APIError(
        401,
        "Missing or incorrect API key; send it as 'Authorization: Bearer KEY' (or 'x-api-key: KEY')",
        type="authentication_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def body_too_large(limit: int) -> APIError:
    return APIError(413, f"Request body exceeds the limit of {limit} bytes", code="request_too_large")


def unsupported_media_type(got: str | None) -> APIError:
    return APIError(
        415,
        f"Content-Type must be application/json (got {got or 'none'})",
        code="unsupported_media_type",
    )


class BodyTimeout(APIError):
    """The request body did not arrive within --body-timeout-s of its head (raised by the
    receive() that `http_guard.HTTPGuard` hands the app). The connection is closed after the 408."""

    def __init__(self, timeout_s: float):
        super().__init__(
            408,
            f"The request body did not arrive within {timeout_s:g}s",
            code="request_timeout",
            headers={"Connection": "close"},
        )


def client_closed() -> APIError:
    """What a request whose client left is answered (nobody reads it; uvicorn drops it)."""
    return APIError(499, "client closed the request", code="client_closed_request")


def queue_full(retry_after_s: float) -> APIError:
    seconds = max(1, int(retry_after_s + 0.999))
    return APIError(
        429,
        f"The server is busy: the request queue is full; retry after {seconds}s",
        type="rate_limit_error",
        code="queue_full",
        headers={"Retry-After": str(seconds)},
    )


def draining() -> APIError:
    return APIError(
        503,
        "The server is shutting down and admits no new requests",
        type="service_unavailable_error",
        code="draining",
    )


def not_ready(reason: str) -> APIError:
    return APIError(503, reason, type="service_unavailable_error", code="not_ready")


def internal_error(message: str = "Internal server error") -> APIError:
    return APIError(500, message, type="server_error", code="internal_error")


_AT_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def from_decode_error(exc: msgspec.DecodeError) -> APIError:
    """A 400 for a body that is not JSON or does not match the request Struct."""
    text = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        return bad_request(f"Request body is not valid JSON: {text}", code="invalid_json")
    param = None
    found = _AT_PATH.search(text)
    if found:
        # "$.messages[0].role" -> "messages[0].role"
        param = found.group("path").lstrip(".") or None
        text = text[: found.start()]
    return bad_request(f"Invalid request: {text}", param=param, code="invalid_value")


_encoder = msgspec.json.Encoder()


def json_response(body: object, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """`body` (msgspec Structs, dicts, lists, ...) as an application/json response."""
    return Response(_encoder.encode(body), status_code=status, headers=headers, media_type="application/json")


def error_response(err: APIError) -> Response:
    return json_response(err.body(), err.status, err.headers)
