"""`slotserve bench structured`: decode tokens/s under a json_schema constraint vs none.

One slot, the real scheduler and engine (no HTTP). The same chat prompt is decoded greedily
`--reps` times each way, alternating, so both sides see the same machine noise:

    free         max_tokens tokens, ignore_eos (the unconstrained baseline)
    json_schema  the same budget under a schema whose shortest valid answer is longer than it,
                 so the constrained side decodes as many tokens (a reply cut by max_tokens)

Validated first: a constrained reply within a large enough budget parses and validates against
a small schema. Decode tokens/s = (completion_tokens - 1) / (e2e_s - ttft_s) per run; the figure is
the median, and `ratio` is constrained / free. Also reported: the mean and max time of one mask
computation (llguidance, replayed over the constrained reply's tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

PROMPT = [{"role": "user", "content": "List many fruits as JSON."}]
SMALL_SCHEMA = {
    "type": "object",
    "properties": {
        "fruit": {"type": "string", "maxLength": 12},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["fruit", "count"],
    "additionalProperties": False,
}
# no answer fits in the budget: 64 strings of at least 4 characters
LONG_SCHEMA = {
    "type": "object",
    "properties": {
        "fruits": {
            "type": "array",
            "items": {"type": "string", "minLength": 4, "maxLength": 16},
            "minItems": 64,
            "maxItems": 64,
        }
    },
    "required": ["fruits"],
    "additionalProperties": False,
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", metavar="NAME|PATH", help="short name or GGUF path (default: the default model)"
    )
    parser.add_argument("--tokens", type=int, default=128, help="tokens decoded per run (default 128)")
    parser.add_argument("--reps", type=int, default=5, help="runs each way (median reported)")
    parser.add_argument(
        "--threads", type=int, default=None, help="engine threads (default: the engine's choice)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


async def _generate(runtime: Any, ids: list[int], params: Any) -> tuple[list[int], Any]:
    from slotserve.scheduler.request import GenerationRequest, TokenEvent

    handle = runtime.scheduler.submit(GenerationRequest(prompt_ids=list(ids), params=params))
    tokens: list[int] = []
    async for ev in handle:
        if isinstance(ev, TokenEvent):
            tokens.extend(ev.token_ids)
        else:
            return tokens, ev
    raise AssertionError("no finish event")


def _decode_tps(finish: Any) -> float:
    t = finish.timings
    return (finish.completion_tokens - 1) / max(1e-9, t["e2e_s"] - t["ttft_s"])


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from slotserve.gateway.config import ServeConfig
    from slotserve.gateway.runtime import load_runtime
    from slotserve.scheduler.request import SamplingParams

    config = ServeConfig(
        model=args.model, batched_session=1, ctx_size=1024, threads=args.threads, no_reuse=True
    )
    runtime = load_runtime(config)
    ids, _ = runtime.encode_chat(PROMPT)
    grammars = runtime.grammars
    if grammars is None:
        raise SystemExit("constrained decoding is unavailable for this model's tokenizer (see the log)")
    async with runtime.scheduler:
        # validate before timing
        small = grammars.json_schema(SMALL_SCHEMA)
        toks, fin = await _generate(runtime, ids, SamplingParams(temperature=0, max_tokens=96, grammar=small))
        text = runtime.decode(toks)
        obj = json.loads(text)
        if not (isinstance(obj, dict) and set(obj) == {"fruit", "count"} and 0 <= obj["count"] <= 99):
            raise SystemExit(f"validation failed: {text!r}")
        long_grammar = grammars.json_schema(LONG_SCHEMA)
        free_p = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
        cons_p = SamplingParams(temperature=0, max_tokens=args.tokens, grammar=long_grammar)
        free, cons, cons_tokens = [], [], []
        for _ in range(args.reps):
            _, f = await _generate(runtime, ids, free_p)
            free.append(_decode_tps(f))
            toks, c = await _generate(runtime, ids, cons_p)
            if c.completion_tokens != args.tokens:
                raise SystemExit(
                    f"the constrained run decoded {c.completion_tokens} tokens, not {args.tokens}"
                )
            cons.append(_decode_tps(c))
            cons_tokens = toks
    # one mask computation, timed synchronously, replayed over the constrained reply
    mask_s = []
    seq = long_grammar.start()
    seq.allowed()
    for tok in cons_tokens:
        seq.accept(tok)
        seq.allowed()  # waits for the background mask; then time the same computation in place
        t0 = time.perf_counter()
        seq._fill()  # noqa: SLF001
        mask_s.append(time.perf_counter() - t0)
    for close in runtime.closers:
        close()
    free_tps, cons_tps = statistics.median(free), statistics.median(cons)
    return {
        "tokens": args.tokens,
        "reps": args.reps,
        "free_decode_tps": round(free_tps, 1),
        "json_schema_decode_tps": round(cons_tps, 1),
        "ratio": round(cons_tps / free_tps, 3),
        "free_runs": [round(x, 1) for x in free],
        "json_schema_runs": [round(x, 1) for x in cons],
        "mask_ms_mean": round(1e3 * statistics.mean(mask_s), 3),
        "mask_ms_max": round(1e3 * max(mask_s), 3),
        "validated": text,
    }


def run(args: argparse.Namespace) -> int:
    if args.tokens < 8 or args.reps < 1:
        raise SystemExit("need --tokens >= 8 and --reps >= 1")
    out = asyncio.run(_bench(args))
    if args.json:
        print(json.dumps(out))
    else:
        print(f"validated: {out['validated']}")
        print(f"decode tokens/s, {out['tokens']} tokens, median of {out['reps']}:")
        print(f"  free         {out['free_decode_tps']:8.1f}")
        print(f"  json_schema  {out['json_schema_decode_tps']:8.1f}   ratio {out['ratio']:.3f}")
        print(f"  mask per token: mean {out['mask_ms_mean']} ms, max {out['mask_ms_max']} ms")
    return 0
