"""`slotserve serve`: start the OpenAI-compatible server (flags and `SLOTSERVE_*` in config.py)."""

from __future__ import annotations

import argparse
import sys

from .options import add_arguments, config_from_args


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve a GGUF model over an OpenAI-compatible HTTP API. Every flag can also be set "
        "as an environment variable SLOTSERVE_<FLAG> (e.g. SLOTSERVE_PORT=9000); flags win."
    )
    add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"slotserve serve: {exc}", file=sys.stderr)
        return 2
    from .server import serve

    return serve(config)
