"""The load harness end to end against the mock server of `loadtest_support` (no model).

Every synthetic workload, the oracle against the mock's exact cache, aborts that really
disconnect, the open loop, budgets in requests and time, trace replay at offsets, HTTP errors,
an unreachable URL, the JSON round trip, plots and `compare`.
"""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path

import pytest
from loadtest_support import MAX_TOKENS_LIMIT, SMALL, MockServer, assert_consistent, run_loadtest
from rich.console import Console
from slotserve.bench.loadtest import report, results
from slotserve.bench.loadtest.plots import PLOT_FILES
from slotserve.bench.loadtest.trace import write_trace
from slotserve.bench.loadtest.workloads import (
    SYNTHETIC_WORKLOADS,
    RequestSpec,
    WorkloadConfig,
    num_planned_requests,
)

from slotserve.cli import main as slotserve_main


# Function scope: the oracle assumes the server saw nothing before the run.
@pytest.fixture
def reuse_server():
    with MockServer(reuse=True) as server:
        yield server


@pytest.fixture
def no_reuse_server():
    with MockServer(reuse=False) as server:
        yield server


@pytest.mark.parametrize("workload", SYNTHETIC_WORKLOADS)
def test_workload_reuses_with_cache(reuse_server: MockServer, workload: str, tmp_path: Path):
    res = run_loadtest(reuse_server.url, workload, tmp_path / "r.json", "--concurrency", "2")
    assert_consistent(res, one_chunk_per_token=True)
    cfg = WorkloadConfig(
        num_conversations=res.config.sizes["num_conversations"], num_turns=res.config.sizes["num_turns"]
    )
    assert len(res.requests) == num_planned_requests(workload, cfg)
    assert res.summary.num_errors == 0
    assert res.summary.oracle_source == "tokenize"
    later = [r for r in res.requests if r.status == "ok" and (r.turn_index >= 1 or r.attempt == 1)]
    if workload != "shared-prefix":
        assert later, "the workload has second turns or resends"
    for r in later:  # turn >= 2 (or a resend) reuses, exactly up to the mock's cap
        assert r.cached_tokens > 0
        assert r.cached_tokens == min(r.oracle_cached_tokens, r.prompt_tokens - 1)
    if workload == "shared-prefix":  # after the first users, every one reuses the system prompt
        firsts = sorted(res.requests, key=lambda r: r.start_s)[2:]
        assert all(r.cached_tokens > 60 for r in firsts)
        # the first user computes it: the once oracle credits it to the rest, the oracle to all
        first = min(res.requests, key=lambda r: r.start_s)
        assert first.oracle_once_cached_tokens < 60 < first.oracle_cached_tokens
    s = res.summary
    counted = [r for r in res.requests if r.cached_tokens is not None and r.prompt_tokens is not None]
    assert s.oracle_once_cached_tokens == sum(r.oracle_once_cached_tokens for r in counted)
    assert s.cached_tokens <= s.oracle_once_cached_tokens <= s.oracle_cached_tokens
    if workload == "abort-resend":
        aborted = [r for r in res.requests if r.status == "aborted"]
        assert len(aborted) == res.summary.num_aborted == len(res.requests) // 2
        assert all(r.attempt == 0 and r.completion_tokens == 4 for r in aborted)
        resends = [r for r in res.requests if r.attempt == 1]
        assert all(r.cached_tokens == r.prompt_tokens - 1 for r in resends)
    if workload == "agent":  # the re-rendered reply matches up to the mock's line break
        prev = {(r.conversation_id, r.turn_index): r for r in res.requests}
        for r in later:
            p = prev[(r.conversation_id, r.turn_index - 1)]
            assert r.oracle_cached_tokens == p.prompt_tokens + 2 < p.prompt_tokens + p.completion_tokens


def test_abort_disconnects_the_server(tmp_path: Path):
    with MockServer(reuse=True, token_delay_s=0.02) as server:  # aborts come mid-stream
        res = run_loadtest(
            server.url,
            "abort-resend",
            tmp_path / "a.json",
            "--concurrency",
            "2",
            "--conversations",
            "2",
            "--turns",
            "2",
        )
        assert server.llm.num_disconnects == res.summary.num_aborted == 4


@pytest.mark.parametrize(("llama_cpp", "after"), [(False, 4), (False, 1), (True, 1)])
def test_abort_counts_tokens_that_print_nothing(tmp_path: Path, llama_cpp: bool, after: int):
    # replies of tokens without text (UNUSED ones): the abort still comes after `after` tokens,
    # from the logprobs each chunk carries (llama.cpp's server: only its first token's chunk)
    with MockServer(reuse=True, token_delay_s=0.02, empty_replies=True, llama_cpp=llama_cpp) as server:
        res = run_loadtest(
            server.url,
            "abort-resend",
            tmp_path / "e.json",
            "--conversations",
            "2",
            "--turns",
            "2",
            "--abort-after",
            str(after),
        )
        assert server.llm.num_disconnects == res.summary.num_aborted == 4
        assert all(after <= n < 6 for n in server.llm.generated_at_disconnect), (
            server.llm.generated_at_disconnect
        )
    aborted = [r for r in res.requests if r.status == "aborted"]
    assert len(aborted) == 4 and all(r.attempt == 0 and r.ttft_s is None for r in aborted)  # no text
    resends = [r for r in res.requests if r.attempt == 1]
    assert len(resends) == 4 and all(
        r.status == "ok" and r.cached_tokens == r.prompt_tokens - 1 for r in resends
    )


def test_no_reuse_reports_zero_cached_but_oracle_positive(no_reuse_server: MockServer, tmp_path: Path):
    res = run_loadtest(no_reuse_server.url, "multi-turn", tmp_path / "n.json", "--concurrency", "2")
    assert_consistent(res, one_chunk_per_token=True)
    assert res.summary.cached_tokens == 0 and res.summary.reuse_ratio == 0.0
    later = [r for r in res.requests if r.turn_index >= 1]
    assert later and all(r.cached_tokens == 0 and r.oracle_cached_tokens > 0 for r in later)
    # The oracle does not depend on the server's cache: same workload, same oracle.
    assert res.summary.oracle_reuse_ratio > 0.5


def test_json_round_trips_and_plots_are_written(reuse_server: MockServer, tmp_path: Path):
    out = tmp_path / "m.json"
    res = run_loadtest(
        reuse_server.url, "multi-turn", out, "--concurrency", "2", "--plots", str(tmp_path / "plots")
    )
    again = tmp_path / "again.json"
    results.save(res, again)
    assert results.load(again) == res
    raw = json.loads(out.read_text())
    for key in (
        "ttft_p50",
        "ttft_p90",
        "ttft_p99",
        "itl_p50",
        "e2e_p50",
        "requests_per_s",
        "output_tokens_per_s",
        "reuse_ratio",
        "oracle_reuse_ratio",
        "oracle_once_reuse_ratio",
    ):
        assert key in raw["summary"]
    assert len(raw["requests"]) == raw["summary"]["num_requests"] == 8
    for name in PLOT_FILES:
        png = (tmp_path / "plots" / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 5000


def test_oracle_falls_back_to_usage_without_tokenize(tmp_path: Path):
    with MockServer(reuse=True, has_tokenize=False) as server:
        res = run_loadtest(server.url, "multi-turn", tmp_path / "u.json", "--concurrency", "2")
    assert res.summary.oracle_source == "usage"
    assert_consistent(res, one_chunk_per_token=True)
    # Replies appended verbatim: the estimate credits the previous prompt + reply, which is
    # exactly what the mock reuses; it misses what is shared inside a message (the first turns
    # of different conversations share a few template tokens), which the mock reuses.
    for r in res.requests:
        if r.turn_index:
            assert r.oracle_cached_tokens == r.cached_tokens > 0
        else:
            assert r.oracle_cached_tokens == 0


@pytest.mark.parametrize("workload", ["multi-turn", "abort-resend"])
def test_llama_cpp_dialect_gives_the_exact_oracle(workload: str, tmp_path: Path):
    # llama.cpp's server answers /tokenize {"prompt": ...} with no tokens and reports cached
    # tokens as timings.cache_n: the harness must find its dialect, not report an empty oracle.
    with MockServer(reuse=True, llama_cpp=True) as server:
        res = run_loadtest(server.url, workload, tmp_path / "l.json", "--concurrency", "2")
        num_templates = server.llm.num_apply_template
    assert_consistent(res, one_chunk_per_token=True)
    s = res.summary
    assert s.oracle_source == "tokenize" and s.oracle_len_mismatches == 0
    assert num_templates == len(res.requests)  # every chat prompt rendered by the server
    ok = [r for r in res.requests if r.status == "ok"]
    assert ok and all(r.cached_tokens is not None for r in ok)  # read from timings.cache_n
    later = [r for r in ok if r.turn_index >= 1 or r.attempt == 1]
    assert later and s.cached_tokens > 0
    for r in later:  # as with slotserve's dialect: exactly the mock's cache, capped
        assert r.cached_tokens == min(r.oracle_cached_tokens, r.prompt_tokens - 1) > 0
    with MockServer(reuse=True) as server:  # the other dialect never renders through the server
        run_loadtest(server.url, workload, tmp_path / "m.json", "--concurrency", "2")
        assert server.llm.num_apply_template == 0


def test_sessions_preset_is_multi_turn_at_issue_16_sizes(tmp_path: Path):
    out = tmp_path / "s.json"
    with MockServer(reuse=True) as server:  # the preset's own sizes, first 4 requests
        argv = ["loadtest", "run", "--url", server.url, "--workload", "sessions", "--quiet"]
        assert slotserve_main([*argv, "--json", str(out), "--requests", "4"]) == 0
    res = results.load(out)
    assert res.config.workload == "sessions" and (res.config.mode, res.config.concurrency) == ("closed", 4)
    assert res.config.sizes == {
        "num_conversations": 8,
        "num_turns": 3,
        "system_len": 1400,
        "turn_len": 40,
        "reply_len": 32,
        "tool_result_len": 80,
        "abort_after": 4,
    }
    assert len(res.requests) == 4 and all(r.prompt_tokens > 1400 for r in res.requests)
    # The same requests as multi-turn at those sizes (explicit flags still win over the preset).
    runs = {}
    for workload, extra in (("sessions", []), ("multi-turn", ["--conversations", "8", "--turns", "3"])):
        with MockServer(reuse=True) as server:
            runs[workload] = run_loadtest(server.url, workload, tmp_path / f"{workload}.json", *extra)
    assert len(runs["sessions"].requests) == 24
    prompts = {
        w: sorted((r.conversation_id, r.turn_index, r.prompt_tokens) for r in res.requests)
        for w, res in runs.items()
    }
    assert prompts["sessions"] == prompts["multi-turn"]
    assert runs["sessions"].summary.ttft_returning.n == 16
    with MockServer(reuse=True) as server:  # and as an open loop: 8 conversations still
        opened = run_loadtest(server.url, "sessions", tmp_path / "o.json", "--rate", "100")
    assert opened.config.mode == "open" and opened.config.sizes["num_conversations"] == 8
    assert len(opened.requests) == 24


def test_request_budget_and_open_loop(reuse_server: MockServer, tmp_path: Path):
    res = run_loadtest(
        reuse_server.url, "oversubscribed", tmp_path / "o.json", "--rate", "200", "--requests", "10"
    )
    assert_consistent(res, one_chunk_per_token=True)
    assert res.config.mode == "open" and res.summary.num_requests == 10
    # 32 conversations round-robin: the first 10 requests are 10 different first turns.
    assert len({r.conversation_id for r in res.requests}) == 10


def test_duration_stops_dispatch(tmp_path: Path):
    with MockServer(reuse=True, token_delay_s=0.1) as server:  # 6 tokens: >= 0.6 s a request
        res = run_loadtest(
            server.url, "multi-turn", tmp_path / "d.json", "--concurrency", "2", "--duration", "0.3"
        )
    assert res.summary.num_requests == 2  # one per worker, then the deadline passed
    assert all(r.status == "ok" for r in res.requests)  # in-flight requests finished


def test_trace_replay_at_offsets(reuse_server: MockServer, tmp_path: Path):
    system = {"role": "system", "content": "You are terse. " * 20}
    specs = []
    for i in range(3):
        msgs = (system, {"role": "user", "content": f"question {i}"})
        specs.append(
            RequestSpec(conversation_id="c0", turn_index=i, max_tokens=4, messages=msgs, offset_s=0.05 * i)
        )
    specs.append(
        RequestSpec(
            conversation_id="c1", turn_index=0, max_tokens=3, prompt="plain text prompt", offset_s=0.2
        )
    )
    trace = tmp_path / "t.jsonl"
    write_trace(trace, specs)
    res = run_loadtest(reuse_server.url, "trace", tmp_path / "t.json", "--trace", str(trace))
    assert_consistent(res, one_chunk_per_token=True)
    assert res.config.mode == "offsets" and res.summary.num_ok == 4
    for r, spec in zip(res.requests, specs):
        assert r.start_s >= spec.offset_s  # never early
        assert r.completion_tokens == spec.max_tokens
    assert [r.turn_index for r in res.requests] == [0, 1, 2, 0]
    assert all(r.cached_tokens > 40 for r in res.requests[1:3])  # the shared system prompt


def test_http_errors_are_recorded(reuse_server: MockServer, tmp_path: Path):
    out = tmp_path / "e.json"
    rc = slotserve_main(
        [
            "loadtest",
            "run",
            "--url",
            reuse_server.url,
            "--workload",
            "shared-prefix",
            "--json",
            str(out),
            *SMALL,
            "--reply-len",
            str(MAX_TOKENS_LIMIT + 1),
            "--conversations",
            "3",
        ]
    )
    assert rc == 1  # nothing succeeded
    res = results.load(out)
    assert res.summary.num_errors == 3 and res.summary.num_ok == 0
    assert all(r.http_status == 400 for r in res.requests)
    assert res.summary.errors == {f"HTTP 400: max_tokens must be <= {MAX_TOKENS_LIMIT}": 3}


def test_unreachable_url_exits_2(tmp_path: Path, capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = slotserve_main(
        [
            "loadtest",
            "run",
            "--url",
            f"http://127.0.0.1:{port}",
            "--workload",
            "multi-turn",
            "--json",
            str(tmp_path / "x.json"),
            "--quiet",
        ]
    )
    assert rc == 2 and "cannot reach" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_compare_prints_ratios(reuse_server: MockServer, no_reuse_server: MockServer, tmp_path: Path, capsys):
    a = run_loadtest(no_reuse_server.url, "shared-prefix", tmp_path / "a.json")
    b = run_loadtest(reuse_server.url, "shared-prefix", tmp_path / "b.json")
    capsys.readouterr()
    assert slotserve_main(["loadtest", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    rows = {label: (va, vb) for label, _, va, vb in report.compare_rows(a.summary, b.summary)}
    va, vb = rows["output tokens/s"]
    assert f"{vb / va:.2f}x" in out
    assert "reuse ratio" in out and "0.0%" in out  # A reused nothing
    console = Console(file=io.StringIO(), width=120)
    report.print_tables(report.summary_tables(b), console)
    assert "oracle maximum (tokenize)" in console.file.getvalue()


def test_api_key_from_the_environment(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SLOTSERVE_LOADTEST_API_KEY", "sekrit")
    with MockServer(api_key="sekrit") as server:
        res = run_loadtest(server.url, "shared-prefix", tmp_path / "e.json", "--conversations", "2")
    assert res.summary.num_ok == 2
    assert "sekrit" not in (tmp_path / "e.json").read_text()


def test_api_key_is_sent(tmp_path: Path):
    with MockServer(api_key="sekrit") as server:
        res = run_loadtest(
            server.url, "shared-prefix", tmp_path / "k.json", "--api-key", "sekrit", "--conversations", "2"
        )
        assert res.summary.num_ok == 2 and res.config.model == "mock-model"
        assert "sekrit" not in (tmp_path / "k.json").read_text()
        rc = slotserve_main(
            [
                "loadtest",
                "run",
                "--url",
                server.url,
                "--workload",
                "shared-prefix",
                "--json",
                str(tmp_path / "n.json"),
                *SMALL,
                "--conversations",
                "2",
            ]
        )
    assert rc == 1
    assert results.load(tmp_path / "n.json").summary.errors == {"HTTP 401: missing or wrong API key": 2}
