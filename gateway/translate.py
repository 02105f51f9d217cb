"""Chat and text completion requests -> `GenerationRequest` and how to answer them (`Planned`).

Every check that needs the server's limits or spans fields lives here and raises `APIError`
(400, with `param` naming the field in the request's own terms), so the routes stay thin.
`chat_plan` takes a `ChatInput` (chat_input.py), which all three front doors build: OpenAI's
chat completions through `chat_input` here, Anthropic's and the Responses API's in their own
modules. The response half (scheduler events -> OpenAI bodies and SSE chunks) is openai_reply.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..scheduler.request import GenerationRequest, Grammar, SamplingParams
from . import protocol as p
from .chat_input import OPENAI_PARAMS, ChatInput, template_arguments, template_message
from .config import ServeConfig
from .errors import bad_request
from .json_types import JSON, TemplateMessage, TemplateTool
from .openai_reply import OutputSpec
from .prompt_parts import PromptSource
from .reasoning import THINK_OPEN, ReasoningFormat, prompt_opens_thinking
from .runtime import PromptError, Runtime
from .structured import GrammarCompiler, GrammarError
from .tool_calls import ToolCallFamily
from .tool_stream import HERMES_OPEN
from .turns import turn_offsets

SEED_MOD = 2**63
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


# ------------------------------------------------------------------ requests

# OpenAI fields this server accepts but does not honour -> the values that ask for nothing.
# Anything else is a 400 naming the field (nothing is silently dropped).
UNHONOURED: dict[str, tuple[JSON, ...]] = {
    "functions": (None, []),
    "function_call": (None, "none"),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "web_search_options": (None,),
    "reasoning_effort": (None,),
    "service_tier": (None, "auto", "default"),
    "store": (None, False),
}


@dataclass(frozen=True)
class Planned:
    """A translated request: what to submit (n times, with per-choice seeds) and how to answer."""

    gen: GenerationRequest
    spec: OutputSpec = field(default_factory=OutputSpec)


def check_unhonoured(req: p.SamplingFields) -> None:
    for name, inert in UNHONOURED.items():
        value = getattr(req, name, None)
        if not any(value == v for v in inert):
            raise bad_request(
                f"{name} is not supported by this server; remove it from the request", param=name
            )


def _logit_bias(req: p.SamplingFields, runtime: Runtime) -> tuple[tuple[int, float], ...]:
    if not req.logit_bias:
        return ()
    out = []
    for key, bias in req.logit_bias.items():
        try:
            tid = int(key)
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids; got {key!r}", param="logit_bias") from None
        if not 0 <= tid < runtime.n_vocab:
            raise bad_request(
                f"logit_bias token id {tid} is outside the vocabulary 0..{runtime.n_vocab - 1}",
                param="logit_bias",
            )
        if not -100 <= bias <= 100:
            raise bad_request(f"logit_bias values must be in [-100, 100]; got {bias}", param="logit_bias")
        out.append((tid, float(bias)))
    return tuple(out)


def _grammars(runtime: Runtime, param: str) -> GrammarCompiler:
    if runtime.grammars is None:
        raise bad_request("constrained decoding is not available on this server", param=param)
    return runtime.grammars


def _response_format_grammar(
    req: ChatInput | p.CompletionRequest, runtime: Runtime, param: str = "response_format"
) -> Grammar | None:
    """The Grammar for response_format (None for text); `param`: the request's name for it."""
    rf = req.response_format
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        schema = None
    elif rf.type == "json_schema":
        if rf.json_schema is None:
            raise bad_request("response_format json_schema needs a `json_schema` object", param=param)
        schema = rf.json_schema.schema if rf.json_schema.schema is not None else {"type": "object"}
    else:
        raise bad_request(
            f"response_format type {rf.type!r} is not supported; use text, json_object or json_schema",
            param=param,
        )
    try:
        return _grammars(runtime, param).json_schema(schema)
    except GrammarError as exc:
        raise bad_request(f"response_format schema cannot be enforced: {exc}", param=param) from None


def sampling_params(
    req: ChatInput | p.CompletionRequest,
    config: ServeConfig,
    runtime: Runtime,
    *,
    max_tokens: int | None,
    default_max_tokens: int | None,
    max_tokens_param: str = "max_tokens",
    stop_param: str = "stop",
    logprobs: int | None = None,
    grammar: Grammar | None = None,
) -> SamplingParams:
    """Map the sampling fields, enforcing --max-tokens-limit, the slot count for n and the
    unsupported options (`max_tokens_param`, `stop_param`: the body fields `max_tokens` and
    `stop` came from, named by their errors). No max_tokens and no `default_max_tokens`: up to --max-tokens-limit, so generation runs
    to the end of the turn or of the slot's context (the scheduler ends it with `length` there)."""
    check_unhonoured(req)
    if req.n > runtime.num_slots:
        raise bad_request(
            f"n={req.n} exceeds this server's {runtime.num_slots} slots (each choice decodes in a slot)",
            param="n",
        )
    if max_tokens is not None:
        wanted = max_tokens
    else:
        wanted = config.max_tokens_limit if default_max_tokens is None else default_max_tokens
    if wanted > config.max_tokens_limit:
        raise bad_request(
            f"{max_tokens_param}={wanted} exceeds this server's limit of {config.max_tokens_limit}",
            param=max_tokens_param,
        )
    if req.stop is None:
        stop: tuple[str, ...] = ()
    elif isinstance(req.stop, str):
        stop = (req.stop,)
    else:
        stop = tuple(req.stop)
    if any(s == "" for s in stop):
        raise bad_request("stop strings must not be empty", param=stop_param)
    stop_ids = tuple(req.stop_token_ids or ())
    if any(t >= runtime.n_vocab for t in stop_ids):
        raise bad_request(
            f"stop_token_ids must be below the vocabulary size {runtime.n_vocab}", param="stop_token_ids"
        )
    if grammar is not None and req.ignore_eos:
        raise bad_request("ignore_eos cannot be combined with constrained output", param="ignore_eos")
    top_k = req.top_k if req.top_k is not None and req.top_k > 0 else 0
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_k=top_k,
        top_p=1.0 if req.top_p is None else req.top_p,
        min_p=0.0 if req.min_p is None else req.min_p,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        seed=None if req.seed is None else req.seed % SEED_MOD,
        max_tokens=wanted,
        stop=stop,
        stop_token_ids=stop_ids,
        ignore_eos=req.ignore_eos,
        logit_bias=_logit_bias(req, runtime),
        logprobs=logprobs,
        grammar=grammar,
    )


def choice_requests(planned: Planned) -> list[GenerationRequest]:
    """The n scheduler requests of a planned request: the same prompt, seeds seed, seed+1, ...
    (None stays None: each choice draws from fresh entropy). The scheduler prefills the shared
    prompt once and copies its rows into the other choices' slots (policy WAIT_SHARED -> COPY)."""
    gen = planned.gen
    if planned.spec.n == 1:
        return [gen]
    out = []
    for i in range(planned.spec.n):
        seed = gen.params.seed
        params = replace(gen.params, seed=None if seed is None else (seed + i) % SEED_MOD)
        out.append(replace(gen, params=params, request_id=f"{gen.request_id}-{i}" if gen.request_id else ""))
    return out


def _token_bytes_fn(runtime: Runtime) -> Callable[[int], bytes]:
    table = runtime.token_bytes
    if table is not None:
        return lambda t: table[t]
    return lambda t: runtime.decode([t]).encode()


def _message_dict(i: int, m: p.ChatMessage) -> TemplateMessage:
    """One OpenAI message as the chat template expects it: role, content text, and tool fields."""
    if m.role not in CHAT_ROLES:
        raise bad_request(
            f"role must be one of {', '.join(sorted(CHAT_ROLES))}; got {m.role!r}",
            param=f"messages[{i}].role",
        )
    if isinstance(m.content, list):
        texts = []
        for j, part in enumerate(m.content):
            if part.type != "text":
                raise bad_request(
                    f"only text content parts are supported; got type {part.type!r}",
                    param=f"messages[{i}].content[{j}]",
                )
            if part.text is None:
                raise bad_request(
                    "a content part of type 'text' needs a string field `text`",
                    param=f"messages[{i}].content[{j}].text",
                )
            texts.append(part.text)
        content = "".join(texts)
    else:
        content = m.content or ""
    calls: list[dict[str, JSON]] = [
        {
            "function": {"name": c.function.name, "arguments": template_arguments(c.function.arguments)},
            "id": c.id,
            "type": c.type,
        }
        for c in m.tool_calls or ()
    ]
    role = "system" if m.role == "developer" else m.role
    return template_message(
        role,
        content,
        name=m.name,
        tool_calls=calls,
        tool_call_id=m.tool_call_id,
        reasoning_content=m.reasoning_content if role == "assistant" else None,
    )


def chat_messages(req: p.ChatCompletionRequest | p.TokenizeRequest | ChatInput) -> list[TemplateMessage]:
    """The messages of a chat request as the template reads them (400 naming a bad one)."""
    if isinstance(req, ChatInput):
        return req.messages
    return [_message_dict(i, m) for i, m in enumerate(req.messages or [])]


def chat_input(req: p.ChatCompletionRequest) -> ChatInput:
    """An OpenAI chat completion request as `chat_plan` takes it."""
    sampling = {name: getattr(req, name) for name in p.SamplingFields.__struct_fields__}
    return ChatInput(
        **sampling,
        messages=chat_messages(req),
        tools=req.tools,
        tool_choice=req.tool_choice,
        parallel_tool_calls=req.parallel_tool_calls,
        max_completion_tokens=req.max_completion_tokens,
        logprobs=req.logprobs,
        top_logprobs=req.top_logprobs,
        params=OPENAI_PARAMS,
    )


def _tool_plan(req: ChatInput, runtime: Runtime) -> tuple[Grammar | None, OutputSpec]:
    """(grammar or None, tool parsing) for `tools` / `tool_choice` / `parallel_tool_calls`."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs `tools`", param="tool_choice")
        return None, OutputSpec()
    tools = req.template_tools() or []
    for i, t in enumerate(req.tools):
        if t.type != "function":
            raise bad_request(
                f"tool type {t.type!r} is not supported; only 'function'", param=f"tools[{i}].type"
            )
    names = frozenset(t.function.name for t in req.tools)
    parallel = req.parallel_tool_calls is not False
    family = runtime.tool_family or ToolCallFamily.HERMES
    spec = OutputSpec(tool_family=family, tool_names=names, max_calls=None if parallel else 1)
    if choice == "none":
        return None, OutputSpec()
    if choice is None or choice == "auto":
        strict = [t for t in tools if t["function"].get("strict")]
        if not strict:
            return _lazy_tool_grammar(runtime, family, tools, parallel), spec
        forced, allow_text = tools, True
    elif choice == "required":
        forced, allow_text = tools, False
    elif (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), dict)
    ):
        name = choice["function"].get("name")
        forced = [t for t in tools if t["function"]["name"] == name]
        if not forced:
            raise bad_request(f"tool_choice names {name!r}, which is not among `tools`", param="tool_choice")
        allow_text = False
    else:
        raise bad_request(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    try:
        grammar = _grammars(runtime, "tool_choice").tool_calls(
            family, forced, parallel=parallel, allow_text=allow_text
        )
    except GrammarError as exc:
        raise bad_request(f"the tool parameters cannot be enforced: {exc}", param="tools") from None
    return grammar, spec


def _lazy_tool_grammar(
    runtime: Runtime, family: ToolCallFamily, tools: list[TemplateTool], parallel: bool
) -> Grammar | None:
    """The lazy call grammar for tool_choice "auto", or None: no llguidance here, a schema it
    cannot compile, or a family whose call marker is a special token (Llama 3's <|python_tag|>,
    Mistral's [TOOL_CALLS], a <tool_call> marked special), which the grammar's free text could not
    let through, or a thinking model's template (a `{"name": "` written while thinking would
    start a call there). The reply is then parsed unconstrained, as before."""
    grammars = runtime.grammars
    if grammars is None or family is not ToolCallFamily.HERMES or grammars.is_special(HERMES_OPEN):
        return None
    if THINK_OPEN in (getattr(runtime.chat, "source", None) or ""):
        return None
    try:
        return grammars.lazy_tool_calls(tools, parallel=parallel, tag=True)
    except GrammarError:
        return None


def chat_plan(req: ChatInput, config: ServeConfig, runtime: Runtime, request_id: str) -> Planned:
    """A chat request of any front door planned: prompt ids, sampling, grammar, answer spec."""
    names = req.params
    if not req.messages:  # an agent request whose messages all turned out empty
        raise bad_request("Invalid request: no message with any content", param=names.messages)
    messages = req.messages
    tools = req.template_tools()
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
    tool_grammar, spec = _tool_plan(req, runtime)
    json_grammar = _response_format_grammar(req, runtime, names.response_format)
    if json_grammar is not None and getattr(tool_grammar, "lazy", False):
        tool_grammar = None  # tool_choice "auto" asks nothing of the reply: response_format wins
    if tool_grammar is not None and json_grammar is not None:
        raise bad_request(
            "response_format cannot be combined with a forced or strict tool call",
            param=names.response_format,
        )
    try:
        ids, hint = runtime.encode_chat(messages, tools)
    except PromptError as exc:
        raise bad_request(str(exc), param=names.messages) from None
    max_tokens: int | None
    if req.max_completion_tokens is not None:
        max_tokens, max_tokens_param = req.max_completion_tokens, "max_completion_tokens"
    else:
        max_tokens, max_tokens_param = req.max_tokens, names.max_tokens
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = sampling_params(
        req,
        config,
        runtime,
        max_tokens=max_tokens,
        default_max_tokens=config.default_max_tokens,
        max_tokens_param=max_tokens_param,
        stop_param=names.stop,
        logprobs=logprobs,
        grammar=tool_grammar or json_grammar,
    )
    spec = replace(
        spec,
        n=req.n,
        logprobs=logprobs,
        token_bytes=_token_bytes_fn(runtime),
        **_reasoning_fields(config, runtime, ids),
        parts=PromptSource(runtime, messages, tools, ids),
    )
    turns = turn_offsets(runtime, messages, tools, ids)
    gen = GenerationRequest(
        prompt_ids=ids,
        params=params,
        request_id=request_id,
        prefix_hint=hint,
        turn_offsets=turns,
        speculative=req.speculative,
    )
    return Planned(gen, spec)


def chat_completion_plan(
    req: p.ChatCompletionRequest, config: ServeConfig, runtime: Runtime, request_id: str
) -> Planned:
    """`chat_plan` of an OpenAI chat completion request."""
    return chat_plan(chat_input(req), config, runtime, request_id)


def _reasoning_fields(config: ServeConfig, runtime: Runtime, ids: list[int]) -> dict[str, JSON]:
    """OutputSpec's reasoning fields: the format (None: --reasoning-format none), whether the
    prompt opened a <think> block, and the token count of a text (reasoning_tokens)."""
    if config.reasoning_format is ReasoningFormat.NONE:
        return {}
    return {
        "reasoning": config.reasoning_format,
        "think_opened": prompt_opens_thinking(runtime.decode(ids[-8:])),
        "count_tokens": lambda text: len(runtime.encode_text(text)),
    }


def chat_request(
    req: p.ChatCompletionRequest, config: ServeConfig, runtime: Runtime, request_id: str
) -> GenerationRequest:
    return chat_completion_plan(req, config, runtime, request_id).gen


def completion_prompt_ids(req: p.CompletionRequest, runtime: Runtime) -> list[int]:
    """The prompt as ids: a string, a list of ids, or a one-element list of either."""
    prompt: str | list[str | int | list[int]] | list[int] = req.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # OpenAI's batch form with a single prompt
    if isinstance(prompt, str):
        ids = runtime.encode_prompt(prompt)
    elif all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = [t for t in prompt if isinstance(t, int)]  # every item (the check above)
        if any(t < 0 or t >= runtime.n_vocab for t in ids):
            raise bad_request(f"prompt token ids must be in 0..{runtime.n_vocab - 1}", param="prompt")
    else:
        raise bad_request(
            "prompt must be one string or one list of token ids; batched prompts are not supported",
            param="prompt",
        )
    if not ids:
        raise bad_request("prompt must not be empty", param="prompt")
    return ids


def completion_plan(
    req: p.CompletionRequest, config: ServeConfig, runtime: Runtime, request_id: str
) -> Planned:
    if req.echo:
        raise bad_request("echo is not supported", param="echo")
    if req.suffix:
        raise bad_request("suffix is not supported", param="suffix")
    if req.best_of not in (None, req.n):
        raise bad_request("best_of is not supported (only best_of == n)", param="best_of")
    ids = completion_prompt_ids(req, runtime)
    params = sampling_params(
        req,
        config,
        runtime,
        max_tokens=req.max_tokens,
        default_max_tokens=min(COMPLETIONS_DEFAULT_MAX_TOKENS, config.max_tokens_limit),
        logprobs=req.logprobs,
        grammar=_response_format_grammar(req, runtime),
    )
    spec = OutputSpec(n=req.n, logprobs=req.logprobs, token_bytes=_token_bytes_fn(runtime))
    gen = GenerationRequest(prompt_ids=ids, params=params, request_id=request_id, speculative=req.speculative)
    return Planned(gen, spec)


def completion_request(
    req: p.CompletionRequest, config: ServeConfig, runtime: Runtime, request_id: str
) -> GenerationRequest:
    return completion_plan(req, config, runtime, request_id).gen
