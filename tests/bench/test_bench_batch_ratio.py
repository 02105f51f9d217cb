"""`bench engine --batch-ratio`: 4 slots decoding against one slot, the two step sizes paired.

The figure is only honest if both sizes do the same work but for the batch: the same positions,
the same tokens (greedy), the same KV, in alternating order, warm-up pairs untimed. A recording
pool checks that contract call by call; a tiny synthetic model runs the command end to end.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from slotserve.bench import engine as bench_engine
from slotserve.bench import engine_measure, synthetic
from slotserve.bench.synthetic import PRESETS, shrunk


class RecordingPool:
    """Slots as token lists; forward checks each item's position against its slot's length and
    returns logits whose argmax depends on the slot's tokens (a stand-in for greedy decode)."""

    def __init__(self, n_slots: int, n_vocab: int) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(n_slots)]
        self.n_vocab = n_vocab
        self.calls: list[list[tuple[int, int, int]]] = []  # per decode call: (slot, token, position)

    def truncate(self, slot: int, n: int) -> None:
        assert 0 <= n <= len(self.tokens[slot])
        del self.tokens[slot][n:]

    def forward(self, items: list[tuple[int, np.ndarray, int, bool]]) -> list[np.ndarray]:
        out = []
        for slot, ids, pos, want in items:
            assert pos == len(self.tokens[slot]) and want
            self.tokens[slot].extend(int(t) for t in ids)
            logits = np.zeros(self.n_vocab, np.float32)
            logits[(sum(self.tokens[slot]) * 7 + slot) % self.n_vocab] = 1.0
            out.append(logits)
        if all(len(ids) == 1 for _, ids, _, _ in items):
            self.calls.append([(s, int(ids[0]), pos) for s, ids, pos, _ in items])
        return out


def test_batch_ratio_pairs_both_sizes_at_the_same_positions_and_tokens() -> None:
    pool = RecordingPool(4, 50)
    pairs = 23
    result = engine_measure.batch_ratio(pool, 50, pairs, np.random.default_rng(0))
    n_slots, warm, ctx = engine_measure.RATIO_SLOTS, engine_measure.RATIO_WARMUP, engine_measure.RATIO_CONTEXT
    calls = pool.calls
    assert len(calls) == 2 * (warm + pairs)
    for i in range(warm + pairs):
        first, second = calls[2 * i], calls[2 * i + 1]
        one, batch = (first, second) if len(first) == 1 else (second, first)
        assert len(one) == 1 and len(batch) == n_slots
        assert (len(first) == 1) == (i % 2 == 0)  # the order alternates
        assert one[0] == batch[0]  # slot 0: the same token at the same position in both steps
        assert [pos for _, _, pos in batch] == [ctx + i] * n_slots
        if i:  # greedy: each slot's token is the argmax of its previous step
            prev = pool_tokens_at(pool, ctx + i - 1)
            assert [tok for _, tok, _ in batch] == [next_token(prev[s], s, 50) for s in range(n_slots)]
    assert all(len(t) == ctx + warm + pairs for t in pool.tokens)
    assert result["pairs"] == pairs and result["positions"] == [ctx + warm, ctx + warm + pairs - 1]
    assert len(result["blocks"]) == pairs // engine_measure.RATIO_BLOCK == 2
    assert result["ratio"] > 0 and result["step_ms_1"] > 0 and result[f"step_ms_{n_slots}"] > 0


def pool_tokens_at(pool: RecordingPool, n: int) -> list[list[int]]:
    return [t[: n + 1] for t in pool.tokens]


def next_token(tokens: list[int], slot: int, n_vocab: int) -> int:
    return (sum(tokens) * 7 + slot) % n_vocab


def test_bench_engine_batch_ratio_runs_only_that_figure(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(
        PRESETS, "tiny", shrunk(PRESETS["qwen2-1.5b"], n_layers=1, dim=256, ffn_dim=512, n_vocab=400)
    )
    monkeypatch.setitem(synthetic.BENCH_SIZES, "tiny", synthetic.BenchSizes((16,), 4, 8))
    parser = argparse.ArgumentParser()
    bench_engine.configure(parser)
    argv = ["--synthetic", "tiny", "--synthetic-dir", str(tmp_path), "--threads", "1", "--batch-ratio", "10"]
    assert bench_engine.run(parser.parse_args([*argv, "--json"])) == 0
    info = json.loads(capsys.readouterr().out)
    assert set(info["results"]["threads=1"]) == {"batch_ratio"}
    ratio = info["results"]["threads=1"]["batch_ratio"]
    assert ratio["pairs"] == 10 and len(ratio["blocks"]) == 1 and ratio["ratio"] > 0
    assert bench_engine.run(parser.parse_args(argv)) == 0
    assert "4 slots vs 1, 10 pairs alternating" in capsys.readouterr().out
    for bad in (["--batch-ratio", "0"], ["--batch-ratio", "5", "--depth", "8"]):
        with pytest.raises(SystemExit, match="--batch-ratio"):
            bench_engine.run(parser.parse_args([*argv[:-2], *bad]))
