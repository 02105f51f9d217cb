"""Hypothesis-generated request bodies: never a 5xx, every 4xx in OpenAI's error shape.

Bodies mix the real field names with values of every JSON type (and sometimes valid ones), plus
raw bytes that are not JSON at all. One app (FakeSlotPool, small limits) serves every example.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from gateway_support import MODEL, make_runtime, serve_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slotserve.gateway.app import create_app
from starlette.testclient import TestClient

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

roles = st.sampled_from(["system", "user", "assistant", "tool", "developer", "wizard", ""])
content = st.one_of(
    st.text(max_size=40),
    st.none(),
    st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "image_url", 3]), "text": st.text(max_size=10)}
        ),
        max_size=3,
    ),
    json_values,
)
message = st.one_of(st.fixed_dictionaries({"role": roles, "content": content}), json_values)

# plausible values per field, mixed with arbitrary JSON
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": st.one_of(st.just(MODEL), st.text(max_size=8), json_values),
    "max_tokens": st.one_of(st.integers(-2, 80), json_values),
    "max_completion_tokens": st.one_of(st.integers(-2, 80), json_values),
    "temperature": st.one_of(st.floats(-1, 3, allow_nan=False), json_values),
    "top_p": st.one_of(st.floats(-0.5, 1.5, allow_nan=False), json_values),
    "top_k": st.one_of(st.integers(-3, 300), json_values),
    "min_p": st.one_of(st.floats(-0.5, 1.5, allow_nan=False), json_values),
    "presence_penalty": st.one_of(st.floats(-3, 3, allow_nan=False), json_values),
    "frequency_penalty": st.one_of(st.floats(-3, 3, allow_nan=False), json_values),
    "seed": st.one_of(st.integers(-(2**65), 2**65), json_values),
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=20), json_values),
    "stop_token_ids": st.one_of(st.lists(st.integers(-5, 400), max_size=3), json_values),
    "stream": st.one_of(st.booleans(), json_values),
    "stream_options": st.one_of(st.fixed_dictionaries({"include_usage": st.booleans()}), json_values),
    "n": st.one_of(st.integers(0, 3), json_values),
    "logprobs": json_values,
    "ignore_eos": st.one_of(st.booleans(), json_values),
    "tools": json_values,
    "response_format": st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}), json_values
    ),
    "echo": st.one_of(st.booleans(), json_values),
    "suffix": json_values,
    "unknown_extra": json_values,
}

chat_bodies = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(message, min_size=1, max_size=3), json_values)},
    optional=FIELDS,
)
completion_bodies = st.fixed_dictionaries(
    {
        "prompt": st.one_of(
            st.text(max_size=30),
            st.lists(st.integers(-5, 400), max_size=8),
            st.lists(st.text(max_size=5), max_size=2),
            json_values,
        )
    },
    optional=FIELDS,
)
tokenize_bodies = st.fixed_dictionaries(
    {},
    optional={
        "content": json_values,
        "prompt": json_values,
        "messages": json_values,
        "add_special": json_values,
        "tokens": json_values,
        "model": FIELDS["model"],
    },
)
raw_bytes = st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode))


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    runtime, _ = make_runtime(num_slots=2, ctx_len=256, max_queue=64)
    app = create_app(runtime, serve_config(max_tokens_limit=24, default_max_tokens=8, max_body_bytes=4096))
    with TestClient(app, raise_server_exceptions=True) as c:
        yield c


JSON = {"content-type": "application/json"}


def check(r: Any) -> None:
    assert r.status_code < 500, (r.status_code, r.text)
    if r.status_code >= 400:
        body = r.json()
        assert set(body) == {"error"}
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert isinstance(body["error"]["message"], str)
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.endswith("data: [DONE]\n\n")
    else:
        r.json()


FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(body=chat_bodies)
def test_fuzz_chat(client: TestClient, body: dict[str, Any]) -> None:
    check(client.post("/v1/chat/completions", content=json.dumps(body), headers=JSON))


@FUZZ
@given(body=completion_bodies)
def test_fuzz_completions(client: TestClient, body: dict[str, Any]) -> None:
    check(client.post("/v1/completions", content=json.dumps(body), headers=JSON))


@FUZZ
@given(body=tokenize_bodies, path=st.sampled_from(["/tokenize", "/detokenize"]))
def test_fuzz_tokenize(client: TestClient, body: dict[str, Any], path: str) -> None:
    check(client.post(path, content=json.dumps(body), headers=JSON))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    raw=raw_bytes,
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"]),
)
def test_fuzz_raw_bytes(client: TestClient, raw: bytes, path: str) -> None:
    check(client.post(path, content=raw, headers=JSON))
