"""Seeded synthetic workloads: conversations that build each request from the replies so far.

Design: a workload is a list of `Conversation`s. The driver asks a ready conversation for its
next `RequestSpec`, sends it, and hands the outcome back through `record_reply`; the
conversation then builds its next request from it (a chat client appends the reply and a new
user message; an agent re-renders the reply as a tool call and appends the tool's result; an
impatient client resends what it aborted; an editing client goes back and rewrites its first
question). All text is drawn up front from one
`random.Random` per conversation, seeded from (seed, workload, conversation index), so a run is
reproducible whatever order the driver serves the conversations in; only the model's replies
(greedy by default) enter the prompts at run time.

Lengths are in words of a fixed list of common English words; most BPE vocabularies spend about
one token per word (SmolLM2's tokenizer: 1.0 to 1.3).
"""

from __future__ import annotations

import enum
import json
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from .names import SYNTHETIC_WORKLOADS

Message = dict[str, Any]  # OpenAI chat message: {"role": ..., "content": ..., ...}

# ~1 token each in SmolLM2's vocabulary (with the leading space).
_WORD_TEXT = (
    "the of and to in is was for on that with as by at from his an were are which this be "
    "has had one their not but have they first new who been after its two other all also "
    "some time into most only more over may used city many school such three between year "
    "world during state when made part through well known both later under then would "
    "where years while about there these since being team can house film system each early "
    "before four national work several people group most found music called high line water "
    "number war best album life could university area around south north against small "
    "second including public river former game book large family season did major what "
    "name within league local history west place five served same until series east long "
    "use because population member back club army based village county power station "
    "received took river church following main period show last like began site band held "
    "known government named left general original way make them next town island center "
    "built final form land play role field love side will order light paper road song"
).split()
_WORDS = tuple(dict.fromkeys(_WORD_TEXT))  # drop repeats: uniform draws

_TOOLS = ("search", "read_file", "run_tests", "list_dir", "fetch_url", "grep")


class Outcome(str, enum.Enum):
    OK = "ok"  # the reply streamed to its end
    ABORTED = "aborted"  # the client disconnected on purpose after k tokens
    ERROR = "error"  # HTTP error, broken stream or malformed response
    TIMEOUT = "timeout"  # the per-request timeout elapsed


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request as the client will send it (chat `messages` xor a text `prompt`)."""

    conversation_id: str
    turn_index: int  # 0-based turn within the conversation (an agent round counts as a turn)
    max_tokens: int
    messages: tuple[Message, ...] | None = None  # sent to /v1/chat/completions
    prompt: str | None = None  # sent to /v1/completions
    attempt: int = 0  # 0 = first send; 1 = the resend after an abort
    abort_after_tokens: int | None = None  # disconnect after this many streamed tokens
    offset_s: float | None = None  # trace replay: send time relative to the run's start
    headers: tuple[tuple[str, str], ...] = ()  # extra HTTP headers (a client's session id)
    extra_body: tuple[tuple[str, str], ...] = ()  # extra top-level string fields (prompt_cache_key)
    api: str = "chat"  # "chat": /v1/chat/completions; "messages": /v1/messages; "responses": /v1/responses

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("a request has either `messages` or `prompt`, not both or neither")


class Conversation(Protocol):
    """A client session. Contract: `next_request()` returns None once the session is over;
    the driver never calls it again before `record_reply` for the request it returned."""

    conversation_id: str

    def next_request(self) -> RequestSpec | None: ...

    def record_reply(self, spec: RequestSpec, outcome: Outcome, text: str) -> None: ...


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """Sizes of a synthetic workload. Validated at construction."""

    seed: int = 0
    num_conversations: int = 4
    num_turns: int = 4  # user turns per conversation (agent: tool rounds)
    system_len: int = 400  # words in the system prompt
    turn_len: int = 40  # words in each user message
    reply_len: int = 32  # max_tokens of every reply
    tool_result_len: int = 80  # words in each tool result (agent)
    abort_after: int = 4  # streamed tokens before the client disconnects (abort-resend)

    def __post_init__(self) -> None:
        for name in (
            "num_conversations",
            "num_turns",
            "system_len",
            "turn_len",
            "reply_len",
            "tool_result_len",
            "abort_after",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (got {getattr(self, name)})")


def num_planned_requests(workload: str, cfg: WorkloadConfig) -> int:
    """Requests the workload sends if every one succeeds (abort-resend sends each turn twice;
    edit-turn adds the edited first turn)."""
    per_turn = 2 if workload == "abort-resend" else 1
    extra = 1 if workload == "edit-turn" else 0
    return cfg.num_conversations * (cfg.num_turns * per_turn + extra)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _system_prompt(rng: random.Random, n: int, header: str) -> str:
    return f"{header}\n{_words(rng, n)}"


@dataclass
class ChatConversation:
    """Multi-turn chat: system prompt, then user turns; each reply is appended verbatim.

    With `abort_after`, the first send of every turn disconnects after that many tokens and the
    identical request is sent again (attempt 1). With `edited_first`, after the last turn the
    client goes back to the start: the system prompt and an edited first question (turn index
    len(user_turns)), a prompt that leaves the conversation right after its system turn."""

    conversation_id: str
    system: str
    user_turns: list[str]
    reply_len: int
    abort_after: int | None = None
    edited_first: str | None = None
    extra_body: tuple[tuple[str, str], ...] = ()  # sent with every request (codex: prompt_cache_key)
    api: str = "chat"  # the API its requests speak (codex: "responses")
    _history: list[Message] = field(default_factory=list)  # system + completed turns
    _turn: int = 0
    _attempt: int = 0
    _is_over: bool = False

    def __post_init__(self) -> None:
        self._history = [{"role": "system", "content": self.system}]

    def next_request(self) -> RequestSpec | None:
        if self._is_over or self._turn > len(self.user_turns):
            return None
        if self._turn == len(self.user_turns):
            if self.edited_first is None:
                return None
            edit = [self._history[0], {"role": "user", "content": self.edited_first}]
            return RequestSpec(
                conversation_id=self.conversation_id,
                turn_index=self._turn,
                max_tokens=self.reply_len,
                messages=tuple(edit),
            )
        user = {"role": "user", "content": self.user_turns[self._turn]}
        is_abort = self.abort_after is not None and self._attempt == 0
        return RequestSpec(
            conversation_id=self.conversation_id,
            turn_index=self._turn,
            max_tokens=self.reply_len,
            messages=tuple(self._history + [user]),
            attempt=self._attempt,
            abort_after_tokens=self.abort_after if is_abort else None,
            extra_body=self.extra_body,
            api=self.api,
        )

    def record_reply(self, spec: RequestSpec, outcome: Outcome, text: str) -> None:
        if outcome is Outcome.ABORTED and spec.abort_after_tokens is not None:
            self._attempt = 1  # resend the same request
            return
        if outcome is not Outcome.OK:
            self._is_over = True  # a failed turn ends the conversation: no reply to build on
            return
        assert spec.messages is not None
        if spec.turn_index < len(self.user_turns):
            self._history = list(spec.messages) + [{"role": "assistant", "content": text}]
        self._turn += 1
        self._attempt = 0


@dataclass
class AgentConversation:
    """Agent loop: a tool-describing system prompt and a task, then tool rounds.

    After each reply the client re-renders it as a tool call (whitespace normalised, a
    `<tool_call>` block appended), as agent frameworks do when they parse a reply and send it
    back in their own format, then appends the tool's result as a `tool` message."""

    conversation_id: str
    system: str
    task: str
    tool_results: list[str]  # one per round after the first
    tool_calls: list[tuple[str, str]]  # (tool name, argument) per round
    reply_len: int
    _history: list[Message] = field(default_factory=list)
    _round: int = 0
    _is_over: bool = False

    def __post_init__(self) -> None:
        self._history = [{"role": "system", "content": self.system}, {"role": "user", "content": self.task}]

    def next_request(self) -> RequestSpec | None:
        if self._is_over or self._round > len(self.tool_results):
            return None
        return RequestSpec(
            conversation_id=self.conversation_id,
            turn_index=self._round,
            max_tokens=self.reply_len,
            messages=tuple(self._history),
        )

    def record_reply(self, spec: RequestSpec, outcome: Outcome, text: str) -> None:
        if outcome is not Outcome.OK:
            self._is_over = True
            return
        if self._round == len(self.tool_results):
            self._round += 1  # the final answer: nothing to append
            return
        name, argument = self.tool_calls[self._round]
        call_id = f"call_{self._round}"
        call = json.dumps({"name": name, "arguments": {"query": argument}})
        rendered = " ".join(text.split()) + f"\n<tool_call>\n{call}\n</tool_call>"
        self._history += [
            {"role": "assistant", "content": rendered},
            {"role": "tool", "tool_call_id": call_id, "content": self.tool_results[self._round]},
        ]
        self._round += 1


BILLING_HEADER = "x-anthropic-billing-header: cc_version=2.0.14; cc_entrypoint=cli; cch={nonce};"


@dataclass
class ClaudeCodeConversation:
    """Claude Code 2.x's request shape, sent to /v1/messages: the per-request billing nonce as
    the first system block, every user turn followed by a trailing `<system-reminder>` text block
    (its mid-conversation system text, which stays in place in later turns), each reply replayed
    verbatim, cache_control on the last block, and the `X-Claude-Code-Session-Id` header. Kept as
    chat messages (blocks joined by newlines, as Messages servers render them; the oracle
    tokenises these); `client.messages_body` splits them back into Claude Code's blocks."""

    conversation_id: str
    system: str
    user_turns: list[str]
    reply_len: int
    session_id: str
    nonce_seed: str
    _replies: list[str] = field(default_factory=list)
    _sends: int = 0
    _is_over: bool = False

    def messages(self, turn: int, nonce: str) -> tuple[Message, ...]:
        out: list[Message] = [
            {"role": "system", "content": BILLING_HEADER.format(nonce=nonce) + "\n" + self.system}
        ]
        for k in range(turn + 1):
            left = 90 - 7 * k
            reminder = f"<system-reminder>Context left until auto-compact: {left}%</system-reminder>"
            out.append({"role": "user", "content": f"{self.user_turns[k]}\n{reminder}"})
            if k < turn:
                out.append({"role": "assistant", "content": self._replies[k]})
        return tuple(out)

    def next_request(self) -> RequestSpec | None:
        turn = len(self._replies)
        if self._is_over or turn >= len(self.user_turns):
            return None
        nonce = random.Random(f"{self.nonce_seed}/{self._sends}").getrandbits(20)
        self._sends += 1
        return RequestSpec(
            conversation_id=self.conversation_id,
            turn_index=turn,
            max_tokens=self.reply_len,
            messages=self.messages(turn, f"{nonce:05x}"),
            headers=(("X-Claude-Code-Session-Id", self.session_id),),
            api="messages",
        )

    def record_reply(self, spec: RequestSpec, outcome: Outcome, text: str) -> None:
        if outcome is not Outcome.OK:
            self._is_over = True
            return
        self._replies.append(text)


def source_file(rng: random.Random, num_lines: int) -> tuple[str, list[str]]:
    """A Python module of about `num_lines` lines (small functions over word-named variables)
    and the function names in it, for the code-edit workload."""
    lines = ['"""Generated module."""', "", "import math", ""]
    names: list[str] = []
    while len(lines) < num_lines:
        name = "_".join(rng.sample(_WORDS, 2))
        a, b, c = rng.sample(_WORDS, 3)
        names.append(name)
        lines += [
            f"def {name}({a}, {b}):",
            f'    """Return the {c} of {a} and {b}."""',
            f"    {c} = {a} * {rng.randint(2, 9)} + {b}",
            f"    if {c} > {rng.randint(10, 99)}:",
            f"        return math.sqrt({c})",
            f"    return {c} - {a}",
            "",
        ]
    return "\n".join(lines) + "\n", names


@dataclass(frozen=True, slots=True)
class Preset:
    """A named case: one synthetic workload at its own default sizes and closed-loop width.
    It sends exactly the requests of `workload` at those sizes; flags given explicitly win."""

    workload: str  # one of SYNTHETIC_WORKLOADS
    sizes: WorkloadConfig  # the default sizes (its seed is unused: --seed sets it)
    concurrency: int  # the closed loop's default C (an open loop still takes --rate)


PRESETS = {
    # Issue 16's returning conversations: 8 chats, each with its own ~1,500-token system
    # prompt, 3 turns, 4 at a time (serve with --batched-session 4 --ctx-size 8192).
    "sessions": Preset(
        workload="multi-turn",
        sizes=WorkloadConfig(num_conversations=8, num_turns=3, system_len=1400, turn_len=40, reply_len=32),
        concurrency=4,
    ),
}


def build_conversations(workload: str, cfg: WorkloadConfig) -> list[Conversation]:
    """The conversations of a synthetic workload, identical for identical (workload, cfg)."""
    if workload not in SYNTHETIC_WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose one of {SYNTHETIC_WORKLOADS}")
    shared_system = _system_prompt(
        random.Random(f"{cfg.seed}/{workload}/system"),
        cfg.system_len,
        "You are a helpful assistant. Background notes:",
    )
    conversations: list[Conversation] = []
    for i in range(cfg.num_conversations):
        rng = random.Random(f"{cfg.seed}/{workload}/{i}")
        cid = f"{workload}-{i}"
        if workload == "agent":
            system = _system_prompt(
                rng,
                cfg.system_len,
                "You are a coding agent. Tools: " + ", ".join(_TOOLS) + ". Call one tool per reply. Notes:",
            )
            num_rounds = cfg.num_turns - 1
            conversations.append(
                AgentConversation(
                    conversation_id=cid,
                    system=system,
                    task=f"Task {i}: {_words(rng, cfg.turn_len)}",
                    tool_results=[_words(rng, cfg.tool_result_len) for _ in range(num_rounds)],
                    tool_calls=[(rng.choice(_TOOLS), _words(rng, 3)) for _ in range(num_rounds)],
                    reply_len=cfg.reply_len,
                )
            )
            continue
        if workload == "claude-code":
            conversations.append(
                ClaudeCodeConversation(
                    conversation_id=cid,
                    system=_system_prompt(
                        rng, cfg.system_len, "You are Claude Code, a CLI coding agent. Notes:"
                    ),
                    user_turns=[f"Task {t}: {_words(rng, cfg.turn_len)}" for t in range(cfg.num_turns)],
                    reply_len=cfg.reply_len,
                    session_id=f"{rng.getrandbits(64):016x}",
                    nonce_seed=f"{cfg.seed}/{workload}/{i}/nonce",
                )
            )
            continue
        if workload == "codex":
            # Codex CLI (Responses, store false) replays the whole conversation every turn with a
            # prompt_cache_key naming it; kept as chat messages (the system message is the
            # instructions), `client.responses_body` sends them as input items
            conversations.append(
                ChatConversation(
                    conversation_id=cid,
                    system=_system_prompt(rng, cfg.system_len, "You are Codex, a coding agent. Notes:"),
                    user_turns=[f"Task {t}: {_words(rng, cfg.turn_len)}" for t in range(cfg.num_turns)],
                    reply_len=cfg.reply_len,
                    extra_body=(("prompt_cache_key", f"{rng.getrandbits(64):016x}"),),
                    api="responses",
                )
            )
            continue
        if workload == "code-edit":
            # an agent sends a source file (system_len / 2 lines) and asks for it back with a
            # small change; each later turn asks for one more change to the file it got back
            source, names = source_file(rng, max(20, cfg.system_len // 2))
            old = rng.sample(names, min(cfg.num_turns, len(names)))
            asks = [f"Rename the function `{n}` to `{n}_v2` and send back the whole file." for n in old]
            asks[0] = f"Here is a file, `module_{i}.py`:\n```python\n{source}```\n{asks[0]}"
            conversations.append(
                ChatConversation(
                    conversation_id=cid,
                    system="You are a coding assistant. Reply with the whole file in one code block.",
                    user_turns=asks,
                    reply_len=cfg.reply_len,
                )
            )
            continue
        # shared-prefix: one system prompt for every user; the others: one per conversation.
        system = (
            shared_system
            if workload == "shared-prefix"
            else _system_prompt(rng, cfg.system_len, f"You are assistant {i}. Background notes:")
        )
        turns = [f"Question {t}: {_words(rng, cfg.turn_len)}" for t in range(cfg.num_turns)]
        edited = f"Question 0, rewritten: {_words(rng, cfg.turn_len)}" if workload == "edit-turn" else None
        conversations.append(
            ChatConversation(
                conversation_id=cid,
                system=system,
                user_turns=turns,
                reply_len=cfg.reply_len,
                abort_after=cfg.abort_after if workload == "abort-resend" else None,
                edited_first=edited,
            )
        )
    return conversations
