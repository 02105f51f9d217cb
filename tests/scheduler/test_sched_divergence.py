"""Why a prompt reused what it did (divergence.py): the eviction log, the reasons routing gives
(window, recurrent, busy), and the scheduler's report on the fake pool with reuse asserted."""

from __future__ import annotations

import numpy as np
from sched_support import make_config, make_pool, make_scheduler, prompt_of, run_one
from slotserve.scheduler.divergence import Evicted, EvictionLog, MissReason, explain
from slotserve.scheduler.policy import Capabilities, SlotCandidate, route


def arr(xs) -> np.ndarray:
    return np.asarray(list(xs), dtype=np.int32)


def test_eviction_log_finds_the_longest_prefix_and_forgets_the_oldest() -> None:
    log = EvictionLog(max_tokens=250)
    log.add(Evicted.SLOT, arr(range(100)))
    log.add(Evicted.CHECKPOINT, arr([*range(50), *range(500, 550)]))
    assert log.longest(arr([*range(80), 7])) == (80, Evicted.SLOT)
    assert log.longest(arr([*range(50), 500, 501])) == (52, Evicted.CHECKPOINT)
    log.add(Evicted.SLOT, arr(range(40)))  # a prefix of an entry: nothing new
    assert len(log) == 2 and log.num_tokens == 200
    log.add(Evicted.NOT_TAKEN, arr(range(1000, 1100)))  # 300 > 250: the oldest goes
    assert log.longest(arr(range(100)))[0] < 100 and len(log) == 2 and log.num_tokens == 200
    log.add(Evicted.SLOT, arr(range(1000, 1150)))  # covers the NOT_TAKEN entry: it is replaced
    assert log.longest(arr(range(1000, 1200))) == (150, Evicted.SLOT)
    assert log.num_tokens <= 250


def test_explain_orders_the_reasons() -> None:
    none = (0, None)
    assert (
        explain(prompt_len=10, reused_len=9, shared_len=10, refused_by=None, evicted=none).reason
        is MissReason.NONE
    )
    assert (
        explain(prompt_len=10, reused_len=0, shared_len=0, refused_by=None, evicted=none).reason
        is MissReason.COLD
    )
    d = explain(prompt_len=10, reused_len=3, shared_len=3, refused_by=None, evicted=none)
    assert d.reason is MissReason.PROMPT_CHANGED
    d = explain(
        prompt_len=10, reused_len=0, shared_len=6, refused_by=MissReason.RECURRENT, evicted=(8, Evicted.SLOT)
    )
    assert d.reason is MissReason.RECURRENT  # the live slot's own limit comes first
    d = explain(prompt_len=10, reused_len=3, shared_len=3, refused_by=None, evicted=(8, Evicted.NOT_TAKEN))
    assert (d.reason, d.evicted_len) == (MissReason.BUDGET, 8)
    d = explain(prompt_len=10, reused_len=0, shared_len=0, refused_by=None, evicted=none, reuse_enabled=False)
    assert d.reason is MissReason.REUSE_OFF


def test_route_says_which_state_refused_a_longer_prefix() -> None:
    conv = list(range(10, 300))
    prompt = arr([*conv[:200], 5, 6])
    ring = SlotCandidate(0, arr(conv), True, 1.0, min_truncate_len=250)  # a wrapped ring
    d = route(prompt, [ring])
    assert (d.reuse_len, d.shared_len, d.refused_by) == (0, 200, MissReason.WINDOW)
    recurrent = SlotCandidate(0, arr(conv), True, 1.0, min_truncate_len=len(conv))
    d = route(prompt, [recurrent])
    assert (d.reuse_len, d.shared_len, d.refused_by) == (0, 200, MissReason.RECURRENT)
    busy = SlotCandidate(1, arr(conv), False, 0.0)
    d = route(prompt, [SlotCandidate(0, arr([]), True, 1.0), busy], caps=Capabilities(can_copy=False))
    assert (d.reuse_len, d.shared_len, d.refused_by) == (0, 200, MissReason.BUSY)
    full = SlotCandidate(0, arr(conv), True, 1.0)
    d = route(prompt, [full])
    assert (d.reuse_len, d.shared_len, d.refused_by) == (200, 200, None)


async def test_scheduler_reports_prompt_changes_evictions_and_recurrent_limits() -> None:
    pool = make_pool(num_slots=1, ctx_len=1024)
    async with make_scheduler(pool, make_config()) as sched:
        a = prompt_of(1, 300)
        out = await run_one(sched, a, max_tokens=2)
        assert out.finish.reuse.divergence.reason is MissReason.COLD
        edited = [*a[:120], 7, *a[121:]]
        out = await run_one(sched, edited, max_tokens=2)
        d = out.finish.reuse.divergence
        assert (d.reason, d.shared_len, out.finish.reuse.reused_tokens) == (
            MissReason.PROMPT_CHANGED,
            120,
            120,
        )
        b = prompt_of(2, 200)
        await run_one(sched, b, max_tokens=2)  # overwrites the only slot; no checkpoint budget
        out = await run_one(sched, a, max_tokens=2)
        d = out.finish.reuse.divergence
        assert d.reason is MissReason.EVICTED and d.evicted_len >= 300 and out.finish.reuse.reused_tokens == 0
        assert sched.slots()[0].last_divergence == d


async def test_recurrent_pool_reports_its_state_as_the_limit() -> None:
    pool = make_pool(num_slots=1, ctx_len=1024, recurrent=True)
    async with make_scheduler(pool, make_config()) as sched:
        a = prompt_of(3, 200)
        await run_one(sched, a, max_tokens=2)
        out = await run_one(sched, [*a[:100], 9, 9, 9], max_tokens=2)
        d = out.finish.reuse.divergence
        assert (d.reason, d.shared_len, out.finish.reuse.reused_tokens) == (MissReason.RECURRENT, 100, 0)


def test_session_affinity_breaks_ties_and_weights_evictions_only() -> None:
    from slotserve.scheduler.policy import Affinity

    system = list(range(10, 110))
    a = SlotCandidate(0, arr([*system, 1, 2, 3]), True, 5.0, affinity=Affinity.OTHER)
    b = SlotCandidate(1, arr([*system, 4, 5, 6]), True, 5.0, affinity=Affinity.SAME)
    prompt = arr([*system, 9, 9])
    d = route(prompt, [a, b])
    assert (d.dest, d.reuse_len) == (1, 100)  # equal supply: the session's own slot
    d = route(prompt, [SlotCandidate(0, a.tokens, True, 5.0), SlotCandidate(1, b.tokens, True, 5.0)])
    assert d.dest == 0  # without keys: the lower slot number
    # a longer match in another session's slot still wins: affinity never costs reuse
    longer = SlotCandidate(0, arr([*system, 9, 9, 9]), True, 5.0, affinity=Affinity.OTHER)
    d = route(prompt, [longer, b])
    assert (d.dest, d.reuse_len) == (0, 101)
    # eviction weight: a cold prompt overwrites the anonymous slot, not another session's
    other = SlotCandidate(0, arr(range(500, 700)), True, 5.0, affinity=Affinity.OTHER)
    anon = SlotCandidate(1, arr(range(800, 1100)), True, 5.0)
    d = route(arr(range(2000, 2010)), [other, anon])
    assert d.dest == 1  # 300 anonymous tokens lost rather than 200 (x 2) of a named session
    plain = SlotCandidate(0, other.tokens, True, 5.0)
    assert route(arr(range(2000, 2010)), [plain, anon]).dest == 0  # unweighted: the smaller loss
