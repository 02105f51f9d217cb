"""The served model as the HTTP layer sees it: scheduler, tokenizer, chat template, names.

Design: `Runtime` is plain data plus the three text operations the routes need (encode a chat,
encode text, decode ids), so tests build one from a fake tokenizer and `FakeSlotPool` and the
routes never touch engine objects. `load_runtime(config)` is the production wiring: resolve the
model file (pulling the default model on first use), open it with `engine_ext.loader`, build
the `Scheduler`. Constructing a Runtime has no side effects; the app's lifespan starts and stops
the scheduler (`async with runtime.scheduler`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..scheduler.api import SchedulerAPI
from ..scheduler.config import SchedulerConfig
from ..scheduler.interface import SlotPool
from ..scheduler.stats import StatsSink
from .checkpoint_budget import CheckpointBudget, checkpoint_budget
from .config import ServeConfig
from .json_types import TemplateMessage, TemplateTool
from .tool_calls import ToolCallFamily, family_for_template, hermes_shim

if TYPE_CHECKING:  # engine_ext and llguidance load only when a model is opened
    from ..engine_ext.chat import ChatTemplate
    from ..engine_ext.loader import ModelBundle
    from ..engine_ext.tokenizer import Tokenizer
    from .structured import GrammarCompiler

log = logging.getLogger("slotserve.gateway")


class TokenizerLike(Protocol):
    """What the routes need of `engine_ext.tokenizer.Tokenizer`."""

    @property
    def n_vocab(self) -> int: ...

    @property
    def add_bos_token(self) -> bool:
        """The model wants BOS in front of a raw (untemplated) prompt."""

    @property
    def eos_token_ids(self) -> Collection[int]:
        """Every id that ends generation (eos, end of turn, ...)."""

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ChatTemplateLike(Protocol):
    """What the routes need of `engine_ext.chat.ChatTemplate`."""

    def render(
        self,
        messages: list[TemplateMessage],
        *,
        add_generation_prompt: bool = True,
        tools: list[TemplateTool] | None = None,
    ) -> str: ...

    def system_prefix(
        self, messages: list[TemplateMessage], *, tools: list[TemplateTool] | None = None
    ) -> str | None: ...


class PromptError(ValueError):
    """The messages or prompt cannot be turned into tokens (template refused them, ...)."""


@dataclass
class Runtime:
    scheduler: SchedulerAPI  # scheduler.Scheduler, or a test double with the same contract
    tokenizer: TokenizerLike
    chat: ChatTemplateLike | None  # None: the model has no chat template (chat requests -> 400)
    model_names: tuple[str, ...]  # names clients may send; the first is reported in responses
    ctx_len: int  # tokens per slot
    num_slots: int
    kv_bytes: int = 0
    kv_type: str = "f16"  # KV element type (--kv-type)
    kernel_variant: str = "unknown"
    kv_window: int | None = None  # sliding window kept as a ring (None: full KV on every layer)
    # a slot cannot be cut back to an earlier turn (ring, recurrent state): chat requests carry
    # their turns' token offsets for the scheduler's checkpoint rule turn (turns.py)
    turn_captures: bool = False
    model_path: str = ""
    created: int = 0  # unix time the model was loaded (GET /v1/models)
    extra: dict[str, object] = field(default_factory=dict)  # owned objects kept alive (model file, pool)
    closers: list[Callable[[], None]] = field(default_factory=list)  # run after the scheduler stops
    grammars: GrammarCompiler | None = None  # None: response_format / forced tools -> 400
    token_bytes: Sequence[bytes] | None = None  # id -> bytes, for logprobs (None: decode each id)
    # How tools are spelled: the family of the chat template's tool-call syntax, and whether the
    # template renders `tools` itself (else the gateway rewrites messages with `hermes_shim`).
    tool_family: ToolCallFamily | None = None  # None: from `chat.source` (hermes without one)
    renders_tools: bool | None = None
    checkpoint_budget: CheckpointBudget | None = None  # None: a test double's scheduler; not printed

    def __post_init__(self) -> None:
        family, renders = family_for_template(getattr(self.chat, "source", None))
        if self.tool_family is None:
            self.tool_family = family
        if self.renders_tools is None:
            self.renders_tools = renders

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    @property
    def n_vocab(self) -> int:
        return int(self.tokenizer.n_vocab)

    def encode_text(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Token ids of `text`; special-token spellings in it are parsed as special tokens."""
        return list(self.tokenizer.encode(text, add_bos=add_bos))

    def encode_prompt(self, text: str) -> list[int]:
        """A raw completion prompt: BOS in front when the model asks for it (`add_bos_token`)."""
        return self.encode_text(text, add_bos=self.tokenizer.add_bos_token)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def tool_messages(
        self, messages: list[TemplateMessage], tools: list[TemplateTool] | None
    ) -> tuple[list[TemplateMessage], list[TemplateTool] | None]:
        """(messages, tools) as the template gets them: unchanged when it renders tools itself,
        else rewritten by `hermes_shim` when the conversation has tools, calls or tool results."""
        if self.renders_tools:
            return messages, tools
        uses_tools = bool(tools) or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)
        return (hermes_shim(messages, tools), None) if uses_tools else (messages, tools)

    def render_chat(self, messages: list[TemplateMessage], tools: list[TemplateTool] | None = None) -> str:
        """The prompt text `encode_chat` tokenizes (with the generation prompt)."""
        if self.chat is None:
            raise PromptError("this model has no chat template; use /v1/completions")
        messages, tools = self.tool_messages(messages, tools)
        return self.chat.render(messages, add_generation_prompt=True, tools=tools)

    def encode_chat(
        self,
        messages: list[TemplateMessage],
        tools: list[TemplateTool] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> tuple[list[int], int | None]:
        """Render `messages` with the model's template and tokenize; returns (ids, prefix_hint).

        prefix_hint is the token offset where the system turn ends, given only when the system
        turn's tokens are exactly a proper prefix of the prompt's (so a checkpoint there is
        reusable by the next request with the same system turn). Raises PromptError.
        """
        if self.chat is None:
            raise PromptError("this model has no chat template; use /v1/completions")
        messages, tools = self.tool_messages(messages, tools)
        try:
            text = self.chat.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
            prefix = self.chat.system_prefix(messages, tools=tools)
        except ValueError as exc:  # engine_ext.chat.ChatTemplateError: the template refused or failed
            raise PromptError(f"the chat template rejected these messages: {exc}") from None
        ids = self.encode_text(text)
        hint = None
        if prefix:
            prefix_ids = self.encode_text(prefix)
            n = len(prefix_ids)
            if 0 < n < len(ids) and ids[:n] == prefix_ids:
                hint = n
        return ids, hint


@dataclass
class OpenedModel:
    """A model opened for serving, before its scheduler exists (`open_served_model`)."""

    path: Path
    bundle: ModelBundle  # model file, tokenizer, chat template, pool
    pool: SlotPool  # bundle.pool, wrapped to publish KV events when --kv-events-endpoint is set
    model_names: tuple[str, ...]  # the first is reported (and labels the router gauges)
    closers: list[Callable[[], None]]  # run after the scheduler stops


def open_served_model(config: ServeConfig) -> OpenedModel:
    """Resolve and open the model (heavy: loads weights, allocates KV); starts the KV-events
    publisher when configured (closed by the returned `closers`)."""
    from ..engine_ext.loader import open_model
    from ..engine_ext.model_cache import resolve_model, short_name

    path = Path(resolve_model(config.model))
    bundle = open_model(
        path,
        num_slots=config.batched_session,
        ctx_len=config.ctx_size,
        threads=config.threads,
        allow_ctx_over_train=config.allow_ctx_over_train,
        swa_full=config.swa_full,
        kv_dtype=config.kv_type,
        max_batch_tokens=config.max_batch_tokens,
        rollback=spec_rollback(config),
    )
    pool, closers = with_kv_events(bundle.pool, config)
    names = config.served_model_name or default_model_names(short_name(config.model), path)
    return OpenedModel(path=path, bundle=bundle, pool=pool, model_names=tuple(names), closers=closers)


def spec_rollback(config: ServeConfig) -> int:
    """The rollback ring a recurrent model's pool keeps for speculative decoding: --draft-max + 1
    states per slot (a step's draft cut back, or a whole step a decode chain ran past its
    request's end; scheduler.py), at most the engine's 64 (drafts of up to 63 tokens there),
    none with --speculative off."""
    from ..engine_ext.pool import MAX_ROLLBACK

    return min(config.draft_max + 1, MAX_ROLLBACK) if config.speculative == "ngram" else 0


def build_runtime(config: ServeConfig, model: OpenedModel, *, stats_sink: StatsSink | None = None) -> Runtime:
    """The scheduler over `model.pool` (reporting to `stats_sink`) and the Runtime around it.

    Split from `open_served_model` so the caller can build its metrics knowing the model name."""
    import time

    from ..scheduler.scheduler import Scheduler
    from .structured import GrammarCompiler

    tok = model.bundle.tokenizer
    grammars: GrammarCompiler | None
    try:
        grammars = GrammarCompiler.for_tokenizer(tok)
        closers = [*model.closers, grammars.close]
    except Exception:  # noqa: BLE001 - serve without constraints rather than not at all
        log.exception("constrained decoding is unavailable for this tokenizer")
        grammars, closers = None, model.closers
    budget = checkpoint_budget(config.checkpoint_memory_mb)
    sched = Scheduler(
        model.pool,
        scheduler_config(config, budget),
        token_bytes=tok.token_bytes,
        eos_token_ids=tok.eos_token_ids,
        stats_sink=stats_sink,
    )
    chat = model.bundle.chat
    if config.chat_template is not None:
        chat = load_chat_template(config.chat_template, tok)
    elif chat is not None and chat.origin != "gguf":
        log.info("chat template: %s; --chat-template FILE replaces it", chat.origin)
    return Runtime(
        scheduler=sched,
        tokenizer=tok,
        chat=chat,
        model_names=model.model_names,
        ctx_len=config.ctx_size,
        num_slots=config.batched_session,
        kv_bytes=int(model.bundle.pool.kv_bytes),
        kv_type=str(model.bundle.pool.kv_dtype),
        kernel_variant=str(model.bundle.pool.kernel_variant),
        kv_window=model.bundle.pool.kv_window,
        turn_captures=model.bundle.pool.restored_min_truncate_len(config.ctx_size) > 0,
        model_path=str(model.path),
        created=int(time.time()),
        extra={"bundle": model.bundle},
        closers=closers,
        grammars=grammars,
        token_bytes=tok.token_bytes,
        checkpoint_budget=budget,
    )


def load_chat_template(path: str, tok: Tokenizer) -> ChatTemplate:
    """The jinja template in file `path` (--chat-template), with the tokenizer's bos/eos texts.
    ValueError naming the flag if the file cannot be read or does not compile."""
    from ..engine_ext.chat import ChatTemplate

    try:
        source = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--chat-template {path}: cannot read the file: {exc}") from None

    def piece(i: int | None) -> str:
        return tok.token_bytes[i].decode("utf-8", errors="replace") if i is not None else ""

    try:
        return ChatTemplate(
            source, bos_token=piece(tok.bos_id), eos_token=piece(tok.eos_id), origin=f"--chat-template {path}"
        )
    except ValueError as exc:
        raise ValueError(f"--chat-template {path}: {exc}") from None


def load_runtime(config: ServeConfig, *, stats_sink: StatsSink | None = None) -> Runtime:
    """`open_served_model` then `build_runtime`: the model opened and its scheduler built."""
    return build_runtime(config, open_served_model(config), stats_sink=stats_sink)


def with_kv_events(pool: SlotPool, config: ServeConfig) -> tuple[SlotPool, list[Callable[[], None]]]:
    """`pool` wrapped to publish KV events when --kv-events-endpoint is set (else unchanged),
    and what to close at shutdown. Raises ValueError for a bad endpoint or missing pyzmq."""
    events_config = config.kv_events_config()
    if events_config is None:
        return pool, []
    from .kv_events import wrap_pool

    wrapped, publisher = wrap_pool(pool, events_config)
    return wrapped, [publisher.close]


def scheduler_config(config: ServeConfig, budget: CheckpointBudget | None = None) -> SchedulerConfig:
    """The SchedulerConfig for `config`: only the knobs the operator set override its defaults,
    except the checkpoint budget: `budget`, else `checkpoint_budget(--checkpoint-memory-mb)`
    (that flag, or a share of the machine's available memory: checkpoint_budget.py)."""
    kwargs: dict[str, Any] = {
        "max_queue": config.max_queue,
        "reuse_enabled": not config.no_reuse,
        "decode_chain": not config.no_decode_chain,
        "prefill_order": config.prefill_order,
        "prefill_aging_tokens_per_s": config.prefill_aging_tokens_per_s,
        "draft_max": config.draft_max if config.speculative == "ngram" else None,
    }
    if config.segment_tokens is not None:
        kwargs["segment_tokens"] = config.segment_tokens
        kwargs["step_token_budget"] = max(SchedulerConfig().step_token_budget, config.segment_tokens)
    budget = budget if budget is not None else checkpoint_budget(config.checkpoint_memory_mb)
    kwargs["checkpoint_memory_mb"] = float(budget.memory_mb)
    if config.checkpoint_interval_tokens is not None:
        kwargs["checkpoint_interval_tokens"] = config.checkpoint_interval_tokens
    if config.kv_disk_dir is not None:
        kwargs["kv_disk_dir"] = config.kv_disk_dir
    if config.kv_disk_space_mb is not None:
        kwargs["kv_disk_space_mb"] = float(config.kv_disk_space_mb)
    if config.request_timeout_s > 0:
        kwargs["default_timeout_s"] = config.request_timeout_s
    return SchedulerConfig(**kwargs)


def default_model_names(short: str | None, path: Path) -> tuple[str, ...]:
    """The names served when --served-model-name is not given: the known model's short name
    when `--model` was one (or absent: the default model), then the file name without `.gguf`
    (also accepted); for a path, that file name alone. (Not the GGUF's `general.name`: that is
    free text such as "Smollm2 135M 8k Lc100K Mix1 Ep2", no name a client would guess.)"""
    stem = path.name.removesuffix(".gguf")
    if short and short != stem:
        return (short, stem)
    return (stem,)
