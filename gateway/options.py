"""The one option table behind `slotserve serve`'s flags and the `SLOTSERVE_*` environment.

Design: every `ServeConfig` field is declared once in `OPTIONS` (flag names, environment
variable, type, default, help). `add_arguments` turns the table into argparse flags whose
defaults are `None`, and `config_from_args` resolves each option as command line > environment >
default, so `--port 9000` beats `SLOTSERVE_PORT=9000` beats 8080. A malformed environment value
raises `ValueError` naming the variable; it is never silently ignored. Side effects (loading the
model, binding the socket) happen later, in `runtime.load_runtime` and `server.serve`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..scheduler.config import parse_bool
from .config import LOG_LEVELS, ServeConfig

ENV_PREFIX = "SLOTSERVE_"


def _parse_names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


@dataclass(frozen=True)
class Option:
    """One `ServeConfig` field as it appears on the command line and in the environment."""

    field: str  # ServeConfig attribute
    flags: tuple[str, ...]  # argparse flags, the first is canonical
    parse: Callable[[str], object]  # environment text -> value (raises ValueError)
    help: str
    kind: str = "value"  # "value" | "flag" (store_true) | "names" (one or more values)
    metavar: str | None = None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.field.upper()


OPTIONS: tuple[Option, ...] = (
    Option(
        "model",
        ("--model", "-m"),
        str,
        "a known model's short name (`slotserve pull --list`, pulled on first use) or a GGUF "
        "file path (default: the default model)",
        metavar="NAME|PATH",
    ),
    Option("host", ("--host",), str, "address to bind (default 127.0.0.1)"),
    Option("port", ("--port",), int, "port to bind (default 8080)"),
    Option(
        "batched_session",
        ("--batched-session", "--parallel", "-np"),
        int,
        "number of live KV slots (default 4)",
        metavar="N",
    ),
    Option(
        "ctx_size",
        ("--ctx-size", "-c"),
        int,
        "tokens of context per slot (default 4096; at most the model's trained context)",
        metavar="T",
    ),
    Option(
        "allow_ctx_over_train",
        ("--allow-ctx-over-train",),
        parse_bool,
        "accept a --ctx-size above the context the model was trained for (its output degrades there)",
        kind="flag",
    ),
    Option("threads", ("--threads", "-t"), int, "engine threads (default: the engine's choice)", metavar="K"),
    Option(
        "served_model_name",
        ("--served-model-name",),
        _parse_names,
        "model names clients may send (default: the short name of --model, else the file name "
        "without .gguf); env: comma-separated",
        kind="names",
        metavar="NAME",
    ),
    Option(
        "segment_tokens",
        ("--segment-tokens",),
        int,
        "prefill segment length in tokens (default: the scheduler's)",
        metavar="S",
    ),
    Option(
        "checkpoint_memory_mb",
        ("--checkpoint-memory-mb",),
        int,
        "memory for KV checkpoints, MB (default: 1/8 of the memory available at start, "
        "at least 256, at most 4096)",
        metavar="M",
    ),
    Option(
        "chat_template",
        ("--chat-template",),
        str,
        "jinja chat template file used instead of the GGUF's (e.g. one that renders tools)",
        metavar="FILE",
    ),
    Option(
        "checkpoint_interval_tokens",
        ("--checkpoint-interval-tokens",),
        int,
        "checkpoint every K tokens of a long prefill, 0 = off (default: off for full KV, sized by "
        "the window and --checkpoint-memory-mb for sliding-window rings)",
        metavar="K",
    ),
    Option(
        "kv_disk_dir",
        ("--kv-disk-dir",),
        str,
        "directory for the disk checkpoint tier (default: none, nothing written)",
        metavar="D",
    ),
    Option(
        "kv_disk_space_mb",
        ("--kv-disk-space-mb",),
        int,
        "disk budget for --kv-disk-dir, MB (default: the scheduler's)",
        metavar="M",
    ),
    Option(
        "api_key",
        ("--api-key",),
        str,
        "require 'Authorization: Bearer KEY' (prefer the environment variable)",
        metavar="KEY",
    ),
    Option(
        "max_queue",
        ("--max-queue",),
        int,
        "requests that may wait for a slot before 429 (default 64)",
        metavar="Q",
    ),
    Option(
        "prefill_order",
        ("--prefill-order",),
        str,
        "who gets a free slot and the prefill budget first, within a priority: cost (least prompt "
        "left to prefill, aged by waiting time; default) or fifo (arrival order)",
        metavar="cost|fifo",
    ),
    Option(
        "reasoning_format",
        ("--reasoning-format",),
        str,
        "a reply's leading <think> block: none (left in the content), deepseek or auto (default: "
        "moved to reasoning_content / thinking blocks / reasoning items), deepseek-legacy (kept in "
        "the content and copied to reasoning_content)",
        metavar="none|deepseek|deepseek-legacy|auto",
    ),
    Option(
        "prefill_aging_tokens_per_s",
        ("--prefill-aging-tokens-per-s",),
        float,
        "cost order's aging: a request with C tokens to prefill is overtaken only by requests "
        "arriving less than C / R seconds after it (default: auto, a quarter of the measured "
        "prefill tokens/s)",
        metavar="R",
    ),
    Option(
        "no_reuse", ("--no-reuse",), parse_bool, "disable all prefix reuse (benchmark baseline)", kind="flag"
    ),
    Option(
        "no_decode_chain",
        ("--no-decode-chain",),
        parse_bool,
        "the event loop plans every engine step (default: plain decode steps chain on the engine "
        "worker, which picks their tokens)",
        kind="flag",
    ),
    Option(
        "swa_full",
        ("--swa-full",),
        parse_bool,
        "sliding-window layers keep every row instead of a ring of the window: every length "
        "rewindable, more KV memory",
        kind="flag",
    ),
    Option(
        "kv_type",
        ("--kv-type",),
        str,
        "KV element type: f16 (default) or q8_0 (keys and values in 8 bits with a scale per 32 "
        "values: 53% of the KV and checkpoint bytes; head_dim a multiple of 32)",
        metavar="f16|q8_0",
    ),
    Option(
        "max_batch_tokens",
        ("--max-batch-tokens",),
        int,
        "rows the engine computes in one step (default 512; longer forwards run in several "
        "steps, with identical results); a sliding-window ring keeps the window + this - 1 rows, "
        "so a smaller value shrinks the rings' KV and how far back a slot can be cut",
        metavar="B",
    ),
    Option(
        "speculative",
        ("--speculative",),
        str,
        "ngram: each decoding slot's step also verifies a draft of its next tokens copied from "
        "the conversation itself (prompt lookup), where the measured cost of a row pays for it; "
        "output unchanged (greedy: token for token; sampled: same distribution, same seeded "
        "tokens) (default); off",
        metavar="ngram|off",
    ),
    Option(
        "draft_max",
        ("--draft-max",),
        int,
        "most draft tokens one slot's step carries with --speculative ngram (default 8)",
        metavar="K",
    ),
    Option("log_level", ("--log-level",), str, f"one of {', '.join(LOG_LEVELS)} (default info)", metavar="L"),
    Option("no_slots_endpoint", ("--no-slots-endpoint",), parse_bool, "turn GET /slots off", kind="flag"),
    Option(
        "max_body_bytes",
        ("--max-body-bytes",),
        int,
        "largest request body, bytes (default 4 MiB)",
        metavar="B",
    ),
    Option(
        "max_tokens_limit",
        ("--max-tokens-limit",),
        int,
        "largest max_tokens a request may ask for, and the bound of a request that gives none "
        "(default 32768)",
        metavar="N",
    ),
    Option(
        "default_max_tokens",
        ("--default-max-tokens",),
        int,
        "max_tokens of a chat or Responses request that gives none (default: none, generate "
        "until the end of the turn or of the slot's context, at most --max-tokens-limit)",
        metavar="N",
    ),
    Option(
        "stream_keepalive_s",
        ("--stream-keepalive-s",),
        float,
        "an idle stream (waiting for a slot, prefilling) writes a keep-alive after this many "
        "seconds without output: an SSE comment, a ping event on /v1/messages (default 5; 0: off)",
        metavar="S",
    ),
    Option(
        "drain_grace_s",
        ("--drain-grace-s",),
        float,
        "on SIGTERM, seconds running requests may finish (default 30)",
        metavar="S",
    ),
    Option(
        "shutdown_timeout_s",
        ("--shutdown-timeout-s",),
        float,
        "on SIGTERM, seconds past the grace period the scheduler may take to stop before the process exits 1 anyway (default 10)",
        metavar="S",
    ),
    Option(
        "request_timeout_s",
        ("--request-timeout", "--request-timeout-s"),
        float,
        "seconds a request may take from admission, queue included; 0 = no limit (default 0)",
        metavar="S",
    ),
    Option(
        "kv_events_endpoint",
        ("--kv-events-endpoint",),
        str,
        "publish KV cache events to this ZMQ endpoint (needs pyzmq; default off)",
        metavar="URL",
    ),
    Option(
        "kv_events_topic",
        ("--kv-events-topic",),
        str,
        "topic frame of KV-event messages (default empty)",
        metavar="TOPIC",
    ),
    Option(
        "kv_events_block_size",
        ("--kv-events-block-size",),
        int,
        "tokens per KV-event block (default 16)",
        metavar="B",
    ),
    Option(
        "normalize",
        ("--normalize",),
        _parse_names,
        "client quirks to undo before rendering, so prefixes stay reusable (docs/caching.md): "
        "claude-code; default: none; env: comma-separated",
        kind="names",
        metavar="CLIENT",
    ),
    Option(
        "cors_allow_origin",
        ("--cors-allow-origin",),
        _parse_names,
        "browser origins allowed to call the API (CORS, preflight answered); default: CORS off; env: comma-separated",
        kind="names",
        metavar="ORIGIN",
    ),
    Option(
        "header_timeout_s",
        ("--header-timeout-s",),
        float,
        "seconds a connection may take to send a request's head (default 10)",
        metavar="S",
    ),
    Option(
        "body_timeout_s",
        ("--body-timeout-s",),
        float,
        "seconds a request's body may take to arrive after its head (default 60)",
        metavar="S",
    ),
    Option(
        "keep_alive_timeout_s",
        ("--keep-alive-timeout-s",),
        float,
        "seconds an idle keep-alive connection stays open (default 5)",
        metavar="S",
    ),
    Option(
        "max_connections",
        ("--max-connections",),
        int,
        "open connections; more are answered 503 and closed (default 256)",
        metavar="N",
    ),
    Option(
        "ssl_certfile",
        ("--ssl-certfile",),
        str,
        "TLS certificate chain (PEM); with --ssl-keyfile the server speaks https",
        metavar="PATH",
    ),
    Option(
        "ssl_keyfile",
        ("--ssl-keyfile",),
        str,
        "TLS private key (PEM) of --ssl-certfile",
        metavar="PATH",
    ),
)

assert {o.field for o in OPTIONS} == {f.name for f in fields(ServeConfig)}, "OPTIONS and ServeConfig disagree"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per option; every default is None so `config_from_args` sees what was typed."""
    for opt in OPTIONS:
        help_text = f"{opt.help} [env {opt.env}]".replace("%", "%%")  # argparse formats help with %
        if opt.kind == "flag":
            parser.add_argument(*opt.flags, dest=opt.field, action="store_true", default=None, help=help_text)
        elif opt.kind == "names":
            parser.add_argument(
                *opt.flags, dest=opt.field, nargs="+", default=None, metavar=opt.metavar, help=help_text
            )
        else:
            parser.add_argument(
                *opt.flags, dest=opt.field, type=opt.parse, default=None, metavar=opt.metavar, help=help_text
            )


def config_from_args(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> ServeConfig:
    """Resolve every option: command line, else `SLOTSERVE_<FIELD>`, else the ServeConfig default.

    Raises ValueError naming the variable for a malformed environment value, and ServeConfig's
    ValueError for an out-of-range value.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}  # field -> value of any option's type: ServeConfig(**values) checks them
    for opt in OPTIONS:
        typed = getattr(args, opt.field, None) if args is not None else None
        if typed is not None:
            values[opt.field] = tuple(typed) if opt.kind == "names" else typed
            continue
        raw = environ.get(opt.env)
        if raw is None:
            continue
        try:
            values[opt.field] = opt.parse(raw)
        except ValueError as exc:
            raise ValueError(f"environment variable {opt.env}={raw!r} is not valid: {exc}") from None
    return ServeConfig(**values)
