"""RequestTable (the queue and the running table) and Admission's returned result, without a loop:
admission moves requests only through the table and reports what it did (`Admitted`) instead of
calling back into the scheduler."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest
from sched_support import fake_token_bytes, greedy, make_config
from slotserve.scheduler.admission import Admission
from slotserve.scheduler.checkpoint_policy import CheckpointPolicy
from slotserve.scheduler.detok import Detokenizer
from slotserve.scheduler.policy import Capabilities, RouteAction
from slotserve.scheduler.prefill_order import AgingRate
from slotserve.scheduler.request import GenerationRequest, ReuseSource
from slotserve.scheduler.request_table import RequestTable
from slotserve.scheduler.sampling import Sampler
from slotserve.scheduler.sequence import Phase, Sequence
from slotserve.scheduler.slot_table import SlotTable
from slotserve.scheduler.stats import Preemption, RouteStats
from slotserve.scheduler.step import StepPlan

N_VOCAB = 64
_order = itertools.count()


def seq(prompt: list[int], priority: int = 0, admitted_at: float = 0.0) -> Sequence:
    req = GenerationRequest(prompt_ids=prompt, params=greedy(4), priority=priority)
    req.request_id = f"r{next(_order)}"
    return Sequence(
        req=req,
        prompt=np.asarray(prompt, dtype=np.int32),
        order=next(_order),
        admitted_at=admitted_at,
        deadline=None,
        sampler=Sampler(req.params, N_VOCAB),
        detok=Detokenizer(fake_token_bytes(N_VOCAB), ()),
        events=asyncio.Queue(),
    )


def setup(num_slots: int = 2, **config_kw: object) -> tuple[RequestTable, SlotTable, Admission]:
    config = make_config(**config_kw)
    slots = SlotTable(num_slots, 256)
    table = RequestTable(slots)
    ckpt = CheckpointPolicy(
        config, can_snapshot=False, fingerprint="test", snapshot_nbytes=lambda n: n, emit=lambda *a: None
    )
    admission = Admission(
        config,
        table=table,
        slots=slots,
        checkpoints=ckpt,
        caps=Capabilities(can_copy=True, can_snapshot=False),
        aging=AgingRate(config.prefill_aging_tokens_per_s),
        restored_floor=lambda n: 0,
    )
    return table, slots, admission


def test_table_queues_by_priority_then_order_and_moves_requests_one_way_at_a_time():
    table, slots, _ = setup()
    a, b, c = seq([5, 6]), seq([7, 8], priority=1), seq([9, 10])
    for s in (a, b, c):
        table.enqueue(s)
    assert table.queue == [b, a, c] and all(s.phase is Phase.QUEUED for s in table.queue)
    table.assign(a, 1)
    assert table.queue == [b, c] and table.lookup(1) is a and a.slot == 1 and table.num_running == 1
    with pytest.raises(AssertionError):
        table.assign(c, 1)  # a slot holds one request
    a.pending_token = 42
    assert not table.release(c, 3.0)  # c holds no slot
    assert table.release(a, 5.0) and a.pending_token is None
    assert table.lookup(1) is None and slots.last_used[1] == 5.0
    assert not table.release(a, 6.0) and slots.last_used[1] == 5.0  # released once
    table.remove_queued(c)
    assert table.queue == [b] and table.all() == [b]
    table.check_integrity()


def test_admission_returns_its_routes_and_events_and_moves_requests_through_the_table():
    table, slots, admission = setup(num_slots=2)
    slots.assign(0, np.arange(4, 44, dtype=np.int32), 0)  # slot 0 holds a 40-token conversation
    warm, cold = seq(list(range(4, 44)) + [50, 51]), seq([60, 61, 62, 63] * 5)
    table.enqueue(warm)
    table.enqueue(cold)
    plan = StepPlan()
    out = admission.admit(plan, now=1.0)
    assert [(s, d.action) for s, d in out.routed] == [(warm, RouteAction.REWIND), (cold, RouteAction.COLD)]
    assert [d.dest for _, d in out.routed] == [0, 1]
    assert out.events == [
        RouteStats(ReuseSource.REWIND, 40, False, 0, None),
        RouteStats(ReuseSource.NONE, 0, False, 0, None),
    ]
    assert warm.num_computed == 40 and warm.reuse is not None and warm.reuse.reused_tokens == 40
    assert not out.preempted and not out.disk_loads
    assert table.num_queued == 0 and table.lookup(0) is warm and table.lookup(1) is cold
    assert all(s.phase is Phase.PREFILL for s in (warm, cold))


def test_admission_preempts_through_the_table_and_reports_it():
    table, _, admission = setup(num_slots=1)
    low = seq([4, 5, 6, 7] * 10, priority=0)
    table.enqueue(low)
    admission.admit(StepPlan(), now=1.0)
    assert table.lookup(0) is low
    high = seq([8, 9, 10, 11] * 10, priority=5)
    table.enqueue(high)
    out = admission.admit(StepPlan(), now=2.0)
    assert out.preempted == [low] and low.phase is Phase.QUEUED and table.queue == [low]
    assert table.lookup(0) is high and [s for s, _ in out.routed] == [high]
    assert out.events[0] == Preemption() and isinstance(out.events[1], RouteStats)
    assert admission.num_preemptions == 1
