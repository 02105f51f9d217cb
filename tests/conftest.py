"""Shared pytest fixtures. Each part of the project keeps its fixtures in its own marked section.

The tests directory is put on sys.path so test modules can import the helper modules beside
them (`gguf_fixtures`, `reference`) under --import-mode=importlib.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))


# ---------------------------------------------------------------------------------------------
# Models and fixture files (model I/O: gguf_fixtures.py, reference.py)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """callable(weight_type="Q8_0", **write_tiny_llama_kwargs) -> Path of a tiny llama GGUF.

    Files are written once per distinct argument set per session and shared; do not modify them.
    """
    from gguf_fixtures import write_tiny_llama

    root = tmp_path_factory.mktemp("tiny_models")
    cache: dict[tuple, Path] = {}

    def make(weight_type: str = "Q8_0", **kwargs: object) -> Path:
        key = (weight_type, *sorted((k, repr(v)) for k, v in kwargs.items()))
        if key not in cache:
            path = root / f"tiny-{len(cache)}-{weight_type}.gguf"
            cache[key] = write_tiny_llama(path, weight_type=weight_type, **kwargs)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def arch_model_factory(tiny_model_factory: Callable[..., Path]) -> Callable[..., Path]:
    """callable(arch, **overrides) -> Path of the tiny fixture of `arch` (gguf_fixtures.ARCH_MODELS:
    llama3, qwen2, qwen3, gemma3), written once per session like tiny_model_factory's."""
    from gguf_fixtures import ARCH_MODELS

    def make(arch: str, **overrides: object) -> Path:
        return tiny_model_factory(**{**ARCH_MODELS[arch], **overrides})

    return make


@pytest.fixture(scope="session")
def qwen35_model_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """callable(weight_type="Q8_0", **write_tiny_qwen35_kwargs) -> Path of a tiny qwen35 GGUF
    (gguf_fixtures.write_tiny_qwen35), written once per argument set per session."""
    from gguf_fixtures import write_tiny_qwen35

    root = tmp_path_factory.mktemp("tiny_qwen35")
    cache: dict[tuple, Path] = {}

    def make(weight_type: str = "Q8_0", **kwargs: object) -> Path:
        key = (weight_type, *sorted((k, repr(v)) for k, v in kwargs.items()))
        if key not in cache:
            path = root / f"tiny-qwen35-{len(cache)}-{weight_type}.gguf"
            cache[key] = write_tiny_qwen35(path, weight_type=weight_type, **kwargs)  # type: ignore[arg-type]
        return cache[key]

    return make


@pytest.fixture(scope="session")
def granite_model_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """callable(weight_type="Q8_0", **write_tiny_granite_kwargs) -> Path of a tiny granitehybrid
    GGUF (gguf_fixtures_granite.write_tiny_granite), written once per argument set per session."""
    from gguf_fixtures_granite import write_tiny_granite

    root = tmp_path_factory.mktemp("tiny_granite")
    cache: dict[tuple, Path] = {}

    def make(weight_type: str = "Q8_0", **kwargs: object) -> Path:
        key = (weight_type, *sorted((k, repr(v)) for k, v in kwargs.items()))
        if key not in cache:
            path = root / f"tiny-granite-{len(cache)}-{weight_type}.gguf"
            cache[key] = write_tiny_granite(path, weight_type=weight_type, **kwargs)  # type: ignore[arg-type]
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_model_path(tiny_model_factory: Callable[..., Path]) -> Path:
    """The default tiny model: Q8_0 weights, 2 layers, dim 64, 4 heads / 2 kv heads, vocab 299."""
    return tiny_model_factory("Q8_0")


@pytest.fixture(scope="session")
def real_model_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (the small, fast real model most real-model tests run on),
    pulled into the cache on first use."""
    from slotserve.engine_ext.model_cache import SMOLLM2_135M, ensure_model

    return ensure_model(SMOLLM2_135M, progress=False)


@pytest.fixture(scope="session")
def qwen_model_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct (the default model: qwen2, ChatML with tools), pulled on first use."""
    from slotserve.engine_ext.model_cache import QWEN25_CODER_05B, ensure_model

    return ensure_model(QWEN25_CODER_05B, progress=False)


@pytest.fixture(scope="session")
def gemma3_model_path() -> Path:
    """Gemma 3 270M Q4_K_M (base model, SentencePiece vocabulary), pulled on first use."""
    from slotserve.engine_ext.model_cache import GEMMA3_270M, ensure_model

    return ensure_model(GEMMA3_270M, progress=False)


@pytest.fixture(scope="session")
def gemma3_metadata(gemma3_model_path) -> dict[str, object]:
    """Gemma 3 270M's GGUF metadata, from the session's one load of the file (engine_support)."""
    from engine_support import model_file

    return model_file(gemma3_model_path).metadata


@pytest.fixture(scope="session")
def real_model_file(real_model_path):
    """SmolLM2 (real_model_path) loaded once per session (engine_ext.gguf_file.ModelFile; read-only)."""
    from slotserve.engine_ext.gguf_file import load_model_file

    return load_model_file(real_model_path)


@pytest.fixture(scope="session")
def shared_fixtures_dir() -> Path:
    """The team's shared fixture files: `shared/fixtures` beside the repository checkout."""
    path = REPO_ROOT.parent / "shared" / "fixtures"
    if not path.is_dir():
        pytest.fail(
            f"shared fixtures not found at {path}: put the `shared/` folder beside the "
            f"repository checkout ({REPO_ROOT})"
        )
    return path


# ---------------------------------------------------------------------------------------------
# Soak and fault suite (tests/soak/, marker soak)
# ---------------------------------------------------------------------------------------------

SOAK_SECONDS_ENV = "SLOTSERVE_SOAK_SECONDS"
SOAK_SECONDS_DEFAULT = 3.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-seconds",
        type=float,
        default=None,
        help=f"how long each soak test drives its load (default {SOAK_SECONDS_DEFAULT:g}, "
        f"or ${SOAK_SECONDS_ENV}); every loop stays bounded in requests as well",
    )


@pytest.fixture(scope="session")
def soak_seconds(pytestconfig: pytest.Config) -> float:
    """Seconds of load per soak test: --soak-seconds, else $SLOTSERVE_SOAK_SECONDS, else 3."""
    import os

    value = pytestconfig.getoption("--soak-seconds")
    if value is None:
        value = float(os.environ.get(SOAK_SECONDS_ENV, SOAK_SECONDS_DEFAULT))
    if value <= 0:
        raise pytest.UsageError("--soak-seconds must be > 0")
    return float(value)
