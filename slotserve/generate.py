"""`slotserve generate`: one-shot generation on one KV slot, streamed to stdout.

The prompt (raw, or wrapped in the model's chat template with --chat) is prefilled in one
forward call, then tokens are decoded one at a time until an end-of-generation token or
--max-tokens. Greedy at temperature 0; otherwise softmax sampling from a seeded generator.
One line of timings goes to stderr.
"""

from __future__ import annotations

import argparse
import codecs
import sys
import time

DEFAULT_MAX_TOKENS = 128
MAX_TOKENS_LIMIT = 32768


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = "Generate a continuation of one prompt and print it (timings on stderr)."
    parser.add_argument(
        "--model",
        metavar="NAME|PATH",
        help="a known model's short name (`slotserve pull --list`) or a local GGUF file "
        "(default: the default model); known models are pulled on first use",
    )
    parser.add_argument("--prompt", required=True, metavar="TEXT", help="the prompt text")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        metavar="N",
        help=f"tokens to generate at most (default {DEFAULT_MAX_TOKENS})",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="0 (default) = greedy; > 0 samples from softmax(logits / T)",
    )
    parser.add_argument("--seed", type=int, default=None, metavar="S", help="sampling seed (default: random)")
    parser.add_argument(
        "--chat",
        action="store_true",
        help="send the prompt as one user message through the model's chat template",
    )
    parser.add_argument(
        "--threads", type=int, default=None, metavar="K", help="compute threads (default: the CPUs available)"
    )


def sample_token(logits, temperature: float, rng) -> int:
    """argmax (lowest id on ties) at temperature 0; else a draw from softmax(logits / T).
    logits: float32 [n_vocab]."""
    import numpy as np

    if temperature == 0.0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))


def _validate(args: argparse.Namespace) -> None:
    if not 1 <= args.max_tokens <= MAX_TOKENS_LIMIT:
        raise ValueError(f"--max-tokens must be in 1..{MAX_TOKENS_LIMIT}, got {args.max_tokens}")
    if not args.temperature >= 0.0 or args.temperature == float("inf"):
        raise ValueError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")


def run(args: argparse.Namespace) -> int:
    from slotserve.engine_ext.errors import ModelOpenError

    try:
        _validate(args)
        return _generate(args)
    except ModelOpenError:
        raise  # the slotserve command reports it (exit 2)
    except ValueError as exc:
        print(f"slotserve generate: {exc}", file=sys.stderr)
        return 1


def _generate(args: argparse.Namespace) -> int:
    import numpy as np

    from slotserve.engine_ext.chat import chat_template_for
    from slotserve.engine_ext.loader import open_model, read_model
    from slotserve.engine_ext.model_cache import resolve_model
    from slotserve.scheduler.interface import BatchItem

    path = resolve_model(args.model, progress=True)
    # Tokenize first (cheap) so the slot is sized to exactly what this run needs.
    model_file, tokenizer = read_model(path)
    if args.chat:
        chat = chat_template_for(model_file)
        if chat is None:
            raise ValueError(f"{path} has no chat template (tokenizer.chat_template); drop --chat")
        prompt_ids = tokenizer.encode(chat.render([{"role": "user", "content": args.prompt}]))
    else:
        prompt_ids = tokenizer.encode(args.prompt, add_bos=tokenizer.add_bos_token)
    if not prompt_ids:
        raise ValueError("the prompt is empty after tokenization; pass some text with --prompt")
    ctx_len = len(prompt_ids) + args.max_tokens
    if ctx_len > model_file.config.ctx_train:
        raise ValueError(
            f"prompt ({len(prompt_ids)} tokens) + --max-tokens ({args.max_tokens}) exceeds "
            f"the model's context of {model_file.config.ctx_train} tokens; lower --max-tokens"
        )
    pool = open_model(
        model_file, num_slots=1, ctx_len=ctx_len, threads=args.threads, tokenizer=tokenizer
    ).pool

    rng = np.random.default_rng(args.seed)
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    out = sys.stdout

    t0 = time.perf_counter()
    logits = pool.forward([BatchItem(0, np.asarray(prompt_ids, np.int32), 0, True)])[0]
    t1 = time.perf_counter()
    n_generated, n_steps, pos = 0, 0, len(prompt_ids)
    step_input = np.empty(1, np.int32)  # [1] the token fed at each decode step
    while True:
        token = sample_token(logits, args.temperature, rng)
        if token in tokenizer.eos_token_ids:
            break
        out.write(utf8.decode(tokenizer.token_bytes[token]))
        out.flush()
        n_generated += 1
        if n_generated == args.max_tokens:
            break
        step_input[0] = token
        logits = pool.forward([BatchItem(0, step_input, pos, True)])[0]
        pos += 1
        n_steps += 1
    t2 = time.perf_counter()
    out.write(utf8.decode(b"", final=True) + "\n")
    out.flush()

    decode_rate = f"{n_steps / (t2 - t1):.1f} tok/s" if n_steps else "n/a"
    print(
        f"prompt tokens: {len(prompt_ids)}, prefill: {len(prompt_ids) / (t1 - t0):.1f} tok/s, "
        f"generated tokens: {n_generated}, decode: {decode_rate}",
        file=sys.stderr,
    )
    return 0
