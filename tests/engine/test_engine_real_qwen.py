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

import pytest
from engine_support import model_file
from llamacpp_compare import greedy_agreement
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


def test_greedy_continuations_agree_with_llamacpp(qwen, fixture_cases) -> None:
    pool = SlotPool(qwen, 1, 256)
    total, report = greedy_agreement(
        pool,
        fixture_cases,
        quant_noise_margin=QUANT_NOISE_MARGIN,
        our_noise_margin=OUR_NOISE_MARGIN,
        label=lambda prompt: prompt[-32:],
    )
    print("\n".join(report))
    assert total >= MIN_TOTAL_AGREED, "\n".join(report)
