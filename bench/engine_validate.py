"""`slotserve bench engine`'s output checks, run before anything is timed: the greedy
continuation of PROMPT against the NumPy implementation (bench/engine_numpy.py) over its first
tokens (and " Paris" on the default model), then chunked prefill and a batch of 4 against
one chunk and one slot, exactly."""

from __future__ import annotations

from typing import Any

PROMPT = "The capital of France is"
VALIDATE_TOKENS = 8
MIN_AGREED = 3  # greedy tokens that must match the NumPy implementation


def _greedy(pool: Any, slot: int, prompt: list[int], n: int) -> list[int]:
    import numpy as np

    pool.truncate(slot, 0)
    logits = pool.forward([(slot, np.array(prompt, np.int32), 0, True)])[0]
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = pool.forward([(slot, np.array(out[-1:], np.int32), pool.slot_len(slot), True)])[0]
    return out


def validate(
    model: Any, tokenizer: Any, pool: Any, reference: Any, is_default: bool, long_len: int = 300
) -> dict[str, Any]:
    """Raise SystemExit with the reason if the engine's outputs are wrong (chunked prefill is
    checked on a random prompt of long_len >= 10 tokens, in three chunks)."""
    import numpy as np

    prompt = tokenizer.encode(PROMPT, add_bos=tokenizer.add_bos_token)
    ours = _greedy(pool, 0, prompt, VALIDATE_TOKENS)
    result: dict[str, Any] = {"prompt": PROMPT, "engine": tokenizer.decode(ours), "engine_ids": ours}
    if reference is not None:
        logits = reference.forward(np.array(prompt))
        theirs = []
        for _ in range(VALIDATE_TOKENS):
            theirs.append(int(np.argmax(logits)))
            logits = reference.forward(np.array(theirs[-1:]))
        agreed = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), VALIDATE_TOKENS)
        result.update(numpy=tokenizer.decode(theirs), agreed_tokens=agreed)
        if agreed < MIN_AGREED:
            raise SystemExit(
                f"validation failed: engine {result['engine']!r} vs NumPy {result['numpy']!r} "
                f"agree over {agreed} < {MIN_AGREED} tokens"
            )
    if is_default and not result["engine"].startswith(" Paris"):
        raise SystemExit(f"validation failed: {PROMPT!r} continued as {result['engine']!r}, not ' Paris'")
    # exactness: chunked prefill and a batch of 4 reproduce single-chunk, single-slot results
    long_prompt = np.random.default_rng(1).integers(0, model.config.n_vocab, long_len).astype(np.int32)
    pool.truncate(0, 0)
    one = pool.forward([(0, long_prompt, 0, True)])[0]
    pool.truncate(1, 0)
    cut = 7 + 2 * (long_len - 7) // 3  # 300 -> chunks of 7, 200, 93
    for at, size in ((0, 7), (7, cut - 7), (cut, long_len - cut)):
        chunked = pool.forward([(1, long_prompt[at : at + size], at, True)])[0]
    if not np.array_equal(one, chunked):
        raise SystemExit("validation failed: chunked prefill differs from one-chunk prefill")
    seq = np.array(prompt + ours, np.int32)
    for s in range(4):
        pool.truncate(s, 0)
        pool.forward([(s, seq[: s + 2], 0, False)])
    batched = pool.forward([(s, seq[s + 2 : s + 3], s + 2, True) for s in range(4)])
    for s in range(4):
        pool.truncate(0, 0)
        single = pool.forward([(0, seq[: s + 3], 0, True)])[0]
        if not np.array_equal(single, batched[s]):
            raise SystemExit(f"validation failed: slot {s} decoded in a batch of 4 differs from alone")
    result["exact_chunking_and_batching"] = True
    return result
