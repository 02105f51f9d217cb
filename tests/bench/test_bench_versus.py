"""`slotserve bench versus` against stand-in executables: the order of the runs (alternating by
round), the commands each side is given, and the per-round ratios."""

from __future__ import annotations

import argparse
import json
import stat
import sys
from pathlib import Path

import pytest
from slotserve.bench import versus

LLAMA = """
import json, sys
argv = sys.argv[1:]
open(LOG, "a").write("llama " + " ".join(argv) + "\\n")
n = sum(1 for line in open(LOG) if line.startswith("llama"))
pp, tg = int(argv[argv.index("-p") + 1]), int(argv[argv.index("-n") + 1])
rows = [
    {"build_commit": "abc", "build_number": 1, "cpu_info": "cpu", "n_prompt": pp, "n_gen": 0, "avg_ts": 100.0 * n},
    {"build_commit": "abc", "build_number": 1, "cpu_info": "cpu", "n_prompt": 0, "n_gen": tg, "avg_ts": 10.0 * n},
]
print(json.dumps(rows))
"""

BUILD = """
import json, sys
argv = sys.argv[1:]
open(LOG, "a").write(NAME + " " + " ".join(argv) + "\\n")
depth = int(argv[argv.index("--depth") + 1])
res = {f"pp512_d{depth}": 300.0 * FACTOR, f"tg128_d{depth}": 25.0 * FACTOR, "pp512": 1.0}
print(json.dumps({"kernel_variant": "scalar", "results": {"threads=2": res}}))
"""


def _script(path: Path, body: str, **consts: object) -> str:
    head = "".join(f"{k} = {v!r}\n" for k, v in consts.items())
    path.write_text(f"#!{sys.executable}\n{head}{body}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _args(tmp_path: Path, **over: object) -> argparse.Namespace:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    parser = argparse.ArgumentParser()
    versus.configure(parser)
    log = str(tmp_path / "log")
    llama = _script(tmp_path / "llama-bench", LLAMA, LOG=log)
    a = _script(tmp_path / "a", BUILD, LOG=log, NAME="a", FACTOR=1.0)
    b = _script(tmp_path / "b", BUILD, LOG=log, NAME="b", FACTOR=2.0)
    argv = ["--llama-bench", llama, "--model", str(model), "--build", f"a={a}", "--build", f"b={b}", "--json"]
    ns = parser.parse_args(argv)
    for k, v in over.items():
        setattr(ns, k, v)
    return ns


def test_rounds_alternate_and_ratios_pair_each_round(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _args(tmp_path, rounds=3)
    assert versus.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    order = [line.split()[0] for line in (tmp_path / "log").read_text().splitlines()]
    assert order == ["llama", "a", "b", "b", "a", "llama", "llama", "a", "b"]
    lines = (tmp_path / "log").read_text().splitlines()
    assert "-p 512 -n 128 -r 2 -o json -d 0" in lines[0] and "-t 2" in lines[0]
    assert "bench engine --model" in lines[1] and lines[1].endswith("--no-numpy --json --depth 0")
    model = report["models"]["m.gguf"]
    # llama-bench's n-th run reports 100 n / 10 n: rounds 1, 2, 3 are its runs 1, 2, 3
    assert model["ratios"]["a"] == {"pp": [3.0, 1.5, 1.0], "tg": [2.5, 1.25, 0.83]}
    assert model["ratios"]["b"] == {"pp": [6.0, 3.0, 2.0], "tg": [5.0, 2.5, 1.67]}
    assert all(isinstance(r["load"], float) for r in model["runs"])


def test_depth_is_passed_to_both_sides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _args(tmp_path, rounds=1, depth=4096)
    assert versus.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    lines = (tmp_path / "log").read_text().splitlines()
    assert lines[0].endswith("-d 4096") and lines[1].endswith("--depth 4096")
    assert report["models"]["m.gguf"]["ratios"]["a"]["pp"] == [3.0]


def test_bad_build_spec_and_missing_binary_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="LABEL=EXECUTABLE"):
        versus.parse_builds(["nolabel"])
    with pytest.raises(SystemExit, match="not an executable"):
        versus.parse_builds([f"x={tmp_path / 'missing'}"])
    args = _args(tmp_path, llama_bench=str(tmp_path / "missing"))
    with pytest.raises(SystemExit, match="not an executable"):
        versus.run(args)


def test_a_failing_side_stops_with_its_error(tmp_path: Path) -> None:
    args = _args(tmp_path, rounds=1)
    broken = _script(tmp_path / "broken", "import sys; sys.stderr.write('boom'); sys.exit(3)\n")
    args.build = [f"x={broken}"]
    with pytest.raises(SystemExit, match="boom"):
        versus.run(args)


def test_a_synthetic_preset_is_timed_at_pp512_and_tg128(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slotserve.bench import synthetic

    args = _args(tmp_path, rounds=1, model=[], synthetic=["lfm2-350m"])
    monkeypatch.setattr(synthetic, "ensure_synthetic", lambda name, d: (tmp_path / "m.gguf", False))
    (target,) = versus.targets(args)
    assert (target.pp, target.tg, target.engine_args) == (512, 128, ("--synthetic", "lfm2-350m"))


def _tensor_bytes(path: Path) -> dict[str, int]:
    from gguf import GGUFReader

    return {t.name: int(t.n_bytes) for t in GGUFReader(str(path)).tensors}


def test_decode_bytes_counts_what_a_token_reads(tmp_path: Path) -> None:
    from gguf_fixtures import write_tiny_llama, write_tiny_model

    tied = _tensor_bytes(write_tiny_llama(tmp_path / "tied.gguf"))
    assert "output.weight" not in tied  # the embedding is the output head: read whole
    assert versus.decode_bytes(tmp_path / "tied.gguf") == sum(tied.values())
    untied = _tensor_bytes(write_tiny_llama(tmp_path / "untied.gguf", tied=False))
    want = sum(untied.values()) - untied["token_embd.weight"]  # one embedding row a token
    assert versus.decode_bytes(tmp_path / "untied.gguf") == want
    assert versus.decode_bytes(write_tiny_model(tmp_path / "moe.gguf", "qwen3moe")) is None
    (tmp_path / "bad.gguf").write_bytes(b"GGUF")
    assert versus.decode_bytes(tmp_path / "bad.gguf") is None


def test_probe_gives_each_run_its_read_fraction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    probes = iter([50.0, 40.0, 25.0])
    monkeypatch.setattr(versus, "probe_gb_s", lambda threads: next(probes))
    monkeypatch.setattr(versus, "decode_bytes", lambda path: 1_000_000_000)  # 1 GB read per token
    args = _args(tmp_path, rounds=1, probe=True)
    assert versus.run(args) == 0
    report = json.loads(capsys.readouterr().out)["models"]["m.gguf"]
    assert report["decode_bytes"] == 1_000_000_000
    # llama-bench tg 10/s against 50 GB/s; a 25/s against 40; b 50/s against 25
    fractions = [(r["who"], r["probe"], r["extra"]["tg_read_fraction"]) for r in report["runs"]]
    assert fractions == [("llama-bench", 50.0, 0.2), ("a", 40.0, 0.62), ("b", 25.0, 2.0)]
    args = _args(tmp_path, rounds=1, json=False, probe=True)
    monkeypatch.setattr(versus, "probe_gb_s", lambda threads: 20.0)
    assert versus.run(args) == 0
    assert "probe  20.0 GB/s  tg reads" in capsys.readouterr().out
