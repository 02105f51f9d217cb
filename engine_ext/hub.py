"""GGUF models from the Hugging Face Hub, by name, through `huggingface_hub`.

Names (`--model`, `slotserve pull`):

    hf://OWNER/REPO/PATH.gguf     that file of the repository (PATH may hold folders)
    OWNER/REPO:QUANT              the GGUF whose file name carries QUANT (Q4_K_M, q8_0, ...), as
    hf://OWNER/REPO:QUANT           llama.cpp's `-hf OWNER/REPO:QUANT` picks it
    hf://OWNER/REPO               Q4_K_M if the repository has it, else its only GGUF

A quantization matches a file whose name, split on `-` and `.`, has it as one piece (any case):
`Q4_K` matches `model-Q4_K.gguf`, not `model-Q4_K_M.gguf`; `mmproj` files (vision projectors)
never match. A split GGUF (`NAME-00001-of-0000N.gguf`, engine_ext/gguf_split.py) is fetched whole:
every part is downloaded and the model is read from the parts in place.

Everything goes through huggingface_hub and behaves as its other users expect: its cache
(`HF_HUB_CACHE`, `HF_HOME`; files downloaded once, shared with transformers, llama.cpp's
`-hf` ...), resumable downloads (an interrupted file resumes with a range request), the token
(`HF_TOKEN`, or `hf auth login`'s), `HF_HUB_OFFLINE=1` (only the cache: a quantization is looked
up among the cached files) and `HF_ENDPOINT` (a mirror, or a test server). These variables are
read at each call, not when huggingface_hub is imported.

Every failure is a ModelOpenError with one line saying what is missing: the repository, the file,
the quantization (naming those the repository has), access to a gated repository, or the Hub.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ModelOpenError
from .gguf_split import part_names, split_name

SCHEME = "hf://"
DEFAULT_QUANT = "Q4_K_M"  # llama.cpp's -hf default
_REPO = r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*"
_QUANT = r"[A-Za-z0-9][A-Za-z0-9_]*"
_HF_FILE = re.compile(rf"^(?P<repo>{_REPO})/(?P<file>[^:]+\.gguf)$", re.IGNORECASE)
_HF_REPO = re.compile(rf"^(?P<repo>{_REPO})(?::(?P<quant>{_QUANT}))?$")
_BARE = re.compile(rf"^(?P<repo>{_REPO}):(?P<quant>{_QUANT})$")


@dataclass(frozen=True)
class HubRef:
    """A model named on the Hub: a repository and either one file or a quantization."""

    repo_id: str  # OWNER/REPO
    filename: str | None = None  # a path in the repository (hf://OWNER/REPO/PATH.gguf)
    quant: str | None = None  # OWNER/REPO:QUANT; neither: DEFAULT_QUANT, else the only GGUF

    def __str__(self) -> str:
        if self.filename is not None:
            return f"{SCHEME}{self.repo_id}/{self.filename}"
        return self.repo_id + (f":{self.quant}" if self.quant else "")


def parse_hub_ref(value: str) -> HubRef | None:
    """The HubRef a `--model` value names, or None when it is not a Hub name (a short name or a
    path). `hf://` names that do not parse raise ModelOpenError saying the forms."""
    if value.startswith(SCHEME):
        rest = value[len(SCHEME) :]
        if m := _HF_FILE.match(rest):
            return HubRef(m["repo"], filename=m["file"])
        if m := _HF_REPO.match(rest):
            return HubRef(m["repo"], quant=m["quant"])
        raise ModelOpenError(
            f"{value!r} is not a Hub model name; use hf://OWNER/REPO/FILE.gguf, OWNER/REPO:QUANT "
            f"or hf://OWNER/REPO"
        )
    if m := _BARE.match(value):
        return HubRef(m["repo"], quant=m["quant"])
    return None


def quant_matches(filename: str, quant: str) -> bool:
    """Whether the file (a path in the repository) is a GGUF of quantization `quant`."""
    name = filename.rsplit("/", 1)[-1]
    if not name.lower().endswith(".gguf") or "mmproj" in name.lower():
        return False
    parsed = split_name(name)
    stem = parsed[0] if parsed is not None else name[: -len(".gguf")]
    return quant.upper() in (piece.upper() for piece in re.split(r"[-.]", stem))


def choose_files(ref: HubRef, repo_files: list[str]) -> list[str]:
    """The repository paths to fetch for `ref` (every part of a split, in order), chosen among
    `repo_files`; ModelOpenError naming what the repository offers when nothing matches."""
    ggufs = _ggufs(repo_files)
    if ref.filename is not None:
        wanted = ref.filename
    else:
        quant = ref.quant or DEFAULT_QUANT
        matches = [f for f in ggufs if quant_matches(f, quant)]
        firsts = [f for f in matches if (s := split_name(f.rsplit("/", 1)[-1])) is None or s[1] == 1]
        if firsts:
            wanted = min(firsts, key=lambda f: (f.count("/"), len(f), f))  # the plainest path
        elif ref.quant is None and len(_models(ggufs)) == 1:
            wanted = _models(ggufs)[0]
        elif not ggufs:
            raise ModelOpenError(f"Hub repository {ref.repo_id} has no .gguf file")
        else:
            raise ModelOpenError(
                f"Hub repository {ref.repo_id} has no GGUF file for quantization {quant}; "
                f"it has: {', '.join(_models(ggufs))} (name one as {ref.repo_id}:QUANT or "
                f"hf://{ref.repo_id}/FILE.gguf)"
            )
    folder, _, name = wanted.rpartition("/")
    return [f"{folder}/{n}" if folder else n for n in part_names(name)]


def _ggufs(files: list[str]) -> list[str]:
    """The model GGUFs among repository paths, sorted (vision projectors, `mmproj`, left out)."""
    return sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower())


def _models(ggufs: list[str]) -> list[str]:
    """One entry per model among GGUF paths: a split counts once, by its first part."""
    return [f for f in ggufs if (s := split_name(f.rsplit("/", 1)[-1])) is None or s[1] == 1]


def fetch(ref: HubRef, *, progress: bool = True, force: bool = False) -> Path:
    """Download what `ref` names into huggingface_hub's cache (or find it there; `force`: download
    again) and return the local path of the model's file (of its first part, for a split GGUF:
    the parts lie beside it)."""
    hf = _hf()
    settings = _settings()
    with _quiet(hf, progress):
        try:
            if ref.filename is not None:
                files = choose_files(ref, [])
            else:
                files = _choose_listed(hf, ref, settings)
            paths = [
                hf.hf_hub_download(
                    ref.repo_id,
                    name,
                    endpoint=settings["endpoint"],
                    cache_dir=settings["cache_dir"],
                    local_files_only=settings["offline"],
                    force_download=force,
                )
                for name in files
            ]
        except ModelOpenError:
            raise
        except Exception as exc:
            raise ModelOpenError(_explain(hf, ref, exc, settings)) from exc
    return Path(paths[0])


def _hf() -> Any:
    try:
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.errors
        import huggingface_hub.utils  # noqa: F401 (submodules: the package imports them lazily)
    except ImportError as exc:  # a dependency: only a broken install lacks it
        raise ModelOpenError(f"Hub model names need the huggingface_hub package ({exc})") from exc
    return huggingface_hub


def _settings() -> dict[str, Any]:
    """HF_ENDPOINT, HF_HUB_CACHE / HF_HOME and HF_HUB_OFFLINE as they are now (huggingface_hub
    reads them once, at import)."""
    cache = os.environ.get("HF_HUB_CACHE")
    if not cache and os.environ.get("HF_HOME"):
        cache = os.path.join(os.environ["HF_HOME"], "hub")
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    return {
        "endpoint": (os.environ.get("HF_ENDPOINT") or "").rstrip("/") or None,
        "cache_dir": os.path.expanduser(cache) if cache else None,
        "offline": offline,
    }


def _choose_listed(hf: Any, ref: HubRef, settings: dict[str, Any]) -> list[str]:
    """`choose_files` among the repository's files: listed by the Hub, or (HF_HUB_OFFLINE, or the
    Hub unreachable) those of its cached snapshot, with an error saying so."""
    why = "HF_HUB_OFFLINE is set"
    if not settings["offline"]:
        try:
            return choose_files(
                ref, list(hf.HfApi(endpoint=settings["endpoint"]).list_repo_files(ref.repo_id))
            )
        except ModelOpenError:
            raise
        except Exception as exc:
            if not _is_connection_error(hf, exc):
                raise
            why = f"the Hub at {settings['endpoint'] or hf.constants.ENDPOINT} is unreachable"
    cached = _cached_files(hf, ref, settings)
    if cached is None:
        raise ModelOpenError(
            f"{ref} is not in the Hugging Face cache and {why}; pull it once online (slotserve pull {ref})"
        )
    try:
        return choose_files(ref, cached)
    except ModelOpenError:
        have = ", ".join(_models(_ggufs(cached)))
        raise ModelOpenError(
            f"{ref} is not in the Hugging Face cache and {why}; cached GGUF files of "
            f"{ref.repo_id}: {have or 'none'}"
        ) from None


def _cached_files(hf: Any, ref: HubRef, settings: dict[str, Any]) -> list[str] | None:
    """Files of the repository's cached snapshot of `main` (None if it has none)."""
    from huggingface_hub.file_download import repo_folder_name

    root = Path(settings["cache_dir"] or hf.constants.HF_HUB_CACHE)
    storage = root / repo_folder_name(repo_id=ref.repo_id, repo_type="model")
    ref_file = storage / "refs" / "main"
    if not ref_file.is_file():
        return None
    snapshot = storage / "snapshots" / ref_file.read_text().strip()
    if not snapshot.is_dir():
        return None
    return sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())


def _is_connection_error(hf: Any, exc: BaseException) -> bool:
    # httpx's (huggingface_hub 1.x and later) and requests' (0.x) names for "no connection"
    names = {"ConnectError", "ConnectTimeout", "TimeoutException", "ConnectionError", "OfflineModeIsEnabled"}
    return any(type(e).__name__ in names for e in _chain(exc))


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in out:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _explain(hf: Any, ref: HubRef, exc: Exception, settings: dict[str, Any]) -> str:
    """One line for a huggingface_hub failure."""
    errors = hf.errors
    where = settings["endpoint"] or hf.constants.ENDPOINT
    token = bool(os.environ.get("HF_TOKEN")) or hf.get_token() is not None
    if isinstance(exc, errors.GatedRepoError):
        if token:
            return (
                f"Hub repository {ref.repo_id} is gated and your token has no access to it: "
                f"accept its terms on the repository's page with that account"
            )
        return (
            f"Hub repository {ref.repo_id} is gated: accept its terms on the repository's page, "
            f"then set HF_TOKEN to a token of that account"
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        private = "" if token else " (a private repository needs HF_TOKEN)"
        return f"Hub repository {ref.repo_id} not found at {where}{private}"
    if isinstance(exc, errors.RevisionNotFoundError):
        return f"Hub repository {ref.repo_id} has no branch main"
    if isinstance(exc, errors.LocalEntryNotFoundError) or settings["offline"]:
        if settings["offline"]:
            return (
                f"{ref} is not in the Hugging Face cache and HF_HUB_OFFLINE is set; "
                f"pull it once online (slotserve pull {ref})"
            )
        return f"cannot reach the Hub at {where} and {ref} is not in the Hugging Face cache"
    if isinstance(exc, errors.EntryNotFoundError):
        missing = getattr(exc, "response", None)
        url = str(missing.request.url) if missing is not None and missing.request is not None else ""
        name = url.rsplit("/resolve/", 1)[-1].split("/", 1)[-1] if "/resolve/" in url else ref.filename
        return f"Hub repository {ref.repo_id} has no file {name}"
    if _is_connection_error(hf, exc):
        return f"cannot reach the Hub at {where}: {type(exc).__name__}"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"Hub download of {ref} failed: {first}"


class _quiet:
    """For one call: huggingface_hub's progress bars on when `progress`, off otherwise, and its
    HTTP client's one-line-per-request INFO logs off (`serve` logs at INFO); both restored after."""

    LOGGERS = ("httpx2", "httpx")

    def __init__(self, hf: Any, progress: bool) -> None:
        self.utils, self.progress = hf.utils, progress

    def __enter__(self) -> None:
        self.was_disabled = self.utils.are_progress_bars_disabled()
        if not self.progress:
            self.utils.disable_progress_bars()
        self.levels = [(lg, lg.level) for lg in map(logging.getLogger, self.LOGGERS)]
        for lg, _ in self.levels:
            lg.setLevel(max(lg.level, logging.WARNING))

    def __exit__(self, *exc: object) -> None:
        if not self.progress and not self.was_disabled:
            self.utils.enable_progress_bars()
        for lg, level in self.levels:
            lg.setLevel(level)
