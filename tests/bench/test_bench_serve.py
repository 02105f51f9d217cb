"""`slotserve bench serve` end to end on the tiny fixture model, with tiny sizes: the report has
every field, the token counts are the ones asked for and every ratio is finite and positive.
No timing is asserted (speed is a benchmark's business, not a test's)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import time
from pathlib import Path

import pytest
from slotserve.bench import serve, serve_client, serve_server


@pytest.mark.parametrize("client", serve.CLIENTS)
def test_bench_serve_report(
    tiny_model_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, client: str
):
    for key in list(os.environ):
        if key.startswith("SLOTSERVE_") and key != "SLOTSERVE_HOME":
            monkeypatch.delenv(key)
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    args = parser.parse_args(
        ["--model", str(tiny_model_path), "--tokens", "5", "--streams", "1", "--streams", "2"]
        + ["--parallel", "2", "--ctx-size", "2048", "--bandwidth-mib", "4", "--rounds", "2", "--json"]
        + ["--client", client]
    )
    assert serve.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == 5 and report["parallel"] == 2 and report["rounds"] == 2
    assert report["client"] == client
    assert set(report["streams"]) == {"1", "2"}
    for n, row in report["streams"].items():
        assert row["completion_tokens"] == [5] * int(n)  # every stream ran to max_tokens (ignore_eos)
        assert len(row["served_over_engine_rounds"]) == 2  # one ratio per served + engine pair
        assert (
            min(row["served_over_engine_rounds"])
            <= row["served_over_engine"]
            <= max(row["served_over_engine_rounds"])
        )
        for key in ("served_tokens_per_s", "engine_tokens_per_s", "served_over_engine"):
            assert math.isfinite(row[key]) and row[key] > 0, (n, key, row[key])
        # CPU over the served rounds (server_cpu_seconds is tested below)
        assert row["cpu"]["wall_s"] > 0, row["cpu"]
        assert row["cpu"]["server_cpu_s"] >= 0 and row["cpu"]["client_cpu_s"] >= 0  # 10 ms ticks
    assert report["bandwidth_threads"] >= 1
    for key in (
        "ttft_s",
        "bandwidth_gb_s",
        "one_slot_bound_tokens_per_s",
        "engine_one_slot_over_bound",
        "read_bandwidth_gb_s",
        "one_slot_read_bound_tokens_per_s",
        "engine_one_slot_over_read_bound",
    ):
        assert math.isfinite(report[key]) and report[key] > 0, (key, report[key])
    assert report["decode_weight_bytes"] > 0


def test_served_round_rejects_a_short_stream():
    """A stream that stopped before `tokens` (usage count or finish_reason) ends the benchmark."""

    def results(count: int, finish: str) -> list[serve_client.StreamResult]:
        return [
            serve_client.StreamResult(1.0, 2.0, 3.0, 10, 5, "length"),
            serve_client.StreamResult(1.0, 2.0, 3.0, 10, count, finish),
        ]

    async def run_round(count: int, finish: str) -> tuple[float, list[int]]:
        async def round_of(specs: list[object]) -> list[serve_client.StreamResult]:
            assert len(specs) == 2
            return results(count, finish)

        return await serve.served_round(round_of, 5, 2, 0)

    assert asyncio.run(run_round(5, "length")) == (8.0, [5, 5])  # (4 + 4) tokens after the first / 1 s
    for count, finish in ((4, "length"), (5, "stop")):
        with pytest.raises(SystemExit, match="ended after"):
            asyncio.run(run_round(count, finish))


def test_server_cpu_seconds_reads_this_process():
    before = serve_server.server_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # burn CPU until the process clock moved
        pass
    assert serve_server.server_cpu_seconds(os.getpid()) > before
