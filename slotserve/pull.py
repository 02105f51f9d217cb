"""`slotserve pull`: fetch a known model into the cache (engine_ext/model_cache.py), or a Hub model
into huggingface_hub's (engine_ext/hub.py), and print its path."""

from __future__ import annotations

import argparse
import sys

from slotserve.engine_ext.errors import ModelOpenError
from slotserve.engine_ext.hub import fetch, parse_hub_ref
from slotserve.engine_ext.model_cache import DEFAULT_MODEL, HOME_ENV, MODELS, known_model, model_path, pull


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"Download a known model (default: {DEFAULT_MODEL.name}) into the cache "
        f"(${HOME_ENV}, default ~/.cache/slotserve/models), verify it and print its path; or a "
        f"GGUF from the Hugging Face Hub (hf://OWNER/REPO/FILE.gguf, OWNER/REPO:QUANT) into "
        f"huggingface_hub's cache."
    )
    parser.add_argument(
        "name",
        nargs="?",
        default=DEFAULT_MODEL.name,
        metavar="NAME",
        help=f"short name of a known model (default {DEFAULT_MODEL.name}; --list shows them all), "
        f"or a Hub name: hf://OWNER/REPO/FILE.gguf, OWNER/REPO:QUANT, hf://OWNER/REPO",
    )
    parser.add_argument(
        "--list", action="store_true", help="list the known models and whether each is cached"
    )
    parser.add_argument("--force", action="store_true", help="download again even if the file is cached")
    parser.add_argument("--quiet", action="store_true", help="no progress output")


def list_models() -> str:
    """One line per known model: short name, size, cached or not, summary."""
    lines = []
    width = max(len(name) for name in MODELS)
    for name, spec in MODELS.items():
        try:
            cached = "cached" if model_path(spec).is_file() else "not cached"
        except ValueError:  # a bad $SLOTSERVE_HOME is reported by pull, not by the listing
            cached = "?"
        lines.append(f"{name:<{width}}  {spec.size / 1e6:6.0f} MB  {cached:<10}  {spec.summary}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(list_models())
        return 0
    try:
        ref = parse_hub_ref(args.name) if args.name not in MODELS else None
        if ref is not None:
            path = fetch(ref, progress=not args.quiet, force=args.force)
        else:
            path = pull(known_model(args.name), force=args.force, progress=not args.quiet)
    except ModelOpenError:  # a Hub model that cannot be fetched: `slotserve: error: ...`, exit 2 (cli.py)
        raise
    except ValueError as exc:
        print(f"slotserve pull: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
