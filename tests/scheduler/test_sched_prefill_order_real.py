"""Cost-aware prefill order (`--prefill-order cost`, scheduler/prefill_order.py) on the real
default model (SmolLM2): a returning turn, whose prompt the slot it left mostly holds, goes ahead
of a long cold prompt queued before it, for the free slot and for the step's prefill budget, and
every request's tokens equal a cold run's. (The fake-engine tests pin the same orders step by
step: test_sched_prefill_order.py.)"""

from __future__ import annotations

import pytest
from sched_support import (
    CountingPool,
    ForwardLog,
    ManualClock,
    RecordingSink,
    collect,
    make_config,
    make_request,
    run_one,
    wait_tokens,
)
from slotserve.scheduler.prefill_order import PrefillOrder
from slotserve.scheduler.request import ReuseSource
from slotserve.scheduler.scheduler import Scheduler

pytestmark = pytest.mark.real_model

SEGMENT = 64
STORY = (
    "The lighthouse keeper climbed the spiral stairs each evening, counting the steps as his "
    "father had taught him, and lit the lamp before the fishing boats came home. "
)


@pytest.fixture(scope="module")
def smollm2(real_model_file):
    from slotserve.engine_ext.loader import open_model
    from slotserve.engine_ext.tokenizer import Tokenizer

    tok = Tokenizer.from_model_file(real_model_file)

    def pool(num_slots: int) -> CountingPool:
        bundle = open_model(real_model_file, num_slots=num_slots, ctx_len=1024, tokenizer=tok)
        return CountingPool(bundle.pool)

    return pool, tok


def text_ids(tok, text: str, n: int) -> list[int]:
    """The first n tokens of `text` repeated as often as needed."""
    ids = tok.encode(text)
    while len(ids) < n:
        ids = tok.encode(text * (2 * n // len(ids) + 2))
    return ids[:n]


async def cold_run(smollm2, prompt: list[int], max_tokens: int) -> list[int]:
    make_pool, tok = smollm2
    pool = make_pool(1)
    config = make_config(reuse_enabled=False)
    async with real_scheduler(pool, tok, config) as sched:
        out = await run_one(sched, prompt, max_tokens)
    assert out.finish.reuse.reused_tokens == 0
    return out.tokens


def real_scheduler(pool, tok, config, **kw) -> Scheduler:
    return Scheduler(pool, config, token_bytes=tok.token_bytes, eos_token_ids=tok.eos_token_ids, **kw)


def sched_config():
    return make_config(segment_tokens=SEGMENT, step_token_budget=SEGMENT, prefill_order=PrefillOrder.COST)


async def test_a_returning_turn_takes_the_free_slot_ahead_of_an_earlier_cold_prompt(smollm2):
    make_pool, tok = smollm2
    pool = make_pool(2)
    sink = RecordingSink()
    first_turn = text_ids(tok, "User: tell me a story about a lighthouse.\n" + STORY, 200)
    busy_prompt = text_ids(tok, "Count slowly from one to fifty: one, two, three, ", 30)
    cold = text_ids(tok, "A different tale, about a baker in a mountain village. " + STORY[::-1], 300)
    async with real_scheduler(pool, tok, sched_config(), stats_sink=sink, clock=ManualClock()) as sched:
        prev = await run_one(sched, first_turn, 4)
        assert prev.finish.reuse.slot == 0
        h_busy = sched.submit(make_request(busy_prompt, 40))
        await wait_tokens(h_busy, 1)  # slot 1 decodes from now on; slot 0 holds the first turn
        n_routes = len(sink.routes)
        returning = first_turn + prev.tokens + text_ids(tok, " And then what happened to the keeper?", 8)
        h_cold = sched.submit(make_request(cold, 4))  # queued first
        h_ret = sched.submit(make_request(returning, 4))
        out_ret, out_cold = await collect(h_ret), await collect(h_cold)
        await collect(h_busy)
        await sched.check_integrity()
    # the returning turn was routed first (rewinding its slot), the cold prompt after it
    assert [r.reuse_source for r in sink.routes[n_routes:]] == [ReuseSource.REWIND, ReuseSource.NONE]
    assert (out_ret.finish.reuse.slot, out_ret.finish.reuse.reused_tokens) == (0, len(first_turn) + 3)
    assert out_ret.finish.reuse.prefilled_tokens == len(returning) - len(first_turn) - 3
    assert out_cold.finish.reuse.reused_tokens == 0
    assert out_ret.tokens == await cold_run(smollm2, returning, 4)
    assert out_cold.tokens == await cold_run(smollm2, cold, 4)


async def test_a_returning_turn_prefills_in_the_first_step_beside_an_earlier_cold_prompt(smollm2):
    """Both admitted in one step (two free slots), the cold 448-token prompt first: the returning
    turn's tail goes into the first step's prefill budget and it decodes beside the cold prompt's
    remaining segments."""
    make_pool, tok = smollm2
    pool = make_pool(2)
    first_turn = text_ids(tok, "User: describe the harbour at night.\n" + STORY, 200)
    cold = text_ids(tok, "Notes on bread: flour, water, salt and time. " + STORY[::-1], 7 * SEGMENT)
    async with real_scheduler(pool, tok, sched_config(), clock=ManualClock()) as sched:
        prev = await run_one(sched, first_turn, 4)
        returning = first_turn + prev.tokens + text_ids(tok, " Which boat came home last?", 8)
        tail = len(returning) - len(first_turn) - 3
        log = ForwardLog(pool)
        h_cold = sched.submit(make_request(cold, 4))
        h_ret = sched.submit(make_request(returning, 4))
        out_cold, out_ret = await collect(h_cold), await collect(h_ret)
        await sched.check_integrity()
    ret_slot, cold_slot = out_ret.finish.reuse.slot, out_cold.finish.reuse.slot
    assert out_ret.finish.reuse.reused_tokens == len(first_turn) + 3
    assert log.calls[0] == [(ret_slot, len(returning) - tail, tail), (cold_slot, 0, SEGMENT - tail)]
    ret_done, cold_done = (
        log.prefill_done_at(ret_slot, len(returning)),
        log.prefill_done_at(cold_slot, len(cold)),
    )
    assert ret_done == 0 and cold_done > ret_done + 3  # its 4 tokens came while the cold prompt prefilled
    assert out_ret.tokens == await cold_run(smollm2, returning, 4)
    assert out_cold.tokens == await cold_run(smollm2, cold, 4)
