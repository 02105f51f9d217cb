"""Load-harness pieces without a server: SSE decoding, percentiles, the oracle, workloads,
traces, the results schema, driver config checks."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slotserve.bench.loadtest import report, results
from slotserve.bench.loadtest.client import Exchange, SendParams, _apply_chunk, request_body
from slotserve.bench.loadtest.driver import DriveConfig
from slotserve.bench.loadtest.oracle import PrefixTrie, Seen, oracle_from_ids, oracle_from_usage
from slotserve.bench.loadtest.sse import iter_sse
from slotserve.bench.loadtest.trace import load_trace, write_trace
from slotserve.bench.loadtest.workloads import (
    AgentConversation,
    ChatConversation,
    Outcome,
    RequestSpec,
    WorkloadConfig,
    build_conversations,
)

# ------------------------------------------------------------------ SSE


def test_sse_joins_data_lines_skips_comments_and_stops_at_done():
    lines = [
        ": keep-alive",
        "",
        'data: {"a": 1}',
        "",
        "event: message",
        "data:  two",
        "data:lines",
        "",
        "id: 7",
        "",
        "data: [DONE]",
        "",
        "data: after",
    ]
    assert list(iter_sse(lines)) == ['{"a": 1}', " two\nlines"]


def test_sse_flushes_an_event_without_its_blank_line():
    assert list(iter_sse(["data: last"])) == ["last"]
    assert list(iter_sse(["data: [DONE]"])) == []


@pytest.mark.parametrize("payload", ["null", "[1, 2]", '"text"', '{"choices": ["x"]}', '{"choices": "abc"}'])
async def test_a_malformed_stream_chunk_is_an_error_exchange_not_an_exception(payload: str):
    import httpx
    from slotserve.bench.loadtest.client import send

    body = f"data: {payload}\n\ndata: [DONE]\n\n".encode()
    transport = httpx.MockTransport(
        lambda request: httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
    )
    spec = RequestSpec(conversation_id="c", turn_index=0, max_tokens=4, prompt="hi")
    async with httpx.AsyncClient(transport=transport) as client:
        ex = await send(client, "http://t", spec, 0, SendParams(model="m"))
    assert ex.outcome is Outcome.ERROR
    assert ex.error is not None and "malformed" in ex.error


@pytest.mark.parametrize(
    "usage_extra, timings, cached",
    [
        ({"prompt_tokens_details": {"cached_tokens": 7}}, None, 7),
        ({}, {"cache_n": 5, "prompt_n": 4}, 5),  # llama.cpp before prompt_tokens_details
        ({"prompt_tokens_details": {"cached_tokens": 7}}, {"cache_n": 5}, 7),  # the standard field wins
        ({}, None, None),
    ],
)
async def test_cached_tokens_from_usage_or_llama_cpp_timings(usage_extra, timings, cached):
    import httpx
    from slotserve.bench.loadtest.client import send

    final: dict = {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 1, **usage_extra}}
    if timings is not None:
        final["timings"] = timings
    text = {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}
    body = f"data: {json.dumps(text)}\n\ndata: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode()
    transport = httpx.MockTransport(
        lambda request: httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
    )
    spec = RequestSpec(conversation_id="c", turn_index=0, max_tokens=1, prompt="hi")
    async with httpx.AsyncClient(transport=transport) as client:
        ex = await send(client, "http://t", spec, 0, SendParams(model="m"))
    assert ex.outcome is Outcome.OK and ex.prompt_tokens == 9
    assert ex.cached_tokens == cached


# ------------------------------------------------------------------ percentiles


@settings(deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.sampled_from([0, 50, 90, 99, 100]))
def test_percentile_matches_numpy_linear(values, q):
    assert report.percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-6)


def test_percentile_of_nothing_is_none():
    assert report.percentile([], 50) is None


# ------------------------------------------------------------------ oracle


def brute_force_oracle(items: list[Seen], in_flight: bool = True) -> list[int]:
    """The definition in oracle.py, pair by pair (`in_flight=False`: the once oracle, which
    never credits a prompt sent after the request's own)."""

    def lcp(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    out = []
    for i, r in enumerate(items):
        seen = [
            p.prompt_ids
            for j, p in enumerate(items)
            if j != i
            and (
                p.t_send < r.t_send
                or (p.t_send == r.t_send and j < i)
                or (in_flight and p.t_send < r.t_first)
            )
        ]
        seen += [p.prompt_ids + p.reply_ids for p in items if p.t_end <= r.t_send and p is not r]
        out.append(min(len(r.prompt_ids), max((lcp(r.prompt_ids, s) for s in seen), default=0)))
    return out


def test_trie_longest_prefix():
    trie = PrefixTrie()
    trie.insert([1, 2, 3, 4])
    trie.insert([1, 2, 5])
    assert trie.longest_prefix([1, 2, 3, 9]) == 3
    assert trie.longest_prefix([1, 2, 5, 6]) == 3
    assert trie.longest_prefix([7]) == 0
    assert trie.num_nodes == 5


def test_oracle_multi_turn_sees_reply_only_after_it_ended():
    p1 = [1, 2, 3]
    turn1 = Seen(t_send=0.0, t_first=0.1, t_end=1.0, prompt_ids=p1, reply_ids=[7, 8])
    turn2 = Seen(t_send=1.5, t_first=1.6, t_end=2.0, prompt_ids=p1 + [7, 8, 4, 5], reply_ids=[9])
    early = Seen(t_send=0.5, t_first=0.6, t_end=0.9, prompt_ids=p1 + [7, 8, 6], reply_ids=[])
    assert oracle_from_ids([turn1, turn2, early]) == [0, 5, 3]  # early: turn1's reply not yet seen


def test_oracle_credits_prompts_sent_before_the_first_token():
    system = [5] * 10
    a = Seen(t_send=0.0, t_first=1.0, t_end=2.0, prompt_ids=system + [1], reply_ids=[3])
    b = Seen(t_send=0.1, t_first=1.5, t_end=2.0, prompt_ids=system + [2], reply_ids=[3])
    c = Seen(t_send=3.0, t_first=3.5, t_end=4.0, prompt_ids=system + [1], reply_ids=[])
    # a and b overlap: each may reuse the other's system prompt; c repeats a's whole prompt.
    assert oracle_from_ids([a, b, c]) == [10, 10, 11]
    # computed once: a (sent first) computes the system prompt, b reuses it
    assert oracle_from_ids([a, b, c], in_flight=False) == [0, 10, 11]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_oracle_matches_brute_force(data):
    n = data.draw(st.integers(1, 12))
    items = []
    tokens = st.lists(st.integers(0, 2), max_size=6)
    for _ in range(n):
        t_send = data.draw(st.integers(0, 20)) / 2
        t_first = t_send + data.draw(st.integers(0, 6)) / 2
        t_end = t_first + data.draw(st.integers(1, 6)) / 2  # an exchange takes time
        items.append(Seen(t_send, t_first, t_end, data.draw(tokens), data.draw(tokens)))
    assert oracle_from_ids(items) == brute_force_oracle(items)
    once = oracle_from_ids(items, in_flight=False)
    assert once == brute_force_oracle(items, in_flight=False)
    assert all(o <= f for o, f in zip(once, oracle_from_ids(items)))


def make_exchange(
    spec: RequestSpec, index: int, t: float, text: str, prompt_tokens: int, completion_tokens: int
) -> Exchange:
    return Exchange(
        spec=spec,
        index=index,
        t_send=t,
        outcome=Outcome.OK,
        t_end=t + 1,
        token_times=[t + 0.5],
        text_parts=[text],
        prompt_tokens=prompt_tokens,
        cached_tokens=0,
        completion_tokens=completion_tokens,
    )


def test_usage_oracle_credits_whole_messages():
    sys_msg = {"role": "system", "content": "s"}
    u1, u2 = {"role": "user", "content": "q1"}, {"role": "user", "content": "q2"}
    first = RequestSpec("c", 0, 8, messages=(sys_msg, u1))
    verbatim = RequestSpec("c", 1, 8, messages=(sys_msg, u1, {"role": "assistant", "content": "hi"}, u2))
    rerendered = RequestSpec("c", 1, 8, messages=(sys_msg, u1, {"role": "assistant", "content": "hi!"}, u2))
    other = RequestSpec("d", 0, 8, messages=(sys_msg, u1))
    exs = [
        make_exchange(first, 0, 0.0, "hi", 30, 5),
        make_exchange(verbatim, 1, 2.0, "x", 50, 5),
        make_exchange(rerendered, 2, 4.0, "x", 51, 5),
        make_exchange(first, 3, 6.0, "x", 30, 5),
        make_exchange(other, 4, 8.0, "x", 30, 5),
    ]
    # prompt + reply; the prompt only; an exact repeat; another conversation is not compared.
    assert oracle_from_usage(exs) == [0, 35, 30, 30, 0]


# ------------------------------------------------------------------ workloads


def specs_of(conv, replies: int = 3) -> list[RequestSpec]:
    out = []
    while (spec := conv.next_request()) is not None and len(out) < 10:
        out.append(spec)
        outcome = Outcome.ABORTED if spec.abort_after_tokens else Outcome.OK
        conv.record_reply(spec, outcome, f"reply {spec.turn_index}  with\nspaces")
    return out


@pytest.mark.parametrize(
    "workload", ["multi-turn", "agent", "abort-resend", "shared-prefix", "oversubscribed"]
)
def test_workloads_are_seeded(workload):
    cfg = WorkloadConfig(seed=3, num_conversations=3, num_turns=2, system_len=20, turn_len=5)
    a = [specs_of(c) for c in build_conversations(workload, cfg)]
    b = [specs_of(c) for c in build_conversations(workload, cfg)]
    other = [
        specs_of(c)
        for c in build_conversations(
            workload, WorkloadConfig(seed=4, num_conversations=3, num_turns=2, system_len=20, turn_len=5)
        )
    ]
    assert a == b and a != other
    systems = {conv[0].messages[0]["content"] for conv in a}
    assert len(systems) == (1 if workload == "shared-prefix" else 3)
    assert len(next(iter(systems)).split()) >= 20


def test_chat_appends_the_reply_verbatim_and_resends_after_abort():
    conv = build_conversations(
        "abort-resend", WorkloadConfig(num_conversations=1, num_turns=2, abort_after=3)
    )[0]
    specs = specs_of(conv)
    assert [(s.turn_index, s.attempt, s.abort_after_tokens) for s in specs] == [
        (0, 0, 3),
        (0, 1, None),
        (1, 0, 3),
        (1, 1, None),
    ]
    assert specs[0].messages == specs[1].messages  # the resend is the same request
    assert specs[2].messages[:2] == specs[1].messages
    assert specs[2].messages[2] == {"role": "assistant", "content": "reply 0  with\nspaces"}


def test_agent_re_renders_the_reply_and_appends_the_tool_result():
    conv = build_conversations("agent", WorkloadConfig(num_conversations=1, num_turns=3, tool_result_len=7))[
        0
    ]
    assert isinstance(conv, AgentConversation)
    specs = specs_of(conv)
    assert len(specs) == 3  # two tool rounds and the final answer
    assistant, tool = specs[1].messages[2], specs[1].messages[3]
    assert assistant["role"] == "assistant"
    assert assistant["content"].startswith("reply 0 with spaces\n<tool_call>\n")
    assert json.loads(assistant["content"].split("\n")[2])["name"] == conv.tool_calls[0][0]
    assert tool == {"role": "tool", "tool_call_id": "call_0", "content": conv.tool_results[0]}
    assert len(tool["content"].split()) == 7
    assert specs[2].messages[:4] == specs[1].messages[:4]


def test_a_failed_turn_ends_the_conversation():
    conv = ChatConversation("c", "sys", ["a", "b"], reply_len=4)
    spec = conv.next_request()
    conv.record_reply(spec, Outcome.ERROR, "")
    assert conv.next_request() is None


def test_workload_config_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_turns must be >= 1"):
        WorkloadConfig(num_turns=0)
    with pytest.raises(ValueError, match="unknown workload"):
        build_conversations("chatty", WorkloadConfig())


def test_request_body_asks_for_usage_in_the_stream():
    spec = RequestSpec("c", 0, 9, prompt="hello")
    body = request_body(spec, SendParams(model="m", temperature=0.5, seed=7, ignore_eos=True))
    assert body == {
        "model": "m",
        "max_tokens": 9,
        "temperature": 0.5,
        "stream": True,
        "stream_options": {"include_usage": True},
        "prompt": "hello",
        "seed": 7,
        "ignore_eos": True,
    }
    assert "seed" not in request_body(spec, SendParams(model="m"))


# ------------------------------------------------------------------ traces


def test_trace_round_trip_groups_conversations(tmp_path: Path):
    specs = [
        RequestSpec("a", 0, 5, messages=({"role": "user", "content": "x"},), offset_s=0.0),
        RequestSpec("b", 0, 6, prompt="text", offset_s=0.5),
        RequestSpec("a", 1, 7, messages=({"role": "user", "content": "y"},), offset_s=1.0),
    ]
    path = tmp_path / "t.jsonl"
    write_trace(path, specs)
    convs = {c.conversation_id: c.specs for c in load_trace(path)}
    assert convs == {"a": [specs[0], specs[2]], "b": [specs[1]]}


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "t.jsonl:2: not valid JSON"),
        ('{"conversation_id": "a", "max_tokens": 3}', 'exactly one of "messages"'),
        ('{"conversation_id": "a", "prompt": "p", "max_tokens": 0}', '"max_tokens" must be'),
        ('{"conversation_id": "a", "prompt": "p", "max_tokens": 2, "offset_s": -1}', '"offset_s"'),
        ('{"conversation_id": "a", "prompt": "p", "max_tokens": 2, "when": 1}', "unknown keys"),
        ('{"conversation_id": "", "prompt": "p", "max_tokens": 2}', '"conversation_id"'),
        ('{"conversation_id": "a", "messages": [], "max_tokens": 2}', '"messages" must be'),
    ],
)
def test_trace_errors_name_the_line(tmp_path: Path, line: str, message: str):
    path = tmp_path / "t.jsonl"
    path.write_text('{"conversation_id": "a", "prompt": "ok", "max_tokens": 1}\n' + line + "\n")
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as info:
        load_trace(path)
    assert "t.jsonl:2" in str(info.value)


def test_empty_trace_is_refused(tmp_path: Path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        load_trace(path)


# ------------------------------------------------------------------ results and config


def make_results(num: int, seed: int = 0) -> results.Results:
    rng = random.Random(seed)
    records = []
    for i in range(num):
        ttft = rng.uniform(0.01, 0.5)
        itl = [rng.uniform(0.001, 0.02) for _ in range(4)]
        prompt = rng.randint(50, 100)
        records.append(
            results.RequestRecord(
                index=i,
                conversation_id=f"c{i % 3}",
                turn_index=i // 3,
                attempt=0,
                status="ok" if i % 5 else "error",
                http_status=200 if i % 5 else 500,
                error=None if i % 5 else "HTTP 500: boom",
                start_s=i * 0.1,
                ttft_s=ttft if i % 5 else None,
                e2e_s=ttft + sum(itl),
                itl_s=itl if i % 5 else [],
                max_tokens=5,
                prompt_tokens=prompt,
                cached_tokens=prompt // 2 if i % 5 else None,
                completion_tokens=5 if i % 5 else 0,
                oracle_cached_tokens=prompt - 1,
                finish_reason="length",
            )
        )
    cfg = results.RunConfig(
        url="http://127.0.0.1:1",
        model="m",
        workload="multi-turn",
        seed=seed,
        mode="closed",
        concurrency=2,
        rate=None,
        max_requests=None,
        duration_s=10.0,
        timeout_s=5.0,
        temperature=0.0,
        slo_ttft_s=0.2,
        sizes={"num_turns": 4},
        trace=None,
        started_at="2026-01-01T00:00:00+00:00",
    )
    return results.Results(
        config=cfg, requests=records, summary=report.summarize(records, 2.0, 0.2, "tokenize")
    )


def test_summary_counts_and_ratios():
    res = make_results(10)
    s = res.summary
    ok = [r for r in res.requests if r.status == "ok"]
    assert (s.num_requests, s.num_ok, s.num_errors) == (10, 8, 2)
    assert s.errors == {"HTTP 500: boom": 2}
    assert s.cached_tokens == sum(r.cached_tokens for r in ok)
    assert s.prompt_tokens == sum(r.prompt_tokens for r in ok)  # errors reported no usage
    assert s.oracle_cached_tokens == sum(r.oracle_cached_tokens for r in ok)
    assert s.reuse_ratio == s.cached_tokens / s.prompt_tokens
    assert s.ttft_p50 == report.percentile([r.ttft_s for r in ok], 50)
    assert s.itl_p50 == report.percentile([x for r in ok for x in r.itl_s], 50)
    good = sum(r.ttft_s <= 0.2 for r in ok)
    assert s.goodput_per_s == good / 2.0 and s.slo_attainment == good / 8
    assert s.output_tokens_per_s == 40 / 2.0
    assert {t: p.n for t, p in s.ttft_by_turn.items()} == {0: 2, 1: 2, 2: 3, 3: 1}  # i // 3, i % 5 fail
    returning = [r.ttft_s for r in ok if r.turn_index >= 1]
    assert s.ttft_returning is not None and s.ttft_returning.n == len(returning) == 6
    assert s.ttft_returning.p50 == report.percentile(returning, 50)
    assert s.ttft_returning.p99 == report.percentile(returning, 99)
    firsts = [r for r in res.requests if r.turn_index == 0]  # no returning turn: None
    assert report.summarize(firsts, 1.0, 0.2, "tokenize").ttft_returning is None


def test_results_round_trip_and_bad_files(tmp_path: Path):
    res = make_results(7)
    path = tmp_path / "r.json"
    results.save(res, path)
    assert results.load(path) == res
    raw = json.loads(path.read_text())
    raw["summary"]["ttft_p50"] = "fast"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="not a loadtest results file"):
        results.load(path)
    raw["summary"]["ttft_p50"] = 0.1
    raw["schema"] = "other/9"
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="schema"):
        results.load(path)


def test_compare_rows_and_ratios():
    a, b = make_results(10, seed=1), make_results(10, seed=2)
    rows = {label: (va, vb) for label, _, va, vb in report.compare_rows(a.summary, b.summary)}
    assert rows["TTFT p50"] == (a.summary.ttft_p50, b.summary.ttft_p50)
    assert rows["TTFT p50 turn 2"] == (a.summary.ttft_by_turn[2].p50, b.summary.ttft_by_turn[2].p50)
    assert rows["TTFT p50 turns >= 1"] == (a.summary.ttft_returning.p50, b.summary.ttft_returning.p50)
    assert report.ratio(2.0, 3.0) == 1.5 and report.ratio(0.0, 1.0) is None
    assert report.ratio(None, 1.0) is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "exactly one of"),
        ({"concurrency": 2, "rate": 1.0}, "exactly one of"),
        ({"concurrency": 0}, "--concurrency must be >= 1"),
        ({"rate": -1.0}, "--rate must be > 0"),
        ({"concurrency": 1, "max_requests": 0}, "--requests must be >= 1"),
        ({"concurrency": 1, "duration_s": 0.0}, "--duration must be > 0"),
        ({"concurrency": 1, "base_url": "127.0.0.1:8080"}, "must start with http"),
    ],
)
def test_drive_config_rejects_bad_flags(kwargs, message):
    base = {"base_url": "http://127.0.0.1:8080", "params": SendParams(model="m")}
    with pytest.raises(ValueError, match=message):
        DriveConfig(**(base | kwargs))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--workload", "multi-turn", "--concurrency", "0"], "--concurrency must be >= 1"),
        (["--workload", "trace"], "--workload trace needs --trace FILE"),
        (["--workload", "agent", "--trace", "t.jsonl"], "--trace needs --workload trace"),
        (["--workload", "agent", "--turns", "0"], "num_turns must be >= 1"),
        (["--workload", "agent", "--timeout", "0"], "--timeout must be > 0"),
    ],
)
def test_cli_refuses_bad_flags_before_connecting(flags, message, tmp_path: Path, capsys):
    from slotserve.cli import main

    # Port 9 (discard) on loopback: never contacted, the flags are refused first.
    rc = main(
        [
            "loadtest",
            "run",
            "--url",
            "http://127.0.0.1:9",
            "--json",
            str(tmp_path / "r.json"),
            "--quiet",
            *flags,
        ]
    )
    assert rc == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_cli_workload_choices_are_the_workloads_presets_and_trace():
    from slotserve.bench.loadtest.cli import WORKLOADS
    from slotserve.bench.loadtest.workloads import PRESETS, SYNTHETIC_WORKLOADS

    assert WORKLOADS == (*SYNTHETIC_WORKLOADS, *PRESETS, "trace")
    for preset in PRESETS.values():
        assert preset.workload in SYNTHETIC_WORKLOADS


def test_code_edit_sends_a_file_and_asks_for_it_back() -> None:
    from slotserve.bench.loadtest.workloads import Outcome, WorkloadConfig, build_conversations

    (conv,) = build_conversations("code-edit", WorkloadConfig(num_conversations=1, num_turns=2))
    first = conv.next_request()
    assert first is not None and first.messages is not None
    ask = first.messages[-1]["content"]
    assert ask.count("\n") > 200 and "```python" in ask and "def " in ask and "Rename the function" in ask
    conv.record_reply(first, Outcome.OK, "```python\nthe file\n```")
    second = conv.next_request()
    assert second is not None and second.messages is not None
    assert second.messages[-2] == {"role": "assistant", "content": "```python\nthe file\n```"}
    assert "Rename the function" in second.messages[-1]["content"]
    assert build_conversations("code-edit", WorkloadConfig(num_conversations=1))[0].next_request() == first


def test_claude_code_sends_a_fresh_nonce_trailing_reminders_and_its_session_header() -> None:
    from slotserve.bench.loadtest.workloads import Outcome, WorkloadConfig, build_conversations

    a, b = build_conversations("claude-code", WorkloadConfig(num_conversations=2, num_turns=2))
    first = a.next_request()
    assert first is not None and first.messages is not None
    system = first.messages[0]["content"]
    assert system.startswith("x-anthropic-billing-header: cc_version=") and "; cch=" in system
    assert first.messages[-1]["content"].endswith("%</system-reminder>")
    a.record_reply(first, Outcome.OK, "a reply")
    second = a.next_request()
    assert second is not None and second.messages is not None
    assert second.messages[0]["content"] != system  # a new nonce on every request
    assert second.messages[0]["content"].split("\n", 1)[1] == system.split("\n", 1)[1]
    assert second.messages[1:3] == (first.messages[1], {"role": "assistant", "content": "a reply"})
    assert dict(first.headers) == dict(second.headers)  # one session id per conversation
    other = b.next_request()
    assert other is not None and dict(other.headers) != dict(first.headers)
    assert "X-Claude-Code-Session-Id" in dict(first.headers)
    again = build_conversations("claude-code", WorkloadConfig(num_conversations=1, num_turns=2))[0]
    assert again.next_request() == first  # seeded


def test_codex_replays_everything_with_a_prompt_cache_key() -> None:
    from slotserve.bench.loadtest.client import SendParams, request_body
    from slotserve.bench.loadtest.workloads import Outcome, WorkloadConfig, build_conversations

    (conv,) = build_conversations("codex", WorkloadConfig(num_conversations=1, num_turns=2))
    first = conv.next_request()
    assert first is not None
    conv.record_reply(first, Outcome.OK, "done")
    second = conv.next_request()
    assert second is not None and second.messages is not None and first.messages is not None
    assert second.messages[: len(first.messages)] == first.messages  # the whole conversation again
    body = request_body(second, SendParams(model="m"))
    assert body["prompt_cache_key"] == dict(first.extra_body)["prompt_cache_key"] != ""


def test_claude_code_speaks_messages_in_claude_codes_blocks() -> None:
    import time as _time

    from slotserve.bench.loadtest.client import Exchange, SendParams, _apply_event, endpoint, messages_body
    from slotserve.bench.loadtest.workloads import Outcome, WorkloadConfig, build_conversations

    (conv,) = build_conversations("claude-code", WorkloadConfig(num_conversations=1, num_turns=2))
    first = conv.next_request()
    assert first is not None and first.messages is not None
    conv.record_reply(first, Outcome.OK, "a reply")
    spec = conv.next_request()
    assert spec is not None and spec.messages is not None and endpoint(spec) == "/v1/messages"
    body = messages_body(spec, SendParams(model="m"))
    nonce_block, system_block = body["system"]
    assert nonce_block["text"].startswith("x-anthropic-billing-header:") and "\n" not in nonce_block["text"]
    assert nonce_block["text"] + "\n" + system_block["text"] == spec.messages[0]["content"]
    user = body["messages"][0]["content"]
    assert [b["text"] for b in user][1].startswith("<system-reminder>")
    assert "\n".join(b["text"] for b in user) == spec.messages[1]["content"]  # the server's join
    assert body["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": "a reply"}]}
    assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert sum("cache_control" in b for m in body["messages"] for b in m["content"]) == 1

    ex = Exchange(spec=spec, index=0, t_send=_time.perf_counter())
    _apply_event(
        ex, {"type": "message_start", "message": {"usage": {"input_tokens": 90, "output_tokens": 0}}}, 1.0
    )
    _apply_event(
        ex, {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}, 2.0
    )
    usage = {
        "input_tokens": 5,
        "output_tokens": 1,
        "cache_read_input_tokens": 80,
        "cache_creation_input_tokens": 5,
    }
    _apply_event(ex, {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": usage}, 3.0)
    assert (ex.prompt_tokens, ex.cached_tokens, ex.completion_tokens) == (90, 80, 1)
    assert ex.text == "Hi" and ex.token_times == [2.0] and ex.finish_reason == "end_turn"
    # llama.cpp's server: the cache in message_start, only output_tokens in message_delta
    ex = Exchange(spec=spec, index=0, t_send=_time.perf_counter())
    start = {"usage": {"input_tokens": 10, "cache_read_input_tokens": 80, "output_tokens": 0}}
    _apply_event(ex, {"type": "message_start", "message": start}, 1.0)
    _apply_event(ex, {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 7}}, 3.0)
    assert (ex.prompt_tokens, ex.cached_tokens, ex.completion_tokens) == (90, 80, 7)


def test_codex_speaks_responses_as_codex_does() -> None:
    import time as _time

    from slotserve.bench.loadtest.client import (
        Exchange,
        SendParams,
        _apply_response_event,
        endpoint,
        responses_body,
    )
    from slotserve.bench.loadtest.workloads import Outcome, WorkloadConfig, build_conversations

    (conv,) = build_conversations("codex", WorkloadConfig(num_conversations=1, num_turns=2))
    first = conv.next_request()
    assert first is not None and first.messages is not None
    conv.record_reply(first, Outcome.OK, "done")
    spec = conv.next_request()
    assert spec is not None and endpoint(spec) == "/v1/responses"
    body = responses_body(spec, SendParams(model="m"))
    assert body["store"] is False and body["instructions"] == first.messages[0]["content"]
    assert [(i["role"], i["content"][0]["type"]) for i in body["input"]] == [
        ("user", "input_text"),
        ("assistant", "output_text"),
        ("user", "input_text"),
    ]
    assert body["input"][1]["content"][0]["text"] == "done" and body["prompt_cache_key"]

    ex = Exchange(spec=spec, index=0, t_send=_time.perf_counter())
    _apply_response_event(ex, {"type": "response.output_text.delta", "delta": "Hi"}, 2.0)
    usage = {"input_tokens": 90, "input_tokens_details": {"cached_tokens": 80}, "output_tokens": 1}
    _apply_response_event(
        ex, {"type": "response.completed", "response": {"status": "completed", "usage": usage}}, 3.0
    )
    assert (ex.prompt_tokens, ex.cached_tokens, ex.completion_tokens) == (90, 80, 1)
    assert ex.text == "Hi" and ex.finish_reason == "completed"


def test_logprobs_time_tokens_that_print_nothing():
    """--logprobs: the body asks for logprobs, and a chunk whose token prints nothing (a
    random-weight model's padding tokens) still stamps TTFT through its logprob entry; without
    --logprobs (an abort asks for logprobs to count tokens) such a chunk stamps nothing."""
    spec = RequestSpec("c", 0, 4, messages=({"role": "user", "content": "x"},))
    assert request_body(spec, SendParams(model="m", logprobs=True))["logprobs"] is True
    assert "logprobs" not in request_body(spec, SendParams(model="m"))
    silent = {
        "choices": [{"delta": {"content": ""}, "logprobs": {"content": [{"token": "", "logprob": -1.0}]}}]
    }
    for chunk, timed, want in (
        (silent, True, [1.0]),
        (silent, False, []),  # an abort's logprobs count tokens but time none
        ({"choices": [{"delta": {"content": ""}}]}, True, []),
    ):
        ex = Exchange(spec=spec, index=0, t_send=0.0, time_logprobs=timed)
        _apply_chunk(ex, chunk, 1.0)
        assert ex.token_times == want and not ex.text_parts and ex.tokens_streamed == (chunk is silent)
