"""`slotserve bench serve` end to end on the tiny fixture model, with tiny sizes: the report has
every field, the token counts are the ones asked for and every ratio is finite and positive.
No timing is asserted (speed is a benchmark's business, not a test's)."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from slotserve.bench import serve


def test_bench_serve_report(
    tiny_model_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    for key in list(os.environ):
        if key.startswith("SLOTSERVE_") and key != "SLOTSERVE_HOME":
            monkeypatch.delenv(key)
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    args = parser.parse_args(
        ["--model", str(tiny_model_path), "--tokens", "5", "--streams", "1", "--streams", "2"]
        + ["--parallel", "2", "--ctx-size", "2048", "--bandwidth-mib", "4", "--rounds", "2", "--json"]
    )
    assert serve.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tokens"] == 5 and report["parallel"] == 2 and report["rounds"] == 2
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


def test_decode_weight_bytes_leaves_out_an_untied_embedding(tiny_model_path: Path):
    from slotserve.engine_ext.loader import read_model

    model, _ = read_model(tiny_model_path)
    total = sum(t.data.nbytes for t in model.tensors.values())
    embd = model.tensors["token_embd.weight"].data.nbytes
    expected = total if model.config.tied_output else total - embd
    assert serve.decode_weight_bytes(model) == expected
    assert 0 < expected <= total


@pytest.mark.parametrize("threads", [1, 3])
def test_triad_counts_three_arrays(monkeypatch: pytest.MonkeyPatch, threads: int):
    clock = iter(np.arange(0.0, 100.0, 0.5))  # every timed pass takes 0.5 s
    monkeypatch.setattr(serve.time, "perf_counter", lambda: float(next(clock)))
    # 1 MiB is not a multiple of 3 threads x the chunk: the shares' tails are covered too
    # (triad_bandwidth checks every element of the result)
    assert serve.triad_bandwidth(1, reps=2, threads=threads) == 3 * 1024 * 1024 / 0.5


@pytest.mark.parametrize("threads", [1, 3])
def test_read_pass_counts_one_array(monkeypatch: pytest.MonkeyPatch, threads: int):
    clock = iter(np.arange(0.0, 100.0, 0.25))  # every timed pass takes 0.25 s
    monkeypatch.setattr(serve.time, "perf_counter", lambda: float(next(clock)))
    # read_bandwidth checks that the pass summed every element once
    assert serve.read_bandwidth(1, reps=2, threads=threads) == 1024 * 1024 / 0.25
