"""The `slotserve` command: one subcommand per module, imported only when it runs.

Each command module provides `configure(parser: argparse.ArgumentParser) -> None` and
`run(args: argparse.Namespace) -> int`. Adding a command is one line in COMMANDS. A model that
cannot be opened (engine_ext.errors.ModelOpenError: missing, broken or unsupported file, context
over the trained one) ends any command with one line `slotserve: error: ...` and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "pull": ("slotserve.pull", "download a known model into the cache (--list shows them)"),
    "generate": ("slotserve.generate", "one-shot generation on a model"),
    "serve": ("slotserve.gateway.cli", "start the OpenAI-compatible server"),
    "bench": ("slotserve.bench.cli", "benchmarks (engine, routing)"),
    "loadtest": (
        "slotserve.bench.loadtest.cli",
        "drive an OpenAI-compatible endpoint with agent/chat traffic",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slotserve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text)
        cmd.set_defaults(_module=module_name)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # a command whose module is missing is reported when it runs
            cmd.set_defaults(_import_error=exc)
            continue
        module.configure(cmd)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_import_error", None) is not None:
        print(f"slotserve {args.command}: unavailable ({args._import_error})", file=sys.stderr)
        return 2
    module = importlib.import_module(args._module)
    from slotserve.engine_ext.errors import ModelOpenError

    try:
        return int(module.run(args) or 0)
    except ModelOpenError as exc:  # a model that cannot be opened: one line, no traceback
        print(f"slotserve: error: {exc}", file=sys.stderr)
        return 2
