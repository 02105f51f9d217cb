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
    figures = {"MB", "GB/s x1", "GB/s x4", "GMAC/s x64"}
    peak = report["peak_gmacs"].get(report["peak_mix"] or "", 0.0)
    for name, row in report["results"].items():
        # block types on a variant with a peak mix also report their fraction of it
        assert set(row) == (figures | {"of peak"} if peak > 0 and name != "BF16" else figures)
        assert all(v > 0 for v in row.values())
    for name in ("Q4_K", "Q6_K", "Q5_0"):
        if peak > 0:
            assert report["results"][name]["of peak"] == report["results"][name]["GMAC/s x64"] / peak


def test_peak_of_each_instruction_mix():
    """The peak loop counts the products of the mix it ran (64 per 512-bit vpdpbusd, 32 per
    256-bit one or vpmaddubsw, 12 accumulators a round; avx2+fma 8 vpmaddubsw a round, its FMAs
    not counted), and 0 where the CPU lacks the mix."""
    from slotserve.engine_ext import _engine

    # products a loop iteration: 12 chains x the vector's int8 products, avx2+fma 8 pairs
    per_iter = {"vnni512": 12 * 64, "vnni256": 12 * 32, "avx2": 12 * 32, "avx2+fma": 8 * 32}
    have = {
        "vnni512": _engine.avx512vnni_supported(),
        "vnni256": _engine.avx512vnni_supported(),
        "avx2": _engine.avx2_supported(),
        "avx2+fma": _engine.avx2_supported(),
    }
    for mix in kernels.PEAK_MIXES:
        assert _engine.peak_macs(mix, 10) == (10 * per_iter[mix] if have[mix] else 0)
        assert kernels.peak_gmacs(mix, 0.01) > 0 if have[mix] else kernels.peak_gmacs(mix, 0.01) == 0
    assert _engine.peak_macs("unknown", 10) == 0


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
