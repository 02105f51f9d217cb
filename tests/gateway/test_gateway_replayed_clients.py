"""Replayed agent-client traffic (issue 25): the request shapes Claude Code, Codex and opencode
send, turn after turn, through the ASGI app over FakeSlotPool, with the divergence each turn
reports (part, offset) and the reuse that went with it; and a burst sharing a long prefix.

The byte tokenizer makes every offset exact: one token per byte of the ChatML rendering, one for
each special. A replayed assistant turn is the client's own text, not the fake model's bytes, so
every turn after the first diverges at the start of the previous answer: it reuses exactly the
previous prompt (`offset == len(previous prompt)`), unless a quirk broke the prefix earlier.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from gateway_support import (
    MODEL,
    ASGIDriver,
    body_of,
    chat_body,
    make_runtime,
    running_app,
    serve_config,
    wait_until,
)
from slotserve.gateway.app import create_app
from slotserve.metrics import ServerMetrics

SYSTEM = "You are an interactive CLI tool that helps users with software engineering tasks. " * 4
HEAD = len("<|im_start|>system\n") - len("<|im_start|>") + 1  # the opening special is one token
NONCE_AT = HEAD + len("x-anthropic-billing-header: cc_version=2.0.14; cc_entrypoint=cli; cch=")
TURNS = ["list the files under src/", "open src/main.py and explain it", "rename run to start"]
PROJECTS = ["alpha: ", "beta: "]  # each Claude Code session's own conversation
ANSWERS = ["There are three files.", "It parses arguments, then runs.", "Done: run is now start."]


def _tokens(text: str) -> int:
    """Tokens of ChatML text under the byte tokenizer (each special is one token)."""
    return len(text.encode()) - sum(text.count(s) * (len(s) - 1) for s in ("<|im_start|>", "<|im_end|>"))


def _chatml(messages: list[tuple[str, str]]) -> str:
    return "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in messages)


# ------------------------------------------------------------------ Claude Code over /v1/messages


def _reminder(turn: int) -> str:
    return f"<system-reminder>Context left until auto-compact: {90 - turn}%</system-reminder>"


def _nonce(turn: int, session: int) -> str:
    """A nonce whose first character differs for every request of the test."""
    return f"{2 * turn + session:x}{turn:04x}"


def _claude_code_body(turn: int, session: int = 0) -> dict[str, Any]:
    """Claude Code 2.x's shape at `turn`: a fresh billing nonce as the first system block, the
    system prompt (cache_control), every earlier turn replayed, a <system-reminder> text block
    trailing each user turn, and cache_control on the last block."""
    messages: list[dict[str, Any]] = []
    for k in range(turn + 1):
        blocks: list[dict[str, Any]] = [
            {"type": "text", "text": PROJECTS[session] + TURNS[k]},
            {"type": "text", "text": _reminder(k)},
        ]
        messages.append({"role": "user", "content": blocks})
        if k < turn:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": ANSWERS[k]}]})
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return {
        "model": MODEL,
        "max_tokens": 2,
        "temperature": 0,
        "system": [
            {
                "type": "text",
                "text": f"x-anthropic-billing-header: cc_version=2.0.14; cc_entrypoint=cli; cch={_nonce(turn, session)};",
            },
            {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
        ],
        "messages": messages,
    }


def _claude_code_prompt(turn: int, normalized: bool, session: int = 0) -> str:
    """The rendered prompt of `_claude_code_body(turn, session)`, without the generation prompt."""
    nonce = f"x-anthropic-billing-header: cc_version=2.0.14; cc_entrypoint=cli; cch={_nonce(turn, session)};"
    rendered: list[tuple[str, str]] = [("system", SYSTEM if normalized else f"{nonce}\n{SYSTEM}")]
    for k in range(turn + 1):
        rendered.append(("user", f"{PROJECTS[session]}{TURNS[k]}\n{_reminder(k)}"))
        if k < turn:
            rendered.append(("assistant", ANSWERS[k]))
    return _chatml(rendered)


@pytest.mark.parametrize(("normalize", "session_header"), [(False, True), (False, False), (True, True)])
async def test_claude_code_transcript(normalize: bool, session_header: bool) -> None:
    """Two Claude Code sessions interleaved on two slots. Without normalization every turn leaves
    the held prefix inside the nonce (system part, offset NONCE_AT): both slots tie, and the
    `X-Claude-Code-Session-Id` header keeps each session on its own slot (without it they swap
    slots; the reuse is the same either way); with `--normalize claude-code` each turn reuses the
    whole previous prompt and diverges at the previous answer (the assistant message)."""
    metrics = ServerMetrics()
    runtime, _ = make_runtime(num_slots=2, ctx_len=2048, metrics=metrics)
    config = serve_config(normalize=("claude-code",) if normalize else ())
    slots: dict[str, set[int]] = {"s-a": set(), "s-b": set()}  # where each session was served
    async with running_app(create_app(runtime, config, metrics=metrics)) as http:
        for turn in range(len(TURNS)):
            for n, session in enumerate(slots):
                r = await http.post(
                    "/v1/messages",
                    json=_claude_code_body(turn, n),
                    headers={"X-Claude-Code-Session-Id": session} if session_header else {},
                )
                assert r.status_code == 200, r.text
                got = r.json()
                info, use = got["slotserve"], got["usage"]
                prompt = _tokens(_claude_code_prompt(turn, normalize, n)) + _tokens("<|im_start|>assistant\n")
                assert (
                    use["input_tokens"] + use["cache_read_input_tokens"] + use["cache_creation_input_tokens"]
                    == prompt
                )
                assert use["cache_read_input_tokens"] == info["reused_tokens"]
                slots[session].add(info["slot"])
                div = info["divergence"]
                if turn == 0 and session == "s-a":
                    assert div["reason"] == "cold" and info["reused_tokens"] == 0
                    continue
                if turn == 0 and normalize:  # the other session's conversation: a different user turn
                    # index: the rendered chat messages' (the system prompt is message 0)
                    assert div["part"] == {"kind": "message", "index": 1, "role": "user"}
                    assert div["offset"] == _tokens(_chatml([("system", SYSTEM)]) + "<|im_start|>user\n")
                    assert div["offset"] == info["reused_tokens"]
                    continue
                if not normalize:
                    # the other session's slot (turn 0) or its own previous turn's, cut at the nonce
                    assert div["part"] == {"kind": "system", "index": 0, "role": "system"}
                    assert div["offset"] == NONCE_AT == info["reused_tokens"]
                    assert div["reason"] == "prompt_changed"
                    assert "x-slotserve-normalized" not in r.headers
                    continue
                assert r.headers["x-slotserve-normalized"] == "claude-code:billing-header"
                previous = _tokens(_claude_code_prompt(turn - 1, True, n)) + _tokens(
                    "<|im_start|>assistant\n"
                )
                assert div["offset"] == previous == info["reused_tokens"]
                assert div["part"] == {"kind": "message", "index": 2 * turn, "role": "assistant"}
                assert div["text_after"].startswith(ANSWERS[turn - 1][:20])
        text = (await http.get("/metrics")).text
    if not normalize:  # the tie-breaker engages only with the header
        kept = slots["s-a"].isdisjoint(slots["s-b"]) and all(len(s) == 1 for s in slots.values())
        assert kept == session_header, slots
    if normalize:
        assert 'slotserve_prefix_divergence_total{part="message",reason="prompt_changed"} 5.0' in text
    else:
        assert 'slotserve_prefix_divergence_total{part="system",reason="prompt_changed"} 5.0' in text


# ------------------------------------------------------------------ Codex over /v1/responses


def _codex_body(turn: int) -> dict[str, Any]:
    """Codex CLI's shape at `turn`: `store: false`, the whole conversation replayed as input items
    each turn (no previous_response_id), a `prompt_cache_key` naming the conversation."""
    items: list[dict[str, Any]] = []
    for k in range(turn + 1):
        items.append(
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TURNS[k]}]}
        )
        if k < turn:
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": ANSWERS[k]}],
                }
            )
    return {
        "model": MODEL,
        "instructions": SYSTEM,
        "input": items,
        "store": False,
        "prompt_cache_key": "019a-codex-conversation",
        "max_output_tokens": 2,
        "temperature": 0,
    }


async def test_codex_transcript_replays_everything_and_reuses_the_previous_prompt() -> None:
    runtime, pool = make_runtime(num_slots=2, ctx_len=2048)
    async with running_app(create_app(runtime, serve_config())) as http:
        for turn in range(len(TURNS)):
            r = await http.post("/v1/responses", json=_codex_body(turn))
            assert r.status_code == 200, r.text
            got = r.json()
            info = got["slotserve"]
            rendered = [("system", SYSTEM)]
            for k in range(turn + 1):
                rendered.append(("user", TURNS[k]))
                if k < turn:
                    rendered.append(("assistant", ANSWERS[k]))
            prompt = _tokens(_chatml(rendered)) + _tokens("<|im_start|>assistant\n")
            assert got["usage"]["input_tokens"] == prompt
            assert got["usage"]["input_tokens_details"]["cached_tokens"] == info["reused_tokens"]
            if turn == 0:
                assert info["divergence"]["reason"] == "cold" and info["reused_tokens"] == 0
                continue
            previous = _tokens(_chatml(rendered[:-2])) + _tokens("<|im_start|>assistant\n")
            div = info["divergence"]
            assert div["offset"] == previous == info["reused_tokens"]
            assert div["part"] == {"kind": "message", "index": 2 * turn, "role": "assistant"}
            assert div["reason"] == "prompt_changed"
            assert info["prefilled_tokens"] == prompt - previous
        # nothing was stored (store: false): a continuation by id is refused
        r = await http.post(
            "/v1/responses", json={**_codex_body(0), "previous_response_id": got["id"], "input": "next"}
        )
        assert r.status_code == 404


# ------------------------------------------------------------------ opencode over /v1/chat/completions


async def test_opencode_reminder_that_moves_names_the_message_it_left() -> None:
    """opencode appends a <system-reminder> to the latest user message and drops it from the one
    before: the next turn diverges inside the user message the reminder left, at its end."""
    reminder = "\n<system-reminder>Plan mode is active. Do not edit files.</system-reminder>"
    metrics = ServerMetrics()
    runtime, _ = make_runtime(num_slots=1, ctx_len=2048, metrics=metrics)
    async with running_app(create_app(runtime, serve_config(), metrics=metrics)) as http:
        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TURNS[0] + reminder}]
        r = await http.post("/v1/chat/completions", json=chat_body(first, max_tokens=2, temperature=0))
        assert r.json()["slotserve"]["divergence"]["reason"] == "cold"
        second = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": TURNS[0]},  # the reminder left this message
            {"role": "assistant", "content": ANSWERS[0]},
            {"role": "user", "content": TURNS[1] + reminder},
        ]
        r = await http.post("/v1/chat/completions", json=chat_body(second, max_tokens=2, temperature=0))
        info = r.json()["slotserve"]
        div = info["divergence"]
        assert div["part"] == {"kind": "message", "index": 1, "role": "user"}
        assert div["offset"] == _tokens(_chatml([("system", SYSTEM)]) + "<|im_start|>user\n" + TURNS[0])
        assert div["offset"] == info["reused_tokens"] and div["reason"] == "prompt_changed"
        assert div["text_before"].endswith(TURNS[0][-20:]) and div["text_after"].startswith("<|im_end|>")
        # the reminder stays put next turn (same messages, one more appended): no early divergence
        third = [*second, {"role": "assistant", "content": ANSWERS[1]}, {"role": "user", "content": TURNS[2]}]
        third[3] = {"role": "user", "content": TURNS[1]}  # and moves again: leaves message 3
        r = await http.post("/v1/chat/completions", json=chat_body(third, max_tokens=2, temperature=0))
        div = r.json()["slotserve"]["divergence"]
        assert div["part"] == {"kind": "message", "index": 3, "role": "user"}
        assert div["offset"] == _tokens(_chatml([(m["role"], m["content"]) for m in third[:3]])) + _tokens(
            "<|im_start|>user\n" + TURNS[1]
        )
        text = (await http.get("/metrics")).text
    assert 'slotserve_prefix_divergence_total{part="message",reason="prompt_changed"} 2.0' in text


# ------------------------------------------------------------------ a burst sharing a long prefix


async def _cold_answer(messages: list[dict[str, str]]) -> str:
    runtime, _ = make_runtime(num_slots=1, ctx_len=4096, reuse=False)
    async with running_app(create_app(runtime, serve_config())) as http:
        r = await http.post("/v1/chat/completions", json=chat_body(messages, max_tokens=8, temperature=0))
    return str(r.json()["choices"][0]["message"]["content"])


async def test_burst_sharing_a_long_prefix_is_prefilled_once_and_survives_the_first_cancel() -> None:
    """Three requests at once sharing a ~3,600-token system prompt: the prefix is computed once
    (the others wait for the first's prefill and take it over), and cancelling the first sender
    mid-prefill cancels only it; the others finish with the cold answer."""
    shared = "Repository map: " + " ".join(f"src/module_{i:03d}.py" for i in range(200))
    assert 3500 < len(shared) < 3700
    convs = [
        [{"role": "system", "content": shared}, {"role": "user", "content": f"question number {i}"}]
        for i in range(3)
    ]
    runtime, pool = make_runtime(num_slots=3, ctx_len=4096)
    hold = threading.Event()
    pool.forward_hook = lambda batch: hold.wait(0.002)  # a slower engine: the cancel lands mid-prefill
    app = create_app(runtime, serve_config())
    driver = ASGIDriver(app)
    gone = [asyncio.Event() for _ in convs]
    async with running_app(app):
        started = []
        for conv, ev in zip(convs, gone, strict=True):
            body = json.dumps(chat_body(conv, max_tokens=8, temperature=0)).encode()
            started.append(await driver.request("POST", "/v1/chat/completions", body, ev))
            await asyncio.sleep(0)
        await wait_until(lambda: pool.num_computed_tokens > 1000)
        gone[0].set()  # the first sender leaves mid-prefill
        for _, task in started:
            await asyncio.wait_for(task, 60)
    answers = [json.loads(body_of(sent)) for sent, _ in started[1:]]
    prompt = answers[0]["usage"]["prompt_tokens"]
    assert prompt > 3600
    # computed once: the shared prefix, each request's own question and answers, not three prefills
    assert prompt <= pool.num_computed_tokens < prompt + 3 * 40  # 3,689 for 3 x 3,661 when written
    reused = sorted(a["slotserve"]["reused_tokens"] for a in answers)
    assert reused[0] > 1000  # took over what the cancelled sender had prefilled
    assert reused[1] > 3500  # and the last one all of the shared prefix
    for a, conv in zip(answers, convs[1:], strict=True):
        assert a["choices"][0]["finish_reason"] in ("stop", "length")
        assert a["choices"][0]["message"]["content"] == await _cold_answer(conv)


async def test_streamed_messages_and_responses_carry_the_divergence() -> None:
    """Streamed, the Messages answer carries `slotserve` in message_delta and the Responses answer
    in its final response object: a second turn reports the previous answer as its divergence."""

    def sse_events(body: str) -> list[Any]:  # named events: the data lines' JSON
        return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]

    runtime, _ = make_runtime(num_slots=1, ctx_len=2048)
    async with running_app(create_app(runtime, serve_config(normalize=("claude-code",)))) as http:
        await http.post("/v1/messages", json=_claude_code_body(0))
        r = await http.post("/v1/messages", json={**_claude_code_body(1), "stream": True})
        (delta,) = [e for e in sse_events(r.text) if isinstance(e, dict) and e.get("type") == "message_delta"]
        info = delta["slotserve"]
        assert info["reused_tokens"] == delta["usage"]["cache_read_input_tokens"] > 0
        assert info["divergence"]["part"] == {"kind": "message", "index": 2, "role": "assistant"}
        assert info["divergence"]["offset"] == _tokens(_claude_code_prompt(0, True)) + _tokens(
            "<|im_start|>assistant\n"
        )

        await http.post("/v1/responses", json=_codex_body(0))
        r = await http.post("/v1/responses", json={**_codex_body(1), "stream": True})
        events = [e for e in sse_events(r.text) if isinstance(e, dict)]
        final = events[-1]["response"]
        assert events[-1]["type"] in ("response.completed", "response.incomplete")
        info = final["slotserve"]
        assert info["reused_tokens"] == final["usage"]["input_tokens_details"]["cached_tokens"] > 0
        assert info["divergence"]["part"] == {"kind": "message", "index": 2, "role": "assistant"}
