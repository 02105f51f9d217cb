"""Fixtures of tests/engine: the kernel tables the kernel tests compare (module-scoped)."""

from __future__ import annotations

import pytest
from slotserve.engine_ext import _engine


@pytest.fixture(scope="module")
def generic() -> _engine.KernelTable:
    return _engine.KernelTable("scalar")


@pytest.fixture(scope="module")
def avx2() -> _engine.KernelTable:
    if not _engine.avx2_supported():
        pytest.skip("this CPU has no AVX2/FMA/F16C")
    return _engine.KernelTable("avx2")


@pytest.fixture(scope="module")
def generic_and_avx2(generic: _engine.KernelTable) -> list[_engine.KernelTable]:
    """The portable table and, where this CPU has it, avx2's (no skip without it)."""
    return [generic] + ([_engine.KernelTable("avx2")] if _engine.avx2_supported() else [])
