"""`slotserve bench routing`: cost of routing one long prompt against N live slots.

Each slot holds a record as long as the prompt that shares most of it (the worst case for a
prefix comparison: the mismatch is near the end, so every token is compared). The benchmark
first checks the decision against a brute-force answer, then times `policy.route` (all the
slots' common prefixes, source and destination choice) and the bare common-prefix kernel.

With `--checkpoints N` it also times the checkpoint lookup (`MemoryCheckpointStore.find`)
among N stored conversations that all share a system prompt (`--system-tokens`) with the
prompt and nothing more, so every one supplies the same tokens: the lookup's worst case for
ties. The match is checked against a brute-force scan first.
"""

from __future__ import annotations

import argparse
import json
import time


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt-tokens", type=int, default=100_000, help="prompt length")
    parser.add_argument("--slots", type=int, default=8, help="live slots to route against")
    parser.add_argument("--repeat", type=int, default=200, help="timed routing calls")
    parser.add_argument("--vocab", type=int, default=49152, help="token id range")
    parser.add_argument(
        "--checkpoints", type=int, default=0, help="also time a checkpoint lookup among this many entries"
    )
    parser.add_argument("--system-tokens", type=int, default=100, help="system prompt the entries share")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _records(prompt_len: int, num_slots: int, vocab: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab, prompt_len, dtype=np.int32)
    records = []
    for s in range(num_slots):
        rec = prompt.copy()
        cut = prompt_len - 1 - 37 * (s + 1) % max(1, prompt_len // 100)  # late divergence
        rec[cut] = (rec[cut] + 1) % vocab
        records.append(rec)
    return prompt, records


def run(args: argparse.Namespace) -> int:
    import numpy as np
    from slotserve.scheduler.policy import RouteAction, SlotCandidate, route
    from slotserve.scheduler.prefix import common_prefix_len

    if args.prompt_tokens < 2 or args.slots < 1 or args.repeat < 1:
        raise SystemExit("need --prompt-tokens >= 2, --slots >= 1, --repeat >= 1")
    prompt, records = _records(args.prompt_tokens, args.slots, args.vocab)
    cands = [SlotCandidate(s, rec, True, 1.0) for s, rec in enumerate(records)]

    # Validate before timing: the decision must match a brute-force comparison.
    expect = []
    for rec in records:
        diff = np.flatnonzero(rec != prompt)
        expect.append(int(diff[0]) if diff.size else len(prompt))
    got = [common_prefix_len(prompt, rec) for rec in records]
    if got != expect:
        raise SystemExit(f"common_prefix_len disagrees with brute force: {got} != {expect}")
    d = route(prompt, cands)
    best = max(range(args.slots), key=lambda s: (expect[s], -s))
    if d.action is not RouteAction.REWIND or d.reuse_len != min(expect[best], len(prompt) - 1):
        raise SystemExit(f"route chose {d}, expected a rewind of slot {best} to {expect[best]}")

    # Medians of individually timed calls: the machine may be shared, and a median shrugs off
    # the calls another process interrupted.
    route_times, lcp_times = [], []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        route(prompt, cands)
        t1 = time.perf_counter()
        for rec in records:
            common_prefix_len(prompt, rec)
        t2 = time.perf_counter()
        route_times.append(t1 - t0)
        lcp_times.append(t2 - t1)
    route_s = float(np.median(route_times))
    lcp_s = float(np.median(lcp_times))

    result = {
        "prompt_tokens": args.prompt_tokens,
        "slots": args.slots,
        "repeat": args.repeat,
        "route_us": route_s * 1e6,
        "route_us_per_slot": route_s * 1e6 / args.slots,
        "lcp_us_per_slot": lcp_s * 1e6 / args.slots,
        "decision": f"{d.action.value} slot={d.dest} reuse={d.reuse_len}",
    }
    if args.checkpoints > 0:
        result.update(_checkpoint_lookup(args))
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"routing: prompt={args.prompt_tokens} slots={args.slots} repeat={args.repeat} (medians)\n"
            f"  route():             {result['route_us']:9.1f} us per request "
            f"({result['route_us_per_slot']:.1f} us per slot)\n"
            f"  common_prefix_len(): {result['lcp_us_per_slot']:9.1f} us per slot\n"
            f"  decision: {result['decision']}"
        )
        if args.checkpoints > 0:
            print(
                f"  checkpoint find():   {result['find_us']:9.1f} us among {args.checkpoints} entries "
                f"sharing {args.system_tokens} tokens with the prompt (match: {result['find_common']} tokens)"
            )
    return 0


def _checkpoint_lookup(args: argparse.Namespace) -> dict[str, float | int]:
    """Median time of one `find` among args.checkpoints entries that tie (module doc)."""
    import numpy as np
    from slotserve.scheduler.checkpoint_store import CaptureRule, MemoryCheckpointStore
    from slotserve.scheduler.prefix import common_prefix_len

    rng = np.random.default_rng(1)
    system = rng.integers(0, args.vocab, args.system_tokens, dtype=np.int32)
    store = MemoryCheckpointStore(1 << 40)
    entries = [
        np.concatenate([system, rng.integers(0, args.vocab, 400, dtype=np.int32)])
        for _ in range(args.checkpoints)
    ]
    for e in entries:
        store.insert(e, b"", CaptureRule.EVICT)
    prompt = np.concatenate([system, rng.integers(0, args.vocab, 300, dtype=np.int32)])
    want = max(common_prefix_len(prompt, e) for e in entries)
    m = store.find(prompt)
    if m is None or m.common != want:
        raise SystemExit(f"checkpoint find returned {m}, brute force says {want} common tokens")
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        store.find(prompt)
        times.append(time.perf_counter() - t0)
    return {"checkpoints": args.checkpoints, "find_us": float(np.median(times)) * 1e6, "find_common": want}
