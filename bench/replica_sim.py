"""`slotserve bench replica-sim`: N replicas x M slots under a conversation trace, per cluster policy.

Design: a discrete-event simulation in token space (no model, no HTTP). A seeded trace of
multi-turn conversations (a few shared system prompts, then per-conversation turns) is replayed
closed-loop: a conversation sends its next turn a think time after the previous reply ends, and
each turn's prompt is the whole history. A cluster policy picks the replica; the replica picks
its slot with the scheduler's own decision code, `scheduler.policy.route` (pluggable as
`slot_chooser`), and a slot is busy for prefill(new tokens) + decode(reply) seconds. Replicas
queue FIFO when every slot is busy. Checkpoints are not modelled (slots only), so the numbers are
what slots alone keep.

Cluster policies (`ClusterPolicy`):
  cache_aware  the router sees every replica's slots (as with KV events) and asks, for each
               replica with a free slot, what that replica's own decision (`slot_chooser`)
               would be; it keeps the replica whose decision evicts nothing, then reuses the
               most, then loses the fewest tokens, then is least busy. When every slot is busy:
               the replica holding the longest prefix, then the shortest queue.
  round_robin  replica i mod N.
  random       a uniformly random replica.

Reported per (N, policy): token hit rate (prompt tokens reused / prompt tokens), prefill tokens
saved, turns >= 2 that reused at least their previous prompt (the conversation stayed home),
mean queue wait, the busiest replica's share of requests, and the oracle hit rate (every turn
finds its whole history; a first turn, its system prompt if an earlier conversation used it).
"""

from __future__ import annotations

import argparse
import enum
import heapq
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from slotserve.scheduler.policy import Capabilities, RouteAction, RouteDecision, SlotCandidate, route
from slotserve.scheduler.prefix import common_prefix_len


class ClusterPolicy(str, enum.Enum):
    CACHE_AWARE = "cache_aware"  # the slot decision over every replica's free slots
    ROUND_ROBIN = "round_robin"  # next replica in turn
    RANDOM = "random"  # uniformly random replica


SlotChooser = Callable[[np.ndarray, Sequence[SlotCandidate]], RouteDecision]


def default_slot_chooser(half_life_s: float = 600.0) -> SlotChooser:
    """The replica's own decision: `route` with rewind and copy, no checkpoints."""
    caps = Capabilities(can_copy=True, can_snapshot=False)

    def choose(prompt: np.ndarray, slots: Sequence[SlotCandidate]) -> RouteDecision:
        return route(prompt, slots, (), caps=caps, idle_half_life_s=half_life_s)

    return choose


# ---------------------------------------------------------------- trace


@dataclass(frozen=True, slots=True)
class TraceConfig:
    num_conversations: int = 64
    num_system_prompts: int = 4  # conversations share one of these
    system_len: int = 400  # tokens
    turns: tuple[int, int] = (3, 10)  # turns per conversation, inclusive range
    user_len: tuple[int, int] = (20, 200)  # tokens per user/tool message
    reply_len: tuple[int, int] = (20, 150)  # tokens per reply
    ramp_s: float = 60.0  # conversations start uniformly within this window
    think_s: float = 5.0  # mean gap (exponential) between a reply and the next turn
    vocab: int = 49152
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_conversations < 1 or self.num_system_prompts < 1:
            raise ValueError("need at least one conversation and one system prompt")
        for name in ("turns", "user_len", "reply_len"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name}={lo, hi}: need 1 <= low <= high")
        if self.system_len < 0 or self.ramp_s < 0 or self.think_s < 0:
            raise ValueError("system_len, ramp_s and think_s must be >= 0")


@dataclass(frozen=True, slots=True)
class ConversationTrace:
    start_s: float
    system_id: int  # which shared system prompt
    system: np.ndarray  # int32 [system_len]
    users: tuple[np.ndarray, ...]  # int32 [u_i], one per turn
    replies: tuple[np.ndarray, ...]  # int32 [r_i], one per turn
    think_s: tuple[float, ...]  # gap before turn i (turn 0: 0)


def make_trace(cfg: TraceConfig) -> list[ConversationTrace]:
    """Deterministic in `cfg` (seed included)."""
    rng = np.random.default_rng(cfg.seed)
    systems = [
        rng.integers(0, cfg.vocab, cfg.system_len, dtype=np.int32) for _ in range(cfg.num_system_prompts)
    ]
    out = []
    for _ in range(cfg.num_conversations):
        n = int(rng.integers(cfg.turns[0], cfg.turns[1] + 1))
        sid = int(rng.integers(cfg.num_system_prompts))
        out.append(
            ConversationTrace(
                start_s=float(rng.uniform(0, cfg.ramp_s)),
                system_id=sid,
                system=systems[sid],
                users=tuple(
                    rng.integers(
                        0, cfg.vocab, int(rng.integers(*cfg.user_len, endpoint=True)), dtype=np.int32
                    )
                    for _ in range(n)
                ),
                replies=tuple(
                    rng.integers(
                        0, cfg.vocab, int(rng.integers(*cfg.reply_len, endpoint=True)), dtype=np.int32
                    )
                    for _ in range(n)
                ),
                think_s=(
                    0.0,
                    *(float(rng.exponential(cfg.think_s)) if cfg.think_s else 0.0 for _ in range(n - 1)),
                ),
            )
        )
    return out


# ---------------------------------------------------------------- simulation


@dataclass(frozen=True, slots=True)
class ServiceModel:
    prefill_tok_s: float = 2000.0  # per slot
    decode_tok_s: float = 40.0  # per slot
    ctx_len: int = 8192  # tokens per slot; a conversation ends when its next turn would not fit
    half_life_s: float = 600.0  # the scheduler's idle half-life (victim choice)


@dataclass
class _Job:
    conv: int
    turn: int
    prompt: np.ndarray  # int32 [L]
    reply: np.ndarray  # int32 [R]
    arrival_s: float


@dataclass
class _Replica:
    records: list[np.ndarray]  # [slot] int32 live record
    busy: list[bool]
    last_used: list[float]
    queue: list[_Job] = field(default_factory=list)
    num_requests: int = 0


@dataclass
class SimResult:
    policy: str
    num_replicas: int
    slots_per_replica: int
    num_requests: int
    prompt_tokens: int
    reused_tokens: int  # prefill tokens saved
    later_turns: int  # requests with turn >= 2
    later_turns_home: int  # ... that reused at least their previous turn's prompt
    oracle_reused_tokens: int  # every turn reuses its whole history, a first turn a system prompt seen before
    mean_queue_s: float
    max_share: float  # busiest replica's share of requests x N (1.0 = perfectly even)
    wall_s: float

    @property
    def hit_rate(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def oracle_hit_rate(self) -> float:
        return self.oracle_reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def home_rate(self) -> float:
        return self.later_turns_home / self.later_turns if self.later_turns else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(hit_rate=self.hit_rate, oracle_hit_rate=self.oracle_hit_rate, home_rate=self.home_rate)
        return d


def simulate(
    trace: Sequence[ConversationTrace],
    num_replicas: int,
    slots_per_replica: int,
    policy: ClusterPolicy,
    service: ServiceModel = ServiceModel(),
    *,
    slot_chooser: SlotChooser | None = None,
    seed: int = 0,
) -> SimResult:
    """Replay `trace` on the cluster; see the module docstring."""
    if num_replicas < 1 or slots_per_replica < 1:
        raise ValueError("need num_replicas >= 1 and slots_per_replica >= 1")
    choose = slot_chooser or default_slot_chooser(service.half_life_s)
    rng = random.Random(seed)
    empty = np.zeros(0, dtype=np.int32)
    reps = [
        _Replica([empty] * slots_per_replica, [False] * slots_per_replica, [0.0] * slots_per_replica)
        for _ in range(num_replicas)
    ]
    events: list[tuple[float, int, str, tuple]] = []  # (time, tie, kind, payload)
    tie = 0

    def push(t: float, kind: str, payload: tuple) -> None:
        nonlocal tie
        heapq.heappush(events, (t, tie, kind, payload))
        tie += 1

    history = [np.concatenate([c.system]) for c in trace]  # [conv] tokens so far (prompt + replies)
    prev_prompt_len = [0] * len(trace)
    rr = 0
    seen_systems: set[int] = set()
    stats = dict(requests=0, prompt=0, reused=0, later=0, home=0, oracle=0, queue_s=0.0)

    def candidates(rep: _Replica, now: float) -> list[SlotCandidate]:
        return [
            SlotCandidate(s, rep.records[s], not rep.busy[s], 0.0 if rep.busy[s] else now - rep.last_used[s])
            for s in range(slots_per_replica)
        ]

    def pick_replica(job: _Job, now: float) -> int:
        nonlocal rr
        if policy is ClusterPolicy.ROUND_ROBIN:
            rr += 1
            return (rr - 1) % num_replicas
        if policy is ClusterPolicy.RANDOM:
            return rng.randrange(num_replicas)
        # Ask every replica with a free slot what it would do with this prompt, keep the best:
        # no eviction, then the most reuse, then the least lost, then the least busy.
        best: tuple | None = None
        for i, rep in enumerate(reps):
            if rep.queue or all(rep.busy):
                continue
            d = choose(job.prompt, candidates(rep, now))
            if d.dest is None:
                continue
            key = (d.evicts, -d.reuse_len, d.lost_tokens, sum(rep.busy), i)
            if best is None or key < best:
                best = key
        if best is not None:
            return best[-1]
        # every slot busy: the replica holding the longest prefix, then the shortest queue
        return max(
            range(num_replicas),
            key=lambda i: (
                max(common_prefix_len(job.prompt, r) for r in reps[i].records),
                -len(reps[i].queue),
                -i,
            ),
        )

    def start(i: int, job: _Job, now: float) -> None:
        rep = reps[i]
        d = choose(job.prompt, candidates(rep, now))
        assert d.dest is not None and not rep.busy[d.dest], f"slot chooser returned {d.action}"
        reuse = d.reuse_len if d.action in (RouteAction.REWIND, RouteAction.COPY) else 0
        rep.busy[d.dest] = True
        rep.num_requests += 1
        L = len(job.prompt)
        stats["requests"] += 1
        stats["prompt"] += L
        stats["reused"] += reuse
        stats["queue_s"] += now - job.arrival_s
        if job.turn > 0:
            stats["later"] += 1
            stats["home"] += int(reuse >= prev_prompt_len[job.conv])
            stats["oracle"] += min(len(history[job.conv]), L - 1)
        else:
            sid = trace[job.conv].system_id
            stats["oracle"] += min(len(trace[job.conv].system), L - 1) if sid in seen_systems else 0
            seen_systems.add(sid)
        done = now + (L - reuse) / service.prefill_tok_s + len(job.reply) / service.decode_tok_s
        push(done, "done", (i, d.dest, job))

    for c, conv in enumerate(trace):
        push(conv.start_s, "arrive", (c, 0))

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            c, turn = payload
            conv = trace[c]
            prompt = np.concatenate([history[c], conv.users[turn]])
            if len(prompt) + len(conv.replies[turn]) > service.ctx_len:
                continue  # the conversation has outgrown a slot; it ends here
            job = _Job(c, turn, prompt, conv.replies[turn], now)
            i = pick_replica(job, now)
            rep = reps[i]
            if not rep.queue and not all(rep.busy):
                start(i, job, now)
            else:
                rep.queue.append(job)
        else:
            i, slot, job = payload
            rep = reps[i]
            rep.busy[slot] = False
            rep.last_used[slot] = now
            rep.records[slot] = np.concatenate([job.prompt, job.reply])
            c = job.conv
            prev_prompt_len[c] = len(job.prompt)
            history[c] = rep.records[slot]
            if job.turn + 1 < len(trace[c].users):
                push(now + trace[c].think_s[job.turn + 1], "arrive", (c, job.turn + 1))
            if rep.queue:
                start(i, rep.queue.pop(0), now)

    per_rep = [r.num_requests for r in reps]
    return SimResult(
        policy=policy.value,
        num_replicas=num_replicas,
        slots_per_replica=slots_per_replica,
        num_requests=int(stats["requests"]),
        prompt_tokens=int(stats["prompt"]),
        reused_tokens=int(stats["reused"]),
        later_turns=int(stats["later"]),
        later_turns_home=int(stats["home"]),
        oracle_reused_tokens=int(stats["oracle"]),
        mean_queue_s=stats["queue_s"] / max(1, stats["requests"]),
        max_share=max(per_rep) * num_replicas / max(1, sum(per_rep)),
        wall_s=0.0,
    )


# ---------------------------------------------------------------- CLI


def _pair(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(",")
    try:
        return (int(lo), int(hi or lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH (e.g. 20,200), got {text!r}") from None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--replicas",
        type=int,
        nargs="+",
        default=[1, 2, 4, 8, 16, 32, 64, 100],
        help="replica counts to simulate (default 1 2 4 8 16 32 64 100)",
    )
    parser.add_argument("--slots", type=int, default=4, help="slots per replica (default 4)")
    parser.add_argument(
        "--policies",
        nargs="+",
        default=[p.value for p in ClusterPolicy],
        choices=[p.value for p in ClusterPolicy],
    )
    parser.add_argument(
        "--conversations-per-slot",
        type=float,
        default=1.0,
        help="conversations in the trace per slot of the cluster (default 1.0)",
    )
    parser.add_argument("--system-prompts", type=int, default=4)
    parser.add_argument("--system-len", type=int, default=400)
    parser.add_argument("--turns", type=_pair, default=(3, 10), metavar="LOW,HIGH")
    parser.add_argument("--user-len", type=_pair, default=(20, 200), metavar="LOW,HIGH")
    parser.add_argument("--reply-len", type=_pair, default=(20, 150), metavar="LOW,HIGH")
    parser.add_argument("--think-s", type=float, default=5.0, help="mean think time between turns")
    parser.add_argument("--ramp-s", type=float, default=60.0, help="conversation start window")
    parser.add_argument("--prefill-tok-s", type=float, default=2000.0)
    parser.add_argument("--decode-tok-s", type=float, default=40.0)
    parser.add_argument("--ctx-len", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for results.json, table.md and hit_rate.png (nothing written without it)",
    )


def run(args: argparse.Namespace) -> int:
    if any(n < 1 or n > 1000 for n in args.replicas):
        raise SystemExit("--replicas: each count must be in 1..1000")
    if args.slots < 1 or args.conversations_per_slot <= 0:
        raise SystemExit("--slots must be >= 1 and --conversations-per-slot > 0")
    service = ServiceModel(args.prefill_tok_s, args.decode_tok_s, args.ctx_len)
    results: list[SimResult] = []
    for n in args.replicas:
        trace = make_trace(
            TraceConfig(
                num_conversations=max(1, round(args.conversations_per_slot * n * args.slots)),
                num_system_prompts=args.system_prompts,
                system_len=args.system_len,
                turns=args.turns,
                user_len=args.user_len,
                reply_len=args.reply_len,
                ramp_s=args.ramp_s,
                think_s=args.think_s,
                seed=args.seed,
            )
        )
        for p in args.policies:
            t0 = time.perf_counter()
            r = simulate(trace, n, args.slots, ClusterPolicy(p), service, seed=args.seed)
            r.wall_s = time.perf_counter() - t0
            results.append(r)
            print(
                f"N={n:<4} {p:<12} hit {r.hit_rate:6.1%}  home {r.home_rate:6.1%}  "
                f"saved {r.reused_tokens:>10,} of {r.prompt_tokens:>10,}  oracle {r.oracle_hit_rate:6.1%}  "
                f"queue {r.mean_queue_s:6.2f}s  max share {r.max_share:4.2f}  ({r.wall_s:.1f}s)",
                flush=True,
            )
    table = markdown_table(results)
    print()
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(
            json.dumps(
                {
                    "args": {
                        k: (str(v) if isinstance(v, Path) else v)
                        for k, v in vars(args).items()
                        if not k.startswith("_")
                    },
                    "results": [r.as_dict() for r in results],
                },
                indent=2,
            )
            + "\n"
        )
        (args.out / "table.md").write_text(table + "\n")
        plot(results, args.out / "hit_rate.png", args.slots)
        print(f"\nwrote {args.out}/results.json, table.md, hit_rate.png")
    return 0


def markdown_table(results: Sequence[SimResult]) -> str:
    lines = [
        "| replicas | policy | token hit rate | turns >= 2 kept home | prefill tokens saved | oracle hit rate | mean queue (s) | busiest replica share |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.num_replicas} | {r.policy} | {r.hit_rate:.1%} | {r.home_rate:.1%} | "
            f"{r.reused_tokens:,} / {r.prompt_tokens:,} | {r.oracle_hit_rate:.1%} | {r.mean_queue_s:.2f} | {r.max_share:.2f} |"
        )
    return "\n".join(lines)


def plot(results: Sequence[SimResult], path: Path, slots: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for policy in ClusterPolicy:
        rows = sorted((r for r in results if r.policy == policy.value), key=lambda r: r.num_replicas)
        if rows:
            ax.plot(
                [r.num_replicas for r in rows],
                [100 * r.hit_rate for r in rows],
                marker="o",
                label=policy.value,
            )
    oracle = sorted({r.num_replicas: r for r in results}.values(), key=lambda r: r.num_replicas)
    ax.plot(
        [r.num_replicas for r in oracle],
        [100 * r.oracle_hit_rate for r in oracle],
        ls="--",
        color="gray",
        label="oracle (whole history)",
    )
    ax.set_xscale("log")
    ticks = sorted({r.num_replicas for r in results})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("replicas")
    ax.set_ylabel("prompt tokens reused (%)")
    ax.set_ylim(0, 100)
    ax.set_title(f"Prefix reuse across replicas ({slots} slots each)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
