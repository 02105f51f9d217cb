"""Speculative decoding on the real C engine: greedy output with drafts equals the output
without, token for token, on every fixture architecture (rings on gemma3's sliding-window
layers, several slots drafting in one forward, a rewound second turn) and on the real SmolLM2
and Gemma 3 files; drafted and accepted counts are asserted. A recurrent pool (qwen35) drafts
through its rollback ring, and never without one."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from gguf_fixtures import ARCHS
from sched_support import collect, make_config, make_request
from slotserve.scheduler.request import FinishReason, ReuseSource
from slotserve.scheduler.scheduler import Scheduler


def _open(path, num_slots: int = 3, ctx_len: int = 512, rollback: int = 0):
    from slotserve.engine_ext.loader import open_model

    bundle = open_model(path, num_slots=num_slots, ctx_len=ctx_len, threads=1, rollback=rollback)
    return bundle.pool, bundle.tokenizer


def _prompt(seed: int, n_vocab: int) -> list[int]:
    rng = np.random.default_rng(seed)
    block = [int(t) for t in rng.integers(3, n_vocab, 24)]
    return block + block + block[:10]


async def _run(path, prompts, max_tokens, draft_max, turn2=False, num_slots=3, tok=None, rollback=0):
    if tok is None:
        pool, tok = _open(path, num_slots, rollback=rollback)
    else:  # the tokenizer of an earlier open (building Gemma's takes seconds): only a new pool
        from slotserve.engine_ext import SlotPool

        pool = SlotPool(path, num_slots, 512, threads=1)
    config = make_config(segment_tokens=32, draft_max=draft_max, spec_cost_gate=False)
    async with Scheduler(pool, config, token_bytes=tok.token_bytes, eos_token_ids=()) as sched:
        outs = await asyncio.gather(*(collect(sched.submit(make_request(p, max_tokens))) for p in prompts))
        if turn2:
            second = prompts[0] + outs[0].tokens + prompts[1][:7]
            outs.append(await collect(sched.submit(make_request(second, max_tokens))))
            assert outs[-1].finish.reuse.source is ReuseSource.REWIND
            # a resend (a regenerate): the shared n-gram pool drafts what the first answer said
            outs.append(await collect(sched.submit(make_request(prompts[2], max_tokens))))
        await sched.check_integrity()
    return outs


@pytest.mark.parametrize("arch", ("llama", *ARCHS))
async def test_speculative_equals_plain_on_every_fixture(arch, tiny_model_factory, arch_model_factory):
    path = tiny_model_factory("Q4_1") if arch == "llama" else arch_model_factory(arch)
    prompts = [_prompt(s, 299) for s in range(3)]
    plain = await _run(path, prompts, 40, None, turn2=True)
    spec = await _run(path, prompts, 40, 6, turn2=True)
    for a, b in zip(plain, spec):
        assert a.tokens == b.tokens and b.finish.reason is FinishReason.LENGTH
    drafted = sum(o.finish.drafted_tokens for o in spec)
    accepted = sum(o.finish.accepted_tokens for o in spec)
    assert drafted > 0 and accepted > 0, (drafted, accepted)
    assert spec[-1].finish.accepted_tokens >= 20  # the resend copies the earlier answer


@pytest.mark.parametrize("rollback", [0, 7])
async def test_speculative_on_a_recurrent_pool_cuts_back_through_its_rollback_ring(
    rollback, qwen35_model_factory
):
    """qwen35 (Gated DeltaNet state): with a rollback ring of 7 states a slot drafts up to 6
    tokens and its rejected rows are cut back exactly (several slots in one forward, a second
    turn extending the first's slot, a resend drafted from the shared pool); greedy output
    equals plain decoding's token for token. Without a ring it never drafts."""
    path = qwen35_model_factory()
    prompts = [_prompt(s, 299) for s in range(3)]
    plain = await _run(path, prompts, 40, None, turn2=True)
    spec = await _run(path, prompts, 40, 6, turn2=True, rollback=rollback)
    assert [o.tokens for o in plain] == [o.tokens for o in spec]
    drafted = sum(o.finish.drafted_tokens for o in spec)
    accepted = sum(o.finish.accepted_tokens for o in spec)
    if rollback == 0:
        assert drafted == 0
        return
    assert drafted > 0 and 0 < accepted < drafted, (drafted, accepted)
    assert spec[-1].finish.accepted_tokens >= 20  # the resend copies the earlier answer


CODE = (
    "def area(width, height):\n    return width * height\n\n"
    "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
    "def describe(width, height):\n    print('area', area(width, height))\n"
    "    print('perimeter', perimeter(width, height))\n"
)


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
async def test_speculative_equals_plain_on_real_models(model, real_model_path, gemma3_model_path):
    path = real_model_path if model == "smollm2" else gemma3_model_path
    _, tok = _open(path, 1, 64)
    text = f"Here is a file:\n{CODE}\nThe same file with area renamed to surface:\n"
    prompt = [int(t) for t in tok.encode(text)]
    # (Gemma's 262k-entry vocabulary makes each verified row's logits cost as much as its layers)
    plain = await _run(path, [prompt], 40, None, num_slots=1, tok=tok)
    spec = await _run(path, [prompt], 40, 4, num_slots=1, tok=tok)
    assert plain[0].tokens == spec[0].tokens
    assert spec[0].finish.drafted_tokens > 0 and spec[0].finish.accepted_tokens > 0
