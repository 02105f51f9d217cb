"""`slotserve generate` on the tiny fixtures: greedy output equals the NumPy reference's,
seeded sampling is reproducible, the sampler draws from softmax(logits / T), errors are clear."""

from __future__ import annotations

import re

import numpy as np
import pytest
from reference import ReferenceModel
from slotserve.engine_ext.chat import chat_template_for
from slotserve.engine_ext.gguf_file import load_model_file
from slotserve.engine_ext.tokenizer import Tokenizer

from slotserve.cli import main
from slotserve.generate import sample_token

TIMINGS = re.compile(
    r"prompt tokens: (\d+), prefill: [\d.]+ tok/s, generated tokens: (\d+), decode: ([\d.]+ tok/s|n/a)"
)


def _generate(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["generate", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _tokenizer(path) -> Tokenizer:
    return Tokenizer.from_model_file(load_model_file(path))


def test_greedy_matches_reference(tiny_model_factory, capsys):
    # F32 weights: the engine and the float64 reference agree up to rounding, so greedy tokens
    # are the same unless two logits tie to ~1e-5 (not the case for this prompt and seed).
    path = tiny_model_factory("F32")
    tok = _tokenizer(path)
    prompt = "the cat sat on"
    expected = []
    for t in ReferenceModel(path).greedy(tok.encode(prompt), 12):
        if t in tok.eos_token_ids:
            break
        expected.append(t)
    assert len(set(expected)) >= 3

    code, out, err = _generate(capsys, "--model", str(path), "--prompt", prompt, "--max-tokens", "12")
    assert code == 0, err
    assert out == tok.decode(expected) + "\n"
    m = TIMINGS.search(err)
    assert m and int(m.group(1)) == len(tok.encode(prompt)) and int(m.group(2)) == len(expected)


def test_chat_prompt_goes_through_the_template(tiny_model_path, capsys):
    mf = load_model_file(tiny_model_path)
    rendered = chat_template_for(mf).render([{"role": "user", "content": "hello there"}])
    code, _, err = _generate(
        capsys, "--model", str(tiny_model_path), "--prompt", "hello there", "--chat", "--max-tokens", "3"
    )
    assert code == 0, err
    assert int(TIMINGS.search(err).group(1)) == len(Tokenizer.from_model_file(mf).encode(rendered))


def test_seeded_sampling_is_reproducible_and_seed_dependent(tiny_model_path, capsys):
    def sample(seed: int) -> str:
        code, out, err = _generate(
            capsys,
            "--model",
            str(tiny_model_path),
            "--prompt",
            "in the",
            "--max-tokens",
            "10",
            "--temperature",
            "1.5",
            "--seed",
            str(seed),
        )
        assert code == 0, err
        return out

    assert sample(7) == sample(7)
    assert len({sample(seed) for seed in range(4)}) >= 2


def test_sample_token():
    rng = np.random.default_rng(0)
    logits = np.array([0.0, np.log(3.0), -np.inf, 0.5], np.float32)
    assert sample_token(logits, 0.0, rng) == 1
    assert sample_token(np.array([2.0, 2.0], np.float32), 0.0, rng) == 0  # ties -> lowest id
    draws = np.bincount([sample_token(logits[:3], 1.0, rng) for _ in range(4000)], minlength=3)
    assert draws[2] == 0
    assert abs(draws[1] / 4000 - 0.75) < 0.03  # softmax([0, log 3]) = [0.25, 0.75]
    cold = [sample_token(logits, 0.01, rng) for _ in range(50)]
    assert cold == [1] * 50


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-tokens", "0"], "--max-tokens must be in 1.."),
        (["--temperature", "-1"], "--temperature must be"),
        (["--max-tokens", "5000"], "exceeds the model's context of 2048"),
        (["--prompt", ""], "the prompt is empty"),
    ],
)
def test_bad_arguments_are_clear_errors(tiny_model_path, capsys, args, message):
    base = {"--model": str(tiny_model_path), "--prompt": "hi"}
    flags = dict(zip(args[::2], args[1::2]))
    argv = [x for k, v in {**base, **flags}.items() for x in (k, v)]
    code, out, err = _generate(capsys, *argv)
    assert code == 1 and out == "" and message in err


def test_missing_model_file_is_a_clear_error(tmp_path, capsys):
    code, _, err = _generate(capsys, "--model", str(tmp_path / "nope.gguf"), "--prompt", "hi")
    assert code == 2 and err.startswith("slotserve: error: model file ") and "does not exist" in err


@pytest.mark.real_model
def test_default_model_answers_as_an_assistant(qwen_model_path, capsys):
    """No --model: the default model (Qwen2.5-Coder-0.5B-Instruct) answers the question through
    its chat template, greedily, as llama.cpp does on the same file."""
    code, out, err = _generate(
        capsys, "--prompt", "What is the capital of France?", "--chat", "--max-tokens", "12"
    )
    assert code == 0, err
    assert out == "The capital of France is Paris.\n"
    mf = load_model_file(qwen_model_path)
    rendered = chat_template_for(mf).render([{"role": "user", "content": "What is the capital of France?"}])
    assert int(TIMINGS.search(err).group(1)) == len(Tokenizer.from_model_file(mf).encode(rendered))


@pytest.mark.real_model
def test_smollm2_greedy_agrees_with_llamacpp(real_model_path, shared_fixtures_dir, capsys):
    """SmolLM2 by short name: its greedy continuation starts like llama.cpp's."""
    import json

    case = json.loads((shared_fixtures_dir / "smollm2_greedy_llamacpp.json").read_text())[0]
    code, out, err = _generate(
        capsys, "--model", "smollm2-135m", "--prompt", case["prompt"], "--max-tokens", "6"
    )
    assert code == 0, err
    text = out.removesuffix("\n")
    assert len(text) > 10 and case["continuation"].startswith(text), (text, case["continuation"])
    assert int(TIMINGS.search(err).group(1)) == len(case["prompt_ids"])
