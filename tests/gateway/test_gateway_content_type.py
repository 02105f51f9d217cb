"""JSON routes require `Content-Type: application/json` (415 otherwise, nothing generated), and
CORS is off unless --cors-allow-origin names the origins (then preflights are answered)."""

from __future__ import annotations

import json

import pytest
from gateway_support import MODEL, chat_body, make_runtime, running_app, serve_config
from slotserve.gateway.app import create_app

USER = {"role": "user", "content": "hello"}
BODY = json.dumps(chat_body([USER], max_tokens=2)).encode()
JSON_ROUTES = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"]


def generated(runtime) -> int:
    """Requests the scheduler admitted so far (each one reaches the pool as a forward)."""
    return runtime.extra["pool"].num_forward_calls


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",  # the "simple" cross-origin POST a web page can send without a preflight
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonx",
        "application/json; charset=latin-1",
    ],
)
@pytest.mark.parametrize("path", JSON_ROUTES)
async def test_a_body_that_is_not_declared_json_is_415(content_type: str | None, path: str) -> None:
    runtime, _ = make_runtime()
    app = create_app(runtime, serve_config())
    headers = {} if content_type is None else {"content-type": content_type}
    async with running_app(app) as client:
        r = await client.post(path, content=BODY, headers=headers)
    assert r.status_code == 415, r.text
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert err["code"] == "unsupported_media_type" and err["type"] == "invalid_request_error"
    assert "application/json" in err["message"]
    assert generated(runtime) == 0


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "Application/JSON",
        "application/json; charset=utf-8",
        'application/json;charset="UTF-8"',
    ],
)
async def test_json_with_or_without_a_utf8_charset_is_accepted(content_type: str) -> None:
    runtime, _ = make_runtime()
    app = create_app(runtime, serve_config())
    async with running_app(app) as client:
        r = await client.post("/v1/chat/completions", content=BODY, headers={"content-type": content_type})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == MODEL
    assert generated(runtime) > 0


async def test_cors_is_off_by_default() -> None:
    runtime, _ = make_runtime()
    app = create_app(runtime, serve_config())
    origin = {"origin": "http://evil.example"}
    async with running_app(app) as client:
        preflight = await client.options(
            "/v1/chat/completions",
            headers={
                **origin,
                "access-control-request-method": "POST",
                "access-control-request-headers": "content-type",
            },
        )
        plain = await client.get("/v1/models", headers=origin)
    assert preflight.status_code == 405  # no preflight answer: a browser sends no JSON POST
    assert "access-control-allow-origin" not in preflight.headers
    assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers


async def test_cors_allow_origin_answers_preflight_for_listed_origins_only() -> None:
    runtime, _ = make_runtime()
    app = create_app(runtime, serve_config(cors_allow_origin=("http://localhost:3000",), api_key="k"))
    ask = {
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, x-stainless-os",
    }
    async with running_app(app) as client:
        ok = await client.options("/v1/chat/completions", headers={"origin": "http://localhost:3000", **ask})
        other = await client.options("/v1/chat/completions", headers={"origin": "http://evil.example", **ask})
        post = await client.post(
            "/v1/chat/completions",
            json=chat_body([USER], max_tokens=2),
            headers={"origin": "http://localhost:3000", "authorization": "Bearer k"},
        )
        refused = await client.post(
            "/v1/chat/completions",
            json=chat_body([USER], max_tokens=2),
            headers={"origin": "http://localhost:3000"},
        )
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "POST" in ok.headers["access-control-allow-methods"]
    allowed = ok.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed
    assert "access-control-allow-credentials" not in ok.headers
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    assert post.status_code == 200 and post.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "x-request-id" in post.headers["access-control-expose-headers"].lower()
    # errors carry the header too, so a browser client can read the OpenAI error body
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == "http://localhost:3000"


@pytest.mark.parametrize("origin", ["localhost:3000", "http://a.example/", "http://a.example/path", ""])
def test_a_malformed_cors_origin_names_the_flag(origin: str) -> None:
    with pytest.raises(ValueError, match="--cors-allow-origin"):
        serve_config(cors_allow_origin=(origin,))
