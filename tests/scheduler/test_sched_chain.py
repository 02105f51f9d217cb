"""Tokens picked on the engine worker: every request's sampler but a grammar's runs on the worker
thread, right after the forward that produced its logits; the tokens equal the loop-side ones."""

from __future__ import annotations

import threading

import numpy as np
from sched_support import (
    N_VOCAB,
    collect,
    make_pool,
    make_request,
    make_scheduler,
    prompt_of,
    reference_greedy,
)
from slotserve.scheduler.request import SamplingParams
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
