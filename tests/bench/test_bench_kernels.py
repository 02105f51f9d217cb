"""`slotserve bench kernels`: validates each kernel before timing it and reports every figure."""

from __future__ import annotations

import argparse
import json

import pytest
from slotserve.bench import kernels


def args(**overrides: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    kernels.configure(parser)
    ns = parser.parse_args(["--n-in", "256", "--n-out", "24", "--min-time", "0.01", "--json"])
    for key, value in overrides.items():
        setattr(ns, key, value)
    return ns


def test_reports_every_type_and_row_count(capsys):
    assert kernels.run(args(types=["Q4_K", "Q6_K", "Q5_0", "BF16"])) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["shape"] == [24, 256]
    assert set(report["results"]) == {"Q4_K", "Q6_K", "Q5_0", "BF16"}
    for row in report["results"].values():
        assert set(row) == {"MB", "GB/s x1", "GB/s x4", "GMAC/s x64"}
        assert all(v > 0 for v in row.values())


def test_a_wrong_kernel_stops_the_benchmark(monkeypatch):
    from slotserve.engine_ext import _engine

    class Broken:
        name = "broken"

        def __init__(self, variant: str) -> None:
            self.kt = _engine.KernelTable("scalar")

        def quantize_q8a(self, x):
            return self.kt.quantize_q8a(x)

        def gemm(self, *a, **kw):
            return self.kt.gemm(*a, **kw) * 1.001

    real = _engine.KernelTable
    monkeypatch.setattr(_engine, "KernelTable", lambda v: Broken(v) if v == "auto" else real(v))
    with pytest.raises(SystemExit, match="disagrees with the reference"):
        kernels.run(args(types=["Q4_K"]))
