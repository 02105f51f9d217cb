"""Server configuration: one frozen `ServeConfig`, filled from the command line and `SLOTSERVE_*`.

Design: every option is declared once in `OPTIONS` (flag names, environment variable, type,
default, help). `add_arguments` turns the table into argparse flags whose defaults are `None`,
and `config_from_args` resolves each option as command line > environment > default, so
`--port 9000` beats `SLOTSERVE_PORT=9000` beats 8080. A malformed environment value raises
`ValueError` naming the variable; it is never silently ignored. `ServeConfig.__post_init__`
checks ranges, so a config that exists is a valid one. Side effects (loading the model, binding
the socket) happen later, in `runtime.load_runtime` and `server.serve`.
"""

from __future__ import annotations

import argparse
import enum
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..scheduler.config import parse_bool
from ..scheduler.prefill_order import PrefillOrder
from .client_quirks import Normalization
from .kv_events import KVEventsConfig
from .reasoning import ReasoningFormat

ENV_PREFIX = "SLOTSERVE_"
_ORIGIN = re.compile(r"https?://[^/\s]+")  # a browser Origin header: scheme://host[:port]


class LogLevel(str, enum.Enum):
    """--log-level: uvicorn's levels (trace: everything, as debug for slotserve's own loggers)."""

    CRITICAL = "critical"
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"
    DEBUG = "debug"
    TRACE = "trace"


LOG_LEVELS = tuple(level.value for level in LogLevel)
# --max-batch-tokens' upper bound: the engine's step buffers grow with it (Gemma 3 270M: about
# 40 KiB a row; an 8B model: about 300 KiB), and longer forwards run in several steps anyway.
MAX_BATCH_TOKENS = 16384
SPECULATIVE_MODES = ("ngram", "off")
KV_TYPES = ("f16", "q8_0")  # --kv-type (the engine also has f32, for tests)


@dataclass(frozen=True)
class ServeConfig:
    """Everything `slotserve serve` needs; validated at construction (ValueError with the fix)."""

    model: str | None = None  # short name or GGUF path; None = the default model, pulled on first use
    host: str = "127.0.0.1"
    port: int = 8080
    batched_session: int = 4  # number of live KV slots
    ctx_size: int = 4096  # tokens of KV per slot
    allow_ctx_over_train: bool = False  # accept a ctx_size above the model's trained context
    threads: int | None = None  # engine threads; None = the engine's choice
    served_model_name: tuple[str, ...] = ()  # names clients may send; () = the short name or file stem
    chat_template: str | None = None  # jinja chat template file replacing the GGUF's; None = the GGUF's
    segment_tokens: int | None = None  # prefill segment length; None = the scheduler's default
    checkpoint_memory_mb: int | None = (
        None  # in-memory checkpoint budget; None = sized (checkpoint_budget.py)
    )
    checkpoint_interval_tokens: int | None = None  # checkpoint every K prefill tokens; None = auto, 0 = off
    kv_disk_dir: str | None = None  # disk tier for checkpoints; None = no disk writes
    kv_disk_space_mb: int | None = None  # disk tier budget; None = the scheduler's default
    # when set, /v1/*, /tokenize, /detokenize, /slots need it; kept out of repr (logs, tracebacks)
    api_key: str | None = field(default=None, repr=False)
    max_queue: int = 64  # requests admitted but waiting for a slot; past it -> 429
    prefill_order: PrefillOrder = PrefillOrder.COST  # queue and prefill order (scheduler/prefill_order.py)
    reasoning_format: ReasoningFormat = ReasoningFormat.AUTO  # <think> blocks: gateway/reasoning.py
    prefill_aging_tokens_per_s: float | None = None  # cost order's aging rate; None = auto (measured)
    no_reuse: bool = False  # disable every form of prefix reuse (benchmark baseline)
    no_decode_chain: bool = False  # every engine step planned by the event loop (scheduler/chain.py)
    swa_full: bool = False  # sliding-window layers keep every row (no rings): more KV memory
    kv_type: str = "f16"  # KV element type: f16, or q8_0 (8-bit keys and values, 53% of the bytes)
    max_batch_tokens: int | None = None  # rows of one engine step (and of a ring past the window); None = 512
    speculative: str = (
        "ngram"  # ngram (default): speculative drafts from the conversation itself (scheduler/draft.py); off
    )
    draft_max: int = 8  # most draft tokens one slot's step carries (with --speculative ngram)
    log_level: LogLevel = LogLevel.INFO
    no_slots_endpoint: bool = False  # turn GET /slots off
    max_body_bytes: int = 4 * 1024 * 1024  # request bodies past this -> 413
    max_tokens_limit: int = 32768  # largest max_tokens a request may ask for
    # max_tokens of a chat/Responses request that gives none; None = until the end of the turn or
    # of the slot's context, at most max_tokens_limit (as OpenAI, vLLM and llama.cpp do)
    default_max_tokens: int | None = None
    stream_keepalive_s: float = (
        5.0  # an idle stream (queued, prefilling) writes a keep-alive this often; 0 = off
    )
    drain_grace_s: float = 30.0  # on SIGTERM: how long running requests may finish
    shutdown_timeout_s: float = 10.0  # then how long the scheduler may take to stop before exit 1
    request_timeout_s: float = 0.0  # per-request limit from admission (queue included); 0 = none
    kv_events_endpoint: str | None = None  # ZMQ endpoint for KV events (gateway/kv_events/); None = off
    kv_events_topic: str = ""  # first frame of every KV-event message
    kv_events_block_size: int = 16  # tokens per virtual block; must equal the router's
    # -- connection hardening (gateway/transport.py, gateway/http_guard.py)
    cors_allow_origin: tuple[str, ...] = ()  # browser origins allowed (CORS); () = CORS off
    normalize: tuple[str, ...] = ()  # client quirks removed before rendering (client_quirks.py)
    header_timeout_s: float = 10.0  # a request head must arrive within this; else 408 + close
    body_timeout_s: float = 60.0  # a request body must arrive within this after its head; else 408
    keep_alive_timeout_s: float = 5.0  # idle keep-alive connections are closed after this
    max_connections: int = 256  # open connections; past it new ones get 503 and are closed
    ssl_certfile: str | None = None  # TLS certificate (PEM); with ssl_keyfile serves https
    ssl_keyfile: str | None = None  # TLS private key (PEM)

    def __post_init__(self) -> None:
        def need(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        need(1 <= self.port <= 65535, f"port must be in 1..65535, got {self.port}")
        need(self.batched_session >= 1, f"--batched-session must be >= 1, got {self.batched_session}")
        need(self.ctx_size >= 16, f"--ctx-size must be >= 16 tokens, got {self.ctx_size}")
        need(self.threads is None or self.threads >= 1, f"--threads must be >= 1, got {self.threads}")
        need(all(n.strip() for n in self.served_model_name), "--served-model-name: names must be non-empty")
        need(
            self.kv_type in KV_TYPES, f"--kv-type must be one of {', '.join(KV_TYPES)}, got {self.kv_type!r}"
        )
        need(
            self.segment_tokens is None or self.segment_tokens >= 1,
            f"--segment-tokens must be >= 1, got {self.segment_tokens}",
        )
        need(
            self.checkpoint_memory_mb is None or self.checkpoint_memory_mb >= 0,
            f"--checkpoint-memory-mb must be >= 0, got {self.checkpoint_memory_mb}",
        )
        need(
            self.checkpoint_interval_tokens is None or self.checkpoint_interval_tokens >= 0,
            f"--checkpoint-interval-tokens must be >= 0 (0: off), got {self.checkpoint_interval_tokens}",
        )
        need(
            self.kv_disk_dir is not None or self.kv_disk_space_mb is None,
            "--kv-disk-space-mb has no effect without --kv-disk-dir; give the directory too",
        )
        need(self.kv_disk_dir is None or self.kv_disk_dir.strip() != "", "--kv-disk-dir must not be empty")
        need(
            self.chat_template is None or self.chat_template.strip() != "",
            "--chat-template must not be empty",
        )
        need(
            self.kv_disk_space_mb is None or self.kv_disk_space_mb >= 1,
            f"--kv-disk-space-mb must be >= 1, got {self.kv_disk_space_mb}",
        )
        need(self.api_key is None or len(self.api_key) > 0, "--api-key must not be empty")
        need(self.max_queue >= 0, f"--max-queue must be >= 0, got {self.max_queue}")
        orders = tuple(o.value for o in PrefillOrder)
        need(
            self.prefill_order in orders,
            f"--prefill-order must be one of {', '.join(orders)}, got {self.prefill_order!r}",
        )
        object.__setattr__(self, "prefill_order", PrefillOrder(self.prefill_order))  # text given: the member
        formats = tuple(f.value for f in ReasoningFormat)
        need(
            self.reasoning_format in formats,
            f"--reasoning-format must be one of {', '.join(formats)}, got {self.reasoning_format!r}",
        )
        object.__setattr__(self, "reasoning_format", ReasoningFormat(self.reasoning_format))
        need(
            self.prefill_aging_tokens_per_s is None or self.prefill_aging_tokens_per_s > 0,
            f"--prefill-aging-tokens-per-s must be > 0, got {self.prefill_aging_tokens_per_s}",
        )
        need(
            self.speculative in SPECULATIVE_MODES,
            f"--speculative must be one of {', '.join(SPECULATIVE_MODES)}, got {self.speculative!r}",
        )
        need(
            self.max_batch_tokens is None or 1 <= self.max_batch_tokens <= MAX_BATCH_TOKENS,
            f"--max-batch-tokens must be in 1..{MAX_BATCH_TOKENS} (rows of one engine step), "
            f"got {self.max_batch_tokens}",
        )
        need(
            1 <= self.draft_max < 512
            and (self.speculative == "off" or self.draft_max < (self.max_batch_tokens or 512)),
            f"--draft-max must be in 1..511 and, with --speculative ngram, below --max-batch-tokens; got {self.draft_max}",
        )
        need(self.log_level in LOG_LEVELS, f"--log-level must be one of {', '.join(LOG_LEVELS)}")
        object.__setattr__(self, "log_level", LogLevel(self.log_level))
        need(self.max_body_bytes >= 1024, f"--max-body-bytes must be >= 1024, got {self.max_body_bytes}")
        need(self.max_tokens_limit >= 1, f"--max-tokens-limit must be >= 1, got {self.max_tokens_limit}")
        need(
            self.default_max_tokens is None or 1 <= self.default_max_tokens <= self.max_tokens_limit,
            f"--default-max-tokens must be in 1..--max-tokens-limit ({self.max_tokens_limit}), "
            f"got {self.default_max_tokens}",
        )
        need(
            self.stream_keepalive_s >= 0,
            f"--stream-keepalive-s must be >= 0 (0 turns keep-alives off), got {self.stream_keepalive_s}",
        )
        need(self.drain_grace_s >= 0, f"--drain-grace-s must be >= 0, got {self.drain_grace_s}")
        need(self.shutdown_timeout_s > 0, f"--shutdown-timeout-s must be > 0, got {self.shutdown_timeout_s}")
        need(
            self.request_timeout_s >= 0,
            f"--request-timeout must be >= 0 seconds (0 = no limit), got {self.request_timeout_s}",
        )
        need(
            self.kv_events_endpoint is None or self.kv_events_endpoint.strip() != "",
            "--kv-events-endpoint must not be empty",
        )
        need(
            1 <= self.kv_events_block_size <= 4096,
            f"--kv-events-block-size must be in 1..4096, got {self.kv_events_block_size}",
        )
        self.kv_events_config()  # a malformed endpoint raises ValueError naming --kv-events-endpoint
        known = [n.value for n in Normalization]
        for name in self.normalize:
            need(name in known, f"--normalize: {name!r} is not one of {', '.join(known)}")
        for origin in self.cors_allow_origin:
            need(
                origin == "*" or _ORIGIN.fullmatch(origin) is not None,
                f"--cors-allow-origin: {origin!r} is not an origin; give scheme://host[:port] "
                "(no path, no trailing slash) or *",
            )
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_timeout_s"):
            value = getattr(self, name)
            need(value > 0, f"--{name[:-2].replace('_', '-')}-s must be > 0 seconds, got {value}")
        need(self.max_connections >= 1, f"--max-connections must be >= 1, got {self.max_connections}")
        need(
            (self.ssl_certfile is None) == (self.ssl_keyfile is None),
            "--ssl-certfile and --ssl-keyfile go together: give both (or neither)",
        )

    def kv_events_config(self) -> KVEventsConfig | None:
        """The KV-events publisher's config, or None when --kv-events-endpoint is not set."""
        if self.kv_events_endpoint is None:
            return None
        return KVEventsConfig(
            endpoint=self.kv_events_endpoint, topic=self.kv_events_topic, block_size=self.kv_events_block_size
        )

    @property
    def is_tls(self) -> bool:
        return self.ssl_certfile is not None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.is_tls else "http"
        return f"{scheme}://{host}:{self.port}"


# ---------------------------------------------------------------- option registry


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
