"""The bandwidth passes and the decode bound's weight bytes (bench/bandwidth.py): each pass
counts the traffic it makes and checks it read or wrote every element (time is faked: no speed
is asserted), and the C read loop reads every byte once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from slotserve.bench import bandwidth


def test_decode_weight_bytes_leaves_out_an_untied_embedding(tiny_model_path: Path):
    from slotserve.engine_ext.loader import read_model

    model, _ = read_model(tiny_model_path)
    total = sum(t.data.nbytes for t in model.tensors.values())
    embd = model.tensors["token_embd.weight"].data.nbytes
    expected = total if model.config.tied_output else total - embd
    assert bandwidth.decode_weight_bytes(model) == expected
    assert 0 < expected <= total


@pytest.mark.parametrize("threads", [1, 3])
def test_triad_counts_three_arrays(monkeypatch: pytest.MonkeyPatch, threads: int):
    clock = iter(np.arange(0.0, 100.0, 0.5))  # every timed pass takes 0.5 s
    monkeypatch.setattr(bandwidth.time, "perf_counter", lambda: float(next(clock)))
    # 1 MiB is not a multiple of 3 threads x the chunk: the shares' tails are covered too
    # (triad_bandwidth checks every element of the result)
    assert bandwidth.triad_bandwidth(1, reps=2, threads=threads) == 3 * 1024 * 1024 / 0.5


@pytest.mark.parametrize("threads", [1, 3])
def test_read_pass_counts_one_array(monkeypatch: pytest.MonkeyPatch, threads: int):
    clock = iter(np.arange(0.0, 100.0, 0.25))  # every timed pass takes 0.25 s
    monkeypatch.setattr(bandwidth.time, "perf_counter", lambda: float(next(clock)))
    # read_bandwidth checks that the pass summed every element once
    assert bandwidth.read_bandwidth(1, reps=2, threads=threads) == 1024 * 1024 / 0.25


def test_read_sum_reads_every_byte_once() -> None:
    from slotserve.engine_ext import _engine

    rng = np.random.default_rng(7)
    # lengths around the AVX2 loop's 128-byte steps and the 8-byte words, and offsets off alignment
    for n in (0, 1, 7, 8, 127, 128, 129, 1000, 4096 + 13):
        raw = rng.integers(0, 256, n + 3, dtype=np.uint8)[3:]
        words = n // 8
        want = int(raw[: 8 * words].view("<u8").sum(dtype=np.uint64)) + int(raw[8 * words :].sum())
        assert _engine.read_sum(raw) == want % (1 << 64)
