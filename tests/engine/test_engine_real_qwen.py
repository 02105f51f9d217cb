"""The engine on the default model, Qwen2.5-Coder-0.5B-Instruct (qwen2, a Q4_K_M-type mix of
Q4_K, Q5_0, Q6_K and Q8_0 tensors): greedy continuations against llama.cpp's on the same file
(tests/fixtures/qwen25_coder_greedy_llamacpp.json, recorded by record_llamacpp_qwen25_coder.py
beside it on llama.cpp's C API: llama.cpp's version, its prompt ids, and per step its token and
the logprob margin between its top two tokens), and our tokenizer against llama.cpp's prompt ids.

Each continuation must agree token for token until the first step where llama.cpp's own choice
was within quantization noise (its margin <= QUANT_NOISE_MARGIN); where ours parts from it, our
choice must be within the noise too. The report printed with -s shows every parting point.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from engine_support import model_file
from slotserve.engine_ext import SlotPool
from slotserve.engine_ext.tokenizer import Tokenizer

pytestmark = pytest.mark.real_model

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen25_coder_greedy_llamacpp.json"
QUANT_NOISE_MARGIN = 1.0  # as for Gemma 3 (test_engine_real_gemma3.py): both engines' top two this close
OUR_NOISE_MARGIN = 0.5
MIN_TOTAL_AGREED = (
    120  # of the fixture's 8 x 16 steps (measured: 126; the one parting, past <|im_end|>, at margin 0.002)
)


@pytest.fixture(scope="module")
def fixture_cases(qwen_model_path) -> list[dict]:
    data = json.loads(FIXTURE.read_text())
    assert "llama" in data["llama_cpp_version"]
    from slotserve.engine_ext.model_cache import QWEN25_CODER_05B

    assert data["model_sha256"] == QWEN25_CODER_05B.sha256  # recorded on this very file
    return data["cases"]


@pytest.fixture(scope="module")
def qwen(qwen_model_path):
    mf = model_file(qwen_model_path)
    assert mf.config.arch == "qwen2"
    return mf


def test_tokenizer_matches_llamacpps_prompt_ids(qwen, fixture_cases) -> None:
    tok = Tokenizer.from_model_file(qwen)
    for case in fixture_cases:
        assert tok.encode(case["prompt"], add_bos=tok.add_bos_token) == case["prompt_ids"], case["prompt"]


def _logprobs(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def test_greedy_continuations_agree_with_llamacpp(qwen, fixture_cases) -> None:
    pool = SlotPool(qwen, 1, 256)
    report, total = [], 0
    for case in fixture_cases:
        pool.truncate(0, 0)
        logits = pool.forward([(0, np.array(case["prompt_ids"], np.int32), 0, True)])[0]
        agreed = 0
        for step in case["steps"]:
            ours, theirs = int(np.argmax(logits)), step["id"]
            if ours != theirs:
                lp = _logprobs(logits)
                ours_over = float(lp[ours] - lp[theirs])
                report.append(
                    f"{case['prompt'][-32:]!r}: parts after {agreed} tokens: ours {ours} vs llama.cpp "
                    f"{theirs}; llama.cpp margin {step['margin_logprob']:.3f}, "
                    f"ours {ours_over:.3f}"
                )
                assert step["margin_logprob"] <= QUANT_NOISE_MARGIN, report[-1]
                assert 0.0 < ours_over <= OUR_NOISE_MARGIN, report[-1]
                break
            agreed += 1
            logits = pool.forward([(0, np.array([theirs], np.int32), pool.slot_len(0), True)])[0]
        else:
            report.append(f"{case['prompt'][-32:]!r}: all {agreed} tokens agree")
        total += agreed
    print("\n".join(report))
    assert total >= MIN_TOTAL_AGREED, "\n".join(report)
