"""What a user sees when a model cannot be opened: `serve`, `generate` and `bench engine` print
one line `slotserve: error: ...` naming what was found (and what is supported), exit 2, and show
no traceback; a --ctx-size over the trained context is refused unless overridden; the served
model's default names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gguf_fixtures import write_tiny_llama
from slotserve.engine_ext.errors import ModelOpenError, UnsupportedModelError
from slotserve.engine_ext.loader import open_model
from slotserve.engine_ext.model_cache import DEFAULT_MODEL, GEMMA3_270M, SMOLLM2_135M, short_name
from slotserve.gateway.runtime import default_model_names

COMMANDS = {
    "serve": ["serve", "--port", "1", "--model"],  # port 1: nothing may get as far as binding
    "generate": ["generate", "--prompt", "hi", "--model"],
    "bench": ["bench", "engine", "--threads", "1", "--model"],
}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slotserve", *args], capture_output=True, text=True, timeout=120
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("slotserve: error: ") and "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.stdout == ""


@pytest.fixture(scope="module")
def mamba_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("mamba") / "mamba.gguf", architecture="mamba")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_unsupported_architecture_is_one_line_and_exit_2(command, mamba_path):
    result = run_cli(*COMMANDS[command], str(mamba_path))
    assert_one_line_error(result, str(mamba_path), "'mamba'", "supported: ", "llama")


def test_broken_file_is_one_line_and_exit_2(tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 60)
    assert_one_line_error(run_cli(*COMMANDS["serve"], str(broken)), str(broken))


def test_ctx_size_over_the_trained_context_is_refused(tiny_model_factory):
    path = tiny_model_factory("Q8_0", ctx_train=256)
    result = run_cli(*COMMANDS["serve"], str(path), "--ctx-size", "512")
    assert_one_line_error(result, "--ctx-size 512 exceeds the 256 tokens", "--allow-ctx-over-train")
    with pytest.raises(ModelOpenError, match="--ctx-size 257 exceeds"):
        open_model(path, num_slots=1, ctx_len=257, threads=1)
    assert open_model(path, num_slots=1, ctx_len=256, threads=1).pool.ctx_len == 256
    forced = open_model(path, num_slots=1, ctx_len=512, threads=1, allow_ctx_over_train=True)
    assert forced.pool.ctx_len == 512


def test_bench_engine_refuses_a_kv_type_the_heads_cannot_take(tiny_model_factory):
    # the tiny fixture's heads are 16 wide; q8_0 KV blocks are 32 (the pool's ValueError, as serve shows it)
    path = tiny_model_factory("Q8_0")
    result = run_cli(*COMMANDS["bench"], str(path), "--kv-type", "q8_0")
    assert_one_line_error(result, str(path), "kv_dtype q8_0 needs a head_dim that is a multiple of 32")


def test_unsupported_is_an_open_error_and_a_value_error():
    assert issubclass(UnsupportedModelError, ModelOpenError) and issubclass(ModelOpenError, ValueError)


def test_default_served_names():
    # the default model and known short names serve under the short name; a path under its stem
    qwen = Path("/cache") / DEFAULT_MODEL.filename
    assert default_model_names(short_name(None), qwen) == (
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-0.5b-instruct-q4_k_m",
    )
    smollm = Path("/cache") / SMOLLM2_135M.filename
    assert default_model_names(short_name("smollm2-135m"), smollm) == (
        "smollm2-135m",
        "SmolLM2-135M-Instruct.Q4_1",
    )
    gemma = Path("/cache") / GEMMA3_270M.filename
    assert default_model_names(short_name("gemma3-270m"), gemma) == ("gemma3-270m", "gemma-3-270m-q4_k_m")
    assert default_model_names(short_name("/models/my.gguf"), Path("/models/my.gguf")) == ("my",)
