"""`slotserve bench routing`: cost of routing one long prompt against N live slots.

Each slot holds a record as long as the prompt that shares most of it (the worst case for a
prefix comparison: the mismatch is near the end, so every token is compared). The benchmark
first checks the decision against a brute-force answer, then times `policy.route` (all the
slots' common prefixes, source and destination choice) and the bare common-prefix kernel.
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
    return 0
