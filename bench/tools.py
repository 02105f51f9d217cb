"""`slotserve bench tools --url URL`: tool-call recall and false calls of a served model.

Each prompt of `tool_prompts.NEEDS_TOOL` is sent once with the three tools of
`tool_prompts.TOOLS` (tool_choice auto, greedy): it counts as parsed and valid when the reply
holds a tool call naming a declared function whose arguments are a JSON object with every
required parameter of the right JSON type, and as a hit when that function is also the one the
prompt needs. Each prompt of `NO_TOOL` is sent the same way: a reply with
any tool call is a false call. The load average is printed beside the figures (a shared machine
changes times, not the greedy outputs). Non-streamed unless `--stream`, which accumulates the
chunks as an OpenAI client does.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from .tool_prompts import NEEDS_TOOL, NO_TOOL, TOOLS

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "number": (int, float),
    "integer": (int,),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the server's base URL")
    parser.add_argument("--model", default=None, help="model name to send (default: the server's first)")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--stream", action="store_true", help="streamed requests, chunks accumulated")
    parser.add_argument("--limit", type=int, default=0, help="only the first N prompts of each set")
    parser.add_argument("--json", default=None, help="write every reply and the summary here")


def args_valid(name: str, arguments: str) -> bool:
    """The arguments are a JSON object with every required parameter of `name`, typed right."""
    fn = next((t["function"] for t in TOOLS if t["function"]["name"] == name), None)
    if fn is None:
        return False
    try:
        args = json.loads(arguments)
    except ValueError:
        return False
    if not isinstance(args, dict):
        return False
    props = fn["parameters"]["properties"]
    for key in fn["parameters"]["required"]:
        if key not in args:
            return False
        want = _TYPES[props[key]["type"]]
        if not isinstance(args[key], want) or (isinstance(args[key], bool) and bool not in want):
            return False
    return True


def _accumulate(lines: Any) -> tuple[str, list[dict[str, str]]]:
    content: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            content.append(delta.get("content") or "")
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"name": "", "arguments": ""})
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
    return "".join(content), [calls[i] for i in sorted(calls)]


def ask(client: Any, url: str, model: str, prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "tools": TOOLS,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": stream,
    }
    t0 = time.perf_counter()
    if stream:
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            content, calls = _accumulate(r.iter_lines())
    else:
        r = client.post(f"{url}/v1/chat/completions", json=body)
        r.raise_for_status()
        msg = r.json()["choices"][0]["message"]
        content = msg.get("content") or ""
        calls = [tc["function"] for tc in msg.get("tool_calls") or []]
    return {"prompt": prompt, "content": content, "calls": calls, "seconds": time.perf_counter() - t0}


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def run(args: argparse.Namespace) -> int:
    import httpx

    url = args.url.rstrip("/")
    with httpx.Client(timeout=600) as client:
        model = args.model or client.get(f"{url}/v1/models").json()["data"][0]["id"]
        needs = NEEDS_TOOL[: args.limit or None]
        none = NO_TOOL[: args.limit or None]
        load0 = _loadavg()
        hits = valid = 0
        rows = []
        for prompt, expected in needs:
            got = ask(client, url, model, prompt, args.max_tokens, args.stream)
            first = got["calls"][0] if got["calls"] else None
            is_valid = first is not None and args_valid(first["name"], first["arguments"])
            ok = is_valid and first is not None and first["name"] == expected
            hits, valid = hits + ok, valid + is_valid
            rows.append({**got, "expected": expected, "hit": ok, "valid": is_valid})
            print(
                f"{'hit ' if ok else 'MISS'} {prompt!r}: {got['calls'] or got['content'][:80]!r}", flush=True
            )
        false_calls = 0
        for prompt in none:
            got = ask(client, url, model, prompt, args.max_tokens, args.stream)
            false_calls += bool(got["calls"])
            rows.append({**got, "expected": None, "hit": not got["calls"]})
            print(
                f"{'FALSE' if got['calls'] else 'ok   '} {prompt!r}: {got['calls'] or got['content'][:60]!r}"
            )
        summary = {
            "model": model,
            "stream": args.stream,
            "parsed_valid": f"{valid}/{len(needs)}",
            "right_tool": f"{hits}/{len(needs)}",
            "right_tool_pct": round(100 * hits / max(1, len(needs)), 1),
            "false_calls": f"{false_calls}/{len(none)}",
            "loadavg_start": load0,
            "loadavg_end": _loadavg(),
            "seconds": round(sum(r["seconds"] for r in rows), 1),
        }
    print(json.dumps(summary))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "replies": rows}, f, indent=1)
    return 0
