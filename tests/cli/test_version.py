"""The version is written once (pyproject.toml) and read everywhere through `slotserve.__version__`."""

from __future__ import annotations

from pathlib import Path

import tomllib
from slotserve.metrics import ServerMetrics

import slotserve

REPO = Path(__file__).resolve().parents[2]


def test_version_is_pyproject_version_everywhere():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert slotserve.__version__ == declared
    body = ServerMetrics().render()[0].decode()
    assert f'slotserve_build_info{{version="{declared}"}} 1.0' in body
