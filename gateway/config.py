"""Server configuration: one frozen `ServeConfig`, filled from the command line and `SLOTSERVE_*`
by options.py's option table.

`ServeConfig.__post_init__` checks ranges, so a config that exists is a valid one.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from ..scheduler.prefill_order import PrefillOrder
from .client_quirks import Normalization
from .kv_events import KVEventsConfig
from .reasoning import ReasoningFormat

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
