"""Tokens picked on the engine worker, and decode chains (scheduler/chain.py).

Every request's sampler but a grammar's runs on the worker thread, right after the forward that
produced its logits. Plain decode steps chain on the worker: the tests pin where a chain ends
(max_tokens, eos, stop ids), what happens to a row the worker computed for a request the loop
had already ended (stop string), cancel and admission during a chain, and that chains engage."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from sched_support import (
    EOS,
    N_VOCAB,
    RecordingSink,
    collect,
    fake_token_bytes,
    make_config,
    make_pool,
    make_request,
    make_scheduler,
    prompt_of,
    reference_greedy,
    run_one,
    wait_tokens,
    wait_until,
)
from slotserve.scheduler.request import FinishReason, SamplingParams
from slotserve.scheduler.sampling import Sampler


class _Odd:
    """A toy grammar: odd ids only."""

    def start(self):
        return self

    def allowed(self):
        return np.arange(N_VOCAB) % 2 == 1

    def accept(self, token):
        assert token % 2 == 1


async def test_tokens_are_picked_on_the_worker_except_under_a_grammar(monkeypatch):
    threads: dict[str, set[str]] = {}
    sample = Sampler.sample

    def recording(self, logits):
        key = "grammar" if self.constraint is not None else "greedy" if self.is_plain_greedy else "sampled"
        threads.setdefault(key, set()).add(threading.current_thread().name)
        return sample(self, logits)

    monkeypatch.setattr(Sampler, "sample", recording)
    pool = make_pool(3, 512)
    sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=12, ignore_eos=True, logprobs=2)
    async with make_scheduler(pool) as sched:
        g = sched.submit(make_request(prompt_of(1, 20), 12))
        s = sched.submit(make_request(prompt_of(2, 20), params=sampled))
        c = sched.submit(
            make_request(
                prompt_of(3, 20), params=SamplingParams(temperature=0, max_tokens=12, grammar=_Odd())
            )
        )
        lps = []
        async for ev in s:
            lps.extend(getattr(ev, "logprobs", ()))
        greedy_out, grammar_out = await collect(g), await collect(c)
    assert threads == {
        "greedy": {"slotserve-engine"},
        "sampled": {"slotserve-engine"},
        "grammar": {"MainThread"},
    }
    assert greedy_out.tokens == reference_greedy(pool, prompt_of(1, 20), 12)
    assert all(t % 2 == 1 for t in grammar_out.tokens) and len(grammar_out.tokens) == 12
    # the worker's picks carry their logprobs to the events, and equal a loop-side sampler's
    ref = Sampler(sampled, N_VOCAB)
    seq = list(prompt_of(2, 20))
    assert len(lps) == 12
    for lp in lps:
        assert sample(ref, pool.reference_logits(seq)) == lp.token_id
        assert ref.last_logprob == lp
        seq.append(lp.token_id)


# ---- decode chains (scheduler/chain.py): the worker starts plain decode steps itself


class Gates:
    """A fake-engine forward hook holding the given forward calls (1-based) until released, and
    recording every batch as [(slot, n_tokens, start_pos)]."""

    def __init__(self, pool, *calls: int) -> None:
        self.calls = 0
        self.batches: list[list[tuple[int, int, int]]] = []
        self.reached = {c: threading.Event() for c in calls}
        self.release = {c: threading.Event() for c in calls}
        pool.forward_hook = self

    def __call__(self, batch) -> None:
        self.calls += 1
        self.batches.append([(it.slot, len(it.tokens), it.start_pos) for it in batch])
        if self.calls in self.reached:
            self.reached[self.calls].set()
            assert self.release[self.calls].wait(10), f"forward {self.calls} never released"

    async def wait_reached(self, call: int) -> None:
        assert await asyncio.to_thread(self.reached[call].wait, 10), f"forward {call} never reached"


def chained(sink) -> int:
    return sum(s.chained for s in sink.steps)


def discarded(sink) -> int:
    return sum(s.num_discarded_tokens for s in sink.steps)


async def test_a_lone_decode_chains_and_ends_exactly_at_max_tokens():
    pool = make_pool(1, 512)
    sink = RecordingSink()
    prompt = prompt_of(50, 20)
    async with make_scheduler(pool, stats_sink=sink) as sched:
        out = await run_one(sched, prompt, 30)
        await sched.check_integrity()
    assert out.finish.reason is FinishReason.LENGTH and out.finish.completion_tokens == 30
    assert out.tokens == reference_greedy(pool, prompt, 30)
    # forward 1 prefills, 2 feeds the first token (the loop plans it), the other 28 are chained
    assert pool.num_forward_calls == 30 and chained(sink) == 28 and discarded(sink) == 0
    assert sum(s.num_decode_tokens for s in sink.steps) == 29
    assert pool.slot_len(0) == 20 + 29  # the last token is never fed


async def test_chaining_can_be_turned_off():
    pool = make_pool(1, 512)
    sink = RecordingSink()
    async with make_scheduler(pool, make_config(decode_chain=False), stats_sink=sink) as sched:
        out = await run_one(sched, prompt_of(50, 20), 30)
    assert out.tokens == reference_greedy(pool, prompt_of(50, 20), 30)
    assert pool.num_forward_calls == 30 and chained(sink) == 0


async def test_eos_and_stop_token_ids_end_a_chain_without_extra_rows():
    pool = make_pool(2, 512)
    sink = RecordingSink()
    # a prompt whose greedy reply reaches eos well inside a chain (found, not hard-coded)
    eos_prompt, eos_at = next(
        (p, ref.index(EOS))
        for p, ref in ((p, reference_greedy(pool, p, 60)) for p in (prompt_of(s, 12) for s in range(2000)))
        if EOS in ref[6:]
    )
    other = prompt_of(7, 16)
    stop_id = reference_greedy(pool, other, 12)[9]
    first = reference_greedy(pool, other, 12).index(stop_id)
    async with make_scheduler(pool, stats_sink=sink) as sched:
        eos_out, stop_out = await asyncio.gather(
            run_one(sched, eos_prompt, 60, params=SamplingParams(temperature=0, max_tokens=60)),
            run_one(
                sched,
                other,
                12,
                params=SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop_id,)),
            ),
        )
        await sched.check_integrity()
    assert eos_out.finish.reason is FinishReason.STOP and eos_out.finish.completion_tokens == eos_at + 1
    assert eos_out.tokens == reference_greedy(pool, eos_prompt, eos_at)
    assert stop_out.finish.reason is FinishReason.STOP and stop_out.finish.completion_tokens == first + 1
    assert stop_out.tokens == reference_greedy(pool, other, first)
    assert chained(sink) > 0 and discarded(sink) == 0
    # neither slot holds the ending token: the worker did not feed it
    lens = sorted(pool.slot_len(s) for s in range(2))
    assert lens == sorted([12 + eos_at, 16 + first])


@pytest.mark.parametrize("window", [None, 8])
async def test_a_stop_string_found_after_the_worker_computed_the_next_step(window):
    """The loop matches a stop string in step m's token while the worker already runs step m+1
    (held there by the test): that row is discarded, the slot cut back to the request's own
    rows, and the next request reusing the slot is token-exact."""
    kw = {"window": window, "step_tokens": 1} if window else {}  # a ring with one slack row
    pool = make_pool(1, 512, **kw)
    prompt = prompt_of(60, 20)
    ref = reference_greedy(pool, prompt, 40)
    text = "".join(fake_token_bytes()[t].decode("latin-1") for t in ref)
    # a stop string that first completes with token m (1-based), deep inside the chain
    m, stop = next(
        (i + 1, text[i - 1 : i + 1])
        for i in range(8, 40)
        if ref[i - 1] >= 4
        and ref[i] >= 4
        and text[i - 1 : i + 1] not in text[:i]
        and all(t < 60 for t in ref[: i + 1])
    )
    gates = Gates(pool, m, m + 1)  # forward j computes the logits of token j
    sink = RecordingSink()
    params = SamplingParams(temperature=0, max_tokens=40, stop=(stop,))
    async with make_scheduler(pool, stats_sink=sink) as sched:
        h = sched.submit(make_request(prompt, params=params))
        await wait_tokens(h, m - 1)  # the loop applied step m-1 (and gave the worker its turn)
        await gates.wait_reached(m)
        gates.release[m].set()
        # block the loop thread until the worker is inside step m+1: the loop cannot apply
        # step m (and see the stop string) before the worker started the next step
        assert gates.reached[m + 1].wait(10)
        rest = await collect(h)
        assert rest.finish.reason is FinishReason.STOP and rest.finish.stop_sequence == stop
        assert rest.finish.completion_tokens == m
        gates.release[m + 1].set()
        live = 20 + m - 1  # the prompt and every generated token but the last
        await wait_until(lambda: discarded(sink) == 1)  # step m+1 applied: its row discarded
        await wait_until(lambda: pool.slot_len(0) == live)  # and cut off in the next plan
        await sched.check_integrity()
        assert discarded(sink) == 1 and chained(sink) > 0
        assert list(pool.record(0)) == prompt + ref[: m - 1]
        # the next request continues the same conversation from that slot, token-exact
        nxt = prompt + ref[: m - 1] + prompt_of(61, 5)
        warm = await run_one(sched, nxt, 10)
        assert warm.finish.reuse.reused_tokens == live
    assert warm.tokens == reference_greedy(pool, nxt, 10)


async def test_a_recurrent_slot_without_a_ring_ends_a_stop_string_on_the_requests_own_rows():
    """A recurrent slot cannot be cut back: a request with stop strings is not chained there,
    so the token that completed the stop string is never fed, and the next turn (the reply
    without it) extends the slot. Requests without stop strings still chain."""
    pool = make_pool(1, 512, recurrent=True)
    prompt = prompt_of(60, 20)
    ref = reference_greedy(pool, prompt, 40)
    text = "".join(fake_token_bytes()[t].decode("latin-1") for t in ref)
    m, stop = next(
        (i + 1, text[i - 1 : i + 1])
        for i in range(8, 40)
        if ref[i - 1] >= 4
        and ref[i] >= 4
        and text[i - 1 : i + 1] not in text[:i]
        and all(t < 60 for t in ref[: i + 1])
    )
    sink = RecordingSink()
    params = SamplingParams(temperature=0, max_tokens=40, stop=(stop,))
    async with make_scheduler(pool, stats_sink=sink) as sched:
        h = sched.submit(make_request(prompt, params=params))
        await wait_tokens(h, m - 1)
        # hold the loop thread: a chain would now run steps m and m + 1 on its own
        threading.Event().wait(0.5)
        rest = await collect(h)
        assert rest.finish.reason is FinishReason.STOP and rest.finish.completion_tokens == m
        await sched.check_integrity()
        assert chained(sink) == 0 and discarded(sink) == 0
        live = 20 + m - 1  # the prompt and every generated token but the last
        assert list(pool.record(0)) == prompt + ref[: m - 1]
        nxt = prompt + ref[: m - 1] + prompt_of(61, 5)
        warm = await run_one(sched, nxt, 10)
        assert warm.finish.reuse.reused_tokens == live
        assert chained(sink) > 0  # no stop strings: chained as on any pool
    assert warm.tokens == reference_greedy(pool, nxt, 10)


async def test_cancel_during_a_chain_is_acknowledged_and_the_slot_handed_on_exact():
    pool = make_pool(1, 512)
    sink = RecordingSink()
    prompt = prompt_of(70, 20)
    async with make_scheduler(pool, stats_sink=sink) as sched:
        h = sched.submit(make_request(prompt, 400))
        await wait_tokens(h, 10)
        assert await h.cancel() is True
        assert h.finish.reason is FinishReason.CANCELLED
        n = h.finish.completion_tokens
        await sched.check_integrity()
        assert pool.slot_len(0) == 20 + n - 1 and discarded(sink) == 0
        assert chained(sink) > 0 and n < 400
        gen = reference_greedy(pool, prompt, n)
        nxt = prompt + gen[: n - 1] + prompt_of(71, 4)
        warm = await run_one(sched, nxt, 8)
    assert warm.finish.reuse.reused_tokens == 20 + n - 1
    assert warm.tokens == reference_greedy(pool, nxt, 8)


async def test_an_admission_during_a_chain_is_scheduled_within_one_step():
    pool = make_pool(2, 1024)
    sink = RecordingSink()
    gates = Gates(pool)
    async with make_scheduler(pool, stats_sink=sink) as sched:
        a = sched.submit(make_request(prompt_of(80, 20), 300))
        await wait_tokens(a, 10)
        submitted_at = gates.calls  # forwards begun so far (one may be in flight)
        b = sched.submit(make_request(prompt_of(81, 30), 5))
        b_out = await collect(b)
        a_out = await collect(a)
    b_slot = b_out.finish.reuse.slot
    first_b = next(i for i, batch in enumerate(gates.batches) if any(s == b_slot for s, _, _ in batch))
    # the forward in flight at submit, at most one more chained decode, then b's prefill
    assert first_b + 1 <= submitted_at + 2
    assert chained(sink) > 0
    assert b_out.tokens == reference_greedy(pool, prompt_of(81, 30), 5)
    assert a_out.finish.completion_tokens == 300
