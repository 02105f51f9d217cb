"""engine_ext/hub.py: GGUF models named on the Hugging Face Hub (`hf://OWNER/REPO/FILE.gguf`,
`OWNER/REPO:QUANT`), fetched through huggingface_hub from a local stand-in of the Hub
(tests/hub_support.py, loopback, via HF_ENDPOINT): the file a quantization picks, split GGUFs read
in place, huggingface_hub's cache and resumed downloads, gated repositories and HF_TOKEN, one-line
errors (exit 2), and the offline path from a pre-filled cache with HF_HUB_OFFLINE."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf_fixtures import write_tiny_llama
from hub_support import FakeHub, FakeHubServer, FakeRepo
from slotserve.engine_ext import hub, model_cache
from slotserve.engine_ext.errors import ModelOpenError
from slotserve.engine_ext.gguf_file import load_model_file
from slotserve.engine_ext.hub import HubRef, choose_files, parse_hub_ref, quant_matches

REPO = "acme/tiny-GGUF"
GATED = "acme/gated-GGUF"
GOOD_TOKEN = "hf_good_token"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hub_models")
    (root / "split").mkdir()
    split_first = write_tiny_llama(root / "split" / "tiny-F16.gguf", weight_type="F16", split_max_tensors=8)
    return {
        "q8": write_tiny_llama(root / "tiny-Q8_0.gguf", weight_type="Q8_0"),
        "q4": write_tiny_llama(root / "tiny-Q4_0.gguf", weight_type="Q4_0", seed=1),
        "f16": write_tiny_llama(root / "whole-F16.gguf", weight_type="F16"),
        "split": split_first,
    }


@pytest.fixture
def fake_hub(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    split_parts = sorted(models["split"].parent.glob("tiny-F16-*-of-*.gguf"))
    assert len(split_parts) >= 3
    files = {
        "tiny-Q8_0.gguf": models["q8"].read_bytes(),
        "tiny-Q4_0.gguf": models["q4"].read_bytes(),
        "mmproj-tiny-Q8_0.gguf": b"not a text model",
        "README.md": b"# tiny\n",
        **{f"F16/{p.name}": p.read_bytes() for p in split_parts},
    }
    fake = FakeHub(
        repos={
            REPO: FakeRepo(files=files),
            GATED: FakeRepo(files={"gated-Q8_0.gguf": models["q8"].read_bytes()}, gated_tokens=(GOOD_TOKEN,)),
        }
    )
    hub_env(monkeypatch, tmp_path)
    with FakeHubServer(fake) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def hub_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty huggingface_hub cache and home in tmp_path, no token, online."""
    cache = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return cache


# ------------------------------------------------------------------ names and choices


def test_hub_names_parse() -> None:
    assert parse_hub_ref("hf://acme/x-GGUF/sub/m-Q8_0.gguf") == HubRef(
        "acme/x-GGUF", filename="sub/m-Q8_0.gguf"
    )
    assert parse_hub_ref("acme/x-GGUF:Q4_K_M") == HubRef("acme/x-GGUF", quant="Q4_K_M")
    assert parse_hub_ref("hf://acme/x-GGUF:q8_0") == HubRef("acme/x-GGUF", quant="q8_0")
    assert parse_hub_ref("hf://acme/x.y_z-GGUF") == HubRef("acme/x.y_z-GGUF")
    for not_hub in ("smollm2-135m", "models/my.gguf", "/abs/path.gguf", "acme/x-GGUF", "./a/b:Q4"):
        assert parse_hub_ref(not_hub) is None, not_hub
    with pytest.raises(ModelOpenError, match="not a Hub model name; use hf://OWNER/REPO/FILE.gguf"):
        parse_hub_ref("hf://just-a-name")
    assert str(HubRef("a/b", quant="Q8_0")) == "a/b:Q8_0"
    assert str(HubRef("a/b", filename="c.gguf")) == "hf://a/b/c.gguf"


def test_a_local_file_named_like_a_hub_name_is_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "x:Q8_0").write_bytes(b"local")
    assert model_cache.resolve_model("acme/x:Q8_0", progress=False).read_bytes() == b"local"
    assert model_cache.short_name("acme/x:Q8_0") is None


def test_quantization_picks_the_file_that_carries_it() -> None:
    files = [
        "README.md",
        "m-Q4_K.gguf",
        "m-Q4_K_M.gguf",
        "m.Q8_0.gguf",
        "mmproj-m-Q8_0.gguf",
        "Q6_K/m-Q6_K-00001-of-00003.gguf",
        "Q6_K/m-Q6_K-00002-of-00003.gguf",
        "Q6_K/m-Q6_K-00003-of-00003.gguf",
    ]
    assert choose_files(HubRef("a/b", quant="Q4_K"), files) == ["m-Q4_K.gguf"]
    assert choose_files(HubRef("a/b", quant="q4_k_m"), files) == ["m-Q4_K_M.gguf"]
    assert choose_files(HubRef("a/b", quant="Q8_0"), files) == ["m.Q8_0.gguf"]  # not the mmproj
    assert choose_files(HubRef("a/b"), files) == ["m-Q4_K_M.gguf"]  # llama.cpp's default
    assert choose_files(HubRef("a/b", quant="Q6_K"), files) == [
        f"Q6_K/m-Q6_K-0000{i}-of-00003.gguf" for i in (1, 2, 3)
    ]
    assert choose_files(HubRef("a/b", filename="x/y-00002-of-00002.gguf"), []) == [
        "x/y-00001-of-00002.gguf",
        "x/y-00002-of-00002.gguf",
    ]
    assert choose_files(HubRef("a/b"), ["only-IQ4_XS.gguf", "x.txt"]) == ["only-IQ4_XS.gguf"]
    with pytest.raises(ModelOpenError, match=r"no GGUF file for quantization Q2_K; it has: .*m-Q4_K_M\.gguf"):
        choose_files(HubRef("a/b", quant="Q2_K"), files)
    with pytest.raises(ModelOpenError, match="has no .gguf file"):
        choose_files(HubRef("a/b", quant="Q2_K"), ["README.md"])
    assert quant_matches("dir/Model-7B-BF16.gguf", "bf16") and not quant_matches("m-Q4_K_M.bin", "Q4_K_M")


# ------------------------------------------------------------------ downloads


def test_quant_name_downloads_into_the_hf_cache_once(fake_hub: FakeHub, models, tmp_path: Path) -> None:
    path = model_cache.resolve_model(f"{REPO}:q8_0", progress=False)
    assert path.read_bytes() == models["q8"].read_bytes()
    assert (tmp_path / "hf" / "hub") in path.parents  # huggingface_hub's cache, HF_HUB_CACHE
    assert len(fake_hub.gets_of("tiny-Q8_0.gguf")) == 1
    again = model_cache.resolve_model(f"{REPO}:Q8_0", progress=False)
    assert again == path and len(fake_hub.gets_of("tiny-Q8_0.gguf")) == 1  # cached: not fetched again
    assert fake_hub.gets_of("mmproj-tiny-Q8_0.gguf") == []
    assert model_cache.short_name(f"{REPO}:q8_0") == f"{REPO}:q8_0"  # the served name


def test_hf_file_name_downloads_that_file(fake_hub: FakeHub, models) -> None:
    path = model_cache.resolve_model(f"hf://{REPO}/tiny-Q4_0.gguf", progress=False)
    assert path.read_bytes() == models["q4"].read_bytes()
    assert model_cache.short_name(f"hf://{REPO}/tiny-Q4_0.gguf") is None  # served by its file name


def test_interrupted_download_resumes_with_a_range_request(fake_hub: FakeHub) -> None:
    # huggingface_hub writes a download in 10 MiB chunks and, when the connection breaks, asks
    # for the rest from the last chunk written: a file over 10 MiB cut after 10.5 MiB
    from huggingface_hub import constants

    chunk = constants.DOWNLOAD_CHUNK_SIZE
    big = np.random.default_rng(0).integers(0, 256, chunk + chunk // 4, dtype=np.uint8).tobytes()
    fake_hub.repos[REPO].files["big-Q8_0.gguf"] = big
    fake_hub.drop_after["big-Q8_0.gguf"] = chunk + chunk // 20
    path = hub.fetch(HubRef(REPO, filename="big-Q8_0.gguf"), progress=False)
    assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(big).digest()
    gets = fake_hub.gets_of("big-Q8_0.gguf")
    assert [g.headers.get("range") for g in gets] == [None, f"bytes={chunk}-"]


def test_split_gguf_is_fetched_whole_and_read_in_place(fake_hub: FakeHub, models) -> None:
    path = model_cache.resolve_model(f"{REPO}:F16", progress=False)
    parts = sorted(path.parent.glob("tiny-F16-*-of-*.gguf"))
    assert path.name == "tiny-F16-00001-of-00003.gguf" and len(parts) == 3
    split, whole = load_model_file(path), load_model_file(models["f16"])
    assert split.config == whole.config and split.tensors.keys() == whole.tensors.keys()
    for name, t in whole.tensors.items():
        assert np.array_equal(split.tensors[name].data, t.data), name
    # the engine computes the same logits from the parts as from the one file
    from slotserve.engine_ext.loader import open_model

    prompt = np.array([5, 17, 42, 7], np.int32)
    got = [
        open_model(p, num_slots=1, ctx_len=32, threads=1).pool.forward([(0, prompt, 0, True)])[0]
        for p in (path, models["f16"])
    ]
    assert np.array_equal(got[0], got[1])


def test_a_later_part_or_a_missing_part_is_refused(models, tmp_path: Path) -> None:
    second = models["split"].with_name("tiny-F16-00002-of-00003.gguf")
    with pytest.raises(ValueError, match="is part 2 of 3; pass the first part, tiny-F16-00001-of-00003.gguf"):
        load_model_file(second)
    lone = tmp_path / "tiny-F16-00001-of-00003.gguf"
    lone.write_bytes(models["split"].read_bytes())
    with pytest.raises(
        ValueError, match="missing tiny-F16-00002-of-00003.gguf, tiny-F16-00003-of-00003.gguf"
    ):
        load_model_file(lone)


def test_pull_takes_hub_names(fake_hub: FakeHub, models, capsys) -> None:
    from slotserve.cli import main

    assert main(["pull", "--quiet", f"{REPO}:Q4_0"]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed.read_bytes() == models["q4"].read_bytes()


def test_generate_runs_a_hub_model_and_pull_force_fetches_again(fake_hub: FakeHub, capsys) -> None:
    from slotserve.cli import main

    assert main(["generate", "--model", f"{REPO}:Q8_0", "--prompt", "hi", "--max-tokens", "3"]) == 0
    assert "prompt tokens: 2" in capsys.readouterr().err
    assert len(fake_hub.gets_of("tiny-Q8_0.gguf")) == 1
    assert main(["pull", "--quiet", f"{REPO}:Q8_0"]) == 0  # cached: nothing fetched
    assert len(fake_hub.gets_of("tiny-Q8_0.gguf")) == 1
    assert main(["pull", "--quiet", "--force", f"{REPO}:Q8_0"]) == 0
    assert len(fake_hub.gets_of("tiny-Q8_0.gguf")) == 2


def test_gated_repo_with_a_token_that_has_access(fake_hub: FakeHub, monkeypatch, models) -> None:
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    path = model_cache.resolve_model(f"{GATED}:Q8_0", progress=False)
    assert path.read_bytes() == models["q8"].read_bytes()
    assert fake_hub.gets_of("gated-Q8_0.gguf")[0].headers["authorization"] == f"Bearer {GOOD_TOKEN}"


@pytest.mark.parametrize(
    ("name", "token", "fragment"),
    [
        ("acme/missing-GGUF:Q8_0", None, "Hub repository acme/missing-GGUF not found at http://127.0.0.1:"),
        (f"hf://{REPO}/nothing-Q8_0.gguf", None, f"Hub repository {REPO} has no file nothing-Q8_0.gguf"),
        (f"{REPO}:Q2_K", None, f"Hub repository {REPO} has no GGUF file for quantization Q2_K; it has: "),
        (f"{GATED}:Q8_0", None, f"Hub repository {GATED} is gated: accept its terms"),
        (f"{GATED}:Q8_0", "hf_other", f"Hub repository {GATED} is gated and your token has no access"),
    ],
)
def test_errors_are_one_line_and_exit_2(
    fake_hub: FakeHub, monkeypatch, capsys, name, token, fragment
) -> None:
    from slotserve.cli import main

    if token is not None:
        monkeypatch.setenv("HF_TOKEN", token)
    assert main(["pull", "--quiet", name]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("slotserve: error: ") and fragment in err, err
    if "gated" in fragment:
        assert fake_hub.gets_of("gated-Q8_0.gguf") == []


def test_serve_reports_a_missing_repository_in_one_line(fake_hub: FakeHub) -> None:
    env = {**os.environ}
    result = subprocess.run(
        [sys.executable, "-m", "slotserve", "serve", "--port", "1", "--model", "acme/missing-GGUF:Q8_0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("slotserve: error: Hub repository acme/missing-GGUF not found"), lines


# ------------------------------------------------------------------ offline, from a pre-filled cache


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def prefill_cache(cache: Path, repo_id: str, files: dict[str, bytes], commit: str = "c" * 40) -> None:
    """huggingface_hub's cache layout written by hand: blobs by sha256, a snapshot of symlinks,
    refs/main naming it."""
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    (storage / "refs").mkdir(parents=True)
    (storage / "refs" / "main").write_text(commit)
    for name, data in files.items():
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = storage / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))


@pytest.mark.parametrize("offline", [True, False])
def test_cached_model_without_the_hub(models, monkeypatch, tmp_path: Path, offline: bool) -> None:
    # HF_HUB_OFFLINE=1, or simply no Hub reachable: both serve what the cache holds
    cache = hub_env(monkeypatch, tmp_path)
    monkeypatch.setenv("HF_ENDPOINT", _closed_port())
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:  # huggingface_hub retries a refused connection 5 times, 1 + 2 + 4 + 8 + 8 s apart: not here
        import huggingface_hub.utils._http as hf_http

        monkeypatch.setattr(hf_http.time, "sleep", lambda s: None)
    prefill_cache(cache, REPO, {"tiny-Q8_0.gguf": models["q8"].read_bytes(), "README.md": b"x"})
    path = model_cache.resolve_model(f"{REPO}:Q8_0", progress=False)
    assert path.read_bytes() == models["q8"].read_bytes()
    assert load_model_file(path).config.n_layers == 2
    assert model_cache.resolve_model(f"hf://{REPO}/tiny-Q8_0.gguf", progress=False) == path
    with pytest.raises(ModelOpenError) as err:
        model_cache.resolve_model(f"{REPO}:Q4_0", progress=False)
    why = "HF_HUB_OFFLINE is set" if offline else "the Hub at http://127.0.0.1:"
    assert str(err.value).startswith(f"{REPO}:Q4_0 is not in the Hugging Face cache and {why}")
    assert str(err.value).endswith(f"cached GGUF files of {REPO}: tiny-Q8_0.gguf")


def test_offline_without_a_cached_repo_says_so(monkeypatch, tmp_path: Path) -> None:
    hub_env(monkeypatch, tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ModelOpenError, match=r"acme/none-GGUF:Q8_0 is not in the Hugging Face cache and HF_HUB_OFFLINE"
    ):
        hub.fetch(HubRef("acme/none-GGUF", quant="Q8_0"), progress=False)
    with pytest.raises(ModelOpenError, match=r"hf://acme/none-GGUF/m.gguf is not in the Hugging Face cache"):
        hub.fetch(HubRef("acme/none-GGUF", filename="m.gguf"), progress=False)
