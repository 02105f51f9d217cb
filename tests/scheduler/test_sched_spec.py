"""Speculative decoding in the scheduler (draft.py, verify.py, batch.py, apply.py, chain.py) on
the fake pool with an induction head (`copy_bias`: generated text copies the prompt, as agent
output does, and one position in five departs from it, so drafts are both accepted and
rejected): full KV, a sliding-window ring, and a recurrent state cut back through its rollback
ring.

Every test compares against the same run without drafting and asserts that drafts were
verified and accepted (a drafter that never fires fails)."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
from sched_support import (
    N_VOCAB,
    RecordingSink,
    collect,
    make_config,
    make_request,
    make_scheduler,
    prompt_of,
    reference_greedy,
)
from slotserve.scheduler.draft import ngram_draft
from slotserve.scheduler.fake_engine import FakeSlotPool
from slotserve.scheduler.request import FinishReason, ReuseSource, SamplingParams
from slotserve.scheduler.scheduler import Scheduler

COPY = 12.0
LAYOUTS = {
    "full": {},
    "ring": {"window": 8, "step_tokens": 16},
    # a recurrent state with a rollback ring of 7 states: drafts of up to 6 tokens (scheduler.py)
    "recurrent": {"recurrent": True, "rollback": 7},
    # 13 states: also a stop string inside one step's accepted draft (6 rows) plus the whole
    # chained step after it (7), which the trim must take back too (chain.py)
    "recurrent-deep": {"recurrent": True, "rollback": 13},
}


def copy_pool(num_slots: int = 2, ctx_len: int = 512, n_vocab: int = N_VOCAB, **kw) -> FakeSlotPool:
    return FakeSlotPool(num_slots, ctx_len, n_vocab, copy_bias=COPY, **kw)


def spec_config(draft_max: int | None = 6, **kw):
    return make_config(draft_max=draft_max, spec_cost_gate=False, **kw)


def code_prompt(seed: int, n: int = 60, n_vocab: int = N_VOCAB) -> list[int]:
    """A prompt that repeats a block (as a file sent back with an edit would)."""
    block = prompt_of(seed, n // 2, n_vocab)
    return block + block[: n // 3] + prompt_of(seed + 100, n - n // 2 - n // 3, n_vocab)


async def run_all(pool, config, reqs, sink=None):
    async with make_scheduler(pool, config, stats_sink=sink) as sched:
        outs = await asyncio.gather(*(collect(sched.submit(r)) for r in reqs))
        await sched.check_integrity()
    return outs


def assert_drafted(outs) -> None:
    drafted = sum(o.finish.drafted_tokens for o in outs)
    accepted = sum(o.finish.accepted_tokens for o in outs)
    assert drafted > 0 and 0 < accepted < drafted, (drafted, accepted)


@pytest.mark.parametrize("chain", [True, False])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
async def test_greedy_speculative_equals_plain(chain, layout):
    kw = LAYOUTS[layout]
    prompts = [code_prompt(s) for s in range(4)]
    reqs = lambda: [make_request(p, 40) for p in prompts]  # noqa: E731
    plain = await run_all(copy_pool(4, **kw), make_config(decode_chain=chain), reqs())
    sink = RecordingSink()
    spec = await run_all(
        copy_pool(4, **kw), spec_config(decode_chain=chain, step_token_budget=16), reqs(), sink
    )
    ref = copy_pool(1, **kw)
    for p, a, b in zip(prompts, plain, spec):
        assert a.tokens == b.tokens == reference_greedy(ref, p, 40)
        assert a.text == b.text and b.finish.reason is FinishReason.LENGTH
    assert_drafted(spec)
    assert sum(s.num_drafted_tokens for s in sink.steps) == sum(o.finish.drafted_tokens for o in spec)
    assert sum(s.num_accepted_tokens for s in sink.steps) == sum(o.finish.accepted_tokens for o in spec)
    if chain:
        assert any(s.chained and s.num_drafted_tokens for s in sink.steps)  # chains carry drafts


@pytest.mark.parametrize("layout", ["full", "recurrent"])
async def test_speculative_across_rewinds_and_restores(layout):
    """A second turn rewinds the first's slot (a recurrent one extends it: its record is a
    prefix of the second prompt), a third restores a checkpoint (with no rollback history: a
    restored recurrent slot holds one state): every turn's tokens equal a cold run's, with
    drafts accepted."""
    pool = copy_pool(1, 1024, **LAYOUTS[layout])
    config = spec_config(checkpoint_memory_mb=64)
    first = code_prompt(1, 80)
    outs = []
    async with make_scheduler(pool, config) as sched:
        a = await collect(sched.submit(make_request(first, 30)))
        second = first + a.tokens + prompt_of(7, 10)
        b = await collect(sched.submit(make_request(second, 30)))
        other = await collect(sched.submit(make_request(code_prompt(9, 70), 20)))  # evicts the slot
        third = first + prompt_of(8, 6)
        c = await collect(sched.submit(make_request(third, 30)))
        outs = [a, b, other, c]
        await sched.check_integrity()
    assert b.finish.reuse.source is ReuseSource.REWIND
    assert c.finish.reuse.source is ReuseSource.CHECKPOINT_MEMORY
    ref = copy_pool(1, 1024, **LAYOUTS[layout])
    for prompt, out, n in ((first, a, 30), (second, b, 30), (third, c, 30)):
        assert out.tokens == reference_greedy(ref, prompt, n)
    assert_drafted(outs)


@pytest.mark.parametrize("layout", ["full", "recurrent"])
async def test_sampled_speculative_equals_plain_with_the_same_seed(layout):
    """Temperature > 0: one random number per emitted token from the request's generator, so
    a seeded request emits the same tokens, logprobs included, with or without drafting."""
    params = [
        SamplingParams(temperature=0.7, top_p=0.95, seed=s, max_tokens=40, ignore_eos=True, logprobs=3)
        for s in range(4)
    ]
    prompts = [code_prompt(s + 10) for s in range(4)]

    async def tokens_and_logprobs(config):
        async with make_scheduler(copy_pool(4, **LAYOUTS[layout]), config) as sched:
            out = []
            for p, sp in zip(prompts, params):
                h = sched.submit(make_request(p, params=sp))
                toks, lps = [], []
                async for ev in h:
                    toks.extend(getattr(ev, "token_ids", ()))
                    lps.extend(getattr(ev, "logprobs", ()))
                    fin = ev
                out.append((toks, lps, fin))
            return out

    plain = await tokens_and_logprobs(make_config())
    spec = await tokens_and_logprobs(spec_config())
    for (ta, la, _), (tb, lb, _) in zip(plain, spec):
        assert ta == tb and la == lb and len(ta) == 40
    assert sum(f.drafted_tokens for *_, f in spec) > 0
    assert sum(f.accepted_tokens for *_, f in spec) > 0


def _chi_square_same(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample chi-square statistic and its degrees of freedom on count vectors a, b."""
    keep = (a + b) > 0
    a, b = a[keep].astype(float), b[keep].astype(float)
    na, nb = a.sum(), b.sum()
    stat = 0.0
    for x, y in zip(a, b):
        ea, eb = (x + y) * na / (na + nb), (x + y) * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    return stat, int(keep.sum()) - 1


async def test_sampled_distribution_is_unchanged_over_many_seeds():
    """Tiny vocabulary (8 ids): token frequencies at each of the first positions, sampled with
    drafting under seeds 0..N-1 and without under seeds N..2N-1, agree (chi-square, p > 1e-4)."""
    vocab, n, steps = 8, 300, 6
    prompt = [5, 6, 7, 4, 5, 6, 7, 4, 5, 6]

    async def counts(config, seeds):
        c = np.zeros((steps, vocab), dtype=np.int64)
        drafted = 0
        pool = FakeSlotPool(4, 256, vocab, copy_bias=2.0)
        table = [bytes([97 + i]) for i in range(vocab)]
        async with Scheduler(pool, config, token_bytes=table, eos_token_ids={0}) as sched:
            for s in seeds:
                sp = SamplingParams(temperature=1.0, seed=int(s), max_tokens=steps, ignore_eos=True)
                out = await collect(sched.submit(make_request(prompt, params=sp)))
                for i, t in enumerate(out.tokens):
                    c[i, t] += 1
                drafted += out.finish.accepted_tokens
        return c, drafted

    spec, accepted = await counts(spec_config(draft_max=4), range(n))
    plain, _ = await counts(make_config(), range(n, 2 * n))
    assert accepted > 0
    # chi-square critical values at p = 1e-4 for 1..7 degrees of freedom
    crit = {1: 15.14, 2: 18.42, 3: 21.11, 4: 23.51, 5: 25.74, 6: 27.86, 7: 29.88}
    for i in range(steps):
        stat, dof = _chi_square_same(spec[i], plain[i])
        assert dof == 0 or stat < crit[dof], (i, stat, dof, spec[i], plain[i])
    # and the test can fail: a biased sampler (always the draft's token when drafted) is caught
    biased = plain.copy()
    biased[2] = 0
    biased[2, 5] = n
    stat, dof = _chi_square_same(spec[2], biased[2])
    assert math.isfinite(stat) and stat > crit.get(dof, 30.0)


class _Odd:
    """A toy grammar: odd ids only (its allowed() checks every draft token)."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def start(self):
        return self

    def allowed(self):
        return np.arange(N_VOCAB) % 2 == 1

    def accept(self, token):
        assert token % 2 == 1
        self.seen.append(token)


async def test_grammar_rows_check_each_draft_token():
    odd_prompt = [t | 1 for t in code_prompt(3)]
    g1, g2 = _Odd(), _Odd()
    p = lambda g: SamplingParams(temperature=0, max_tokens=30, grammar=g)  # noqa: E731
    (plain,) = await run_all(copy_pool(), make_config(), [make_request(odd_prompt, params=p(g1))])
    (spec,) = await run_all(copy_pool(), spec_config(), [make_request(odd_prompt, params=p(g2))])
    assert plain.tokens == spec.tokens == g2.seen and all(t % 2 for t in spec.tokens)
    assert_drafted([spec])


def _text(toks) -> str:
    return "".join(chr(97 + (t - 4) % 26) if 4 <= t < 60 else "" for t in toks)


def _copied_span(prompt, toks) -> int | None:
    """An index j where the output copies its history for 4 tokens (a draft there is accepted)
    and the text of toks[j:j+3] first appears there; None if there is none."""
    for j in range(3, len(toks) - 5):
        d = ngram_draft(np.array(prompt + toks[: j - 1], dtype=np.int32), 6).tolist()
        s = _text(toks[j : j + 3])
        if d[:4] == toks[j - 1 : j + 3] and len(s) == 3 and _text(toks).find(s) == len(_text(toks[:j])):
            return j
    return None


@pytest.mark.parametrize("layout", ["full", "recurrent-deep"])
@pytest.mark.parametrize("where", ["stop_string", "eos", "max_tokens"])
async def test_stop_rules_inside_an_accepted_draft(where, layout):
    """A stop string, eos or max_tokens that falls inside an accepted draft ends the request at
    the same token as plain decoding, and the slot keeps only the rows plain decoding fed (a
    recurrent slot is cut back through its rollback ring, here one deep enough for a stop
    string found a chained step late; with draft_max + 1 states such a slot keeps those exact
    extra rows instead, as check_integrity sees)."""
    prompts = [code_prompt(s, 80) for s in range(3)]
    ref = copy_pool(1, **LAYOUTS[layout])
    greedy_out = [reference_greedy(ref, pr, 60) for pr in prompts]
    if where == "stop_string":
        assert any(_copied_span(p, t) is not None for p, t in zip(prompts, greedy_out))

    def reqs():
        out = []
        for i, toks in enumerate(greedy_out):
            if where == "stop_string":
                j = _copied_span(prompts[i], toks)
                stop = (_text(toks[j : j + 3]) if j is not None else _text(toks[40:42]),)
                sp = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True, stop=stop)
            elif where == "eos":
                sp = SamplingParams(temperature=0, max_tokens=60, stop_token_ids=(toks[45],))
            else:
                sp = SamplingParams(temperature=0, max_tokens=43, ignore_eos=True)
            out.append(make_request(prompts[i], params=sp))
        return out

    plain_pool, spec_pool = copy_pool(3, **LAYOUTS[layout]), copy_pool(3, **LAYOUTS[layout])
    plain = await run_all(plain_pool, make_config(), reqs())
    spec = await run_all(spec_pool, spec_config(), reqs())
    for a, b in zip(plain, spec):
        assert a.tokens == b.tokens and a.text == b.text and a.finish.reason == b.finish.reason
    assert_drafted(spec)
    for s in range(3):  # both pools' slots hold the same rows once the trims ran
        async with make_scheduler(spec_pool, make_config()) as sched:
            await sched.check_integrity()
        assert np.array_equal(plain_pool.record(s), spec_pool.record(s)), s


async def test_per_request_opt_out_and_off_by_default():
    prompt = code_prompt(4)
    (off,) = await run_all(copy_pool(), make_config(), [make_request(prompt, 30)])
    (opted_out,) = await run_all(copy_pool(), spec_config(), [make_request(prompt, 30, speculative=False)])
    (on,) = await run_all(copy_pool(), spec_config(), [make_request(prompt, 30)])
    assert off.tokens == opted_out.tokens == on.tokens
    assert off.finish.drafted_tokens == opted_out.finish.drafted_tokens == 0
    assert_drafted([on])


async def test_cost_gate_stops_drafting_when_drafts_are_wrong():
    """Without an induction head drafts are seldom right: the gate shrinks them to (almost)
    nothing, and the output is unchanged."""
    prompt = code_prompt(5, 100)
    (plain,) = await run_all(FakeSlotPool(1, 512, N_VOCAB), make_config(), [make_request(prompt, 120)])
    config = make_config(draft_max=6)
    (spec,) = await run_all(FakeSlotPool(1, 512, N_VOCAB), config, [make_request(prompt, 120)])
    (copying,) = await run_all(copy_pool(1), config, [make_request(prompt, 120)])
    assert plain.tokens == spec.tokens
    # rows verified per generated token: a copying conversation keeps drafting long drafts
    assert spec.finish.drafted_tokens < 0.5 * copying.finish.drafted_tokens
    assert copying.finish.accepted_tokens > 0


@pytest.mark.parametrize("layout", ["full", "recurrent"])
async def test_cancel_between_draft_and_verification_leaves_no_rejected_rows(layout):
    """Cancels land while drafted steps are in flight: every slot's record is a prefix of its
    prompt + emitted tokens (a rejected draft token would differ), mirror == pool."""
    pool = copy_pool(4, 1024, **LAYOUTS[layout])
    prompts = [code_prompt(s, 100) for s in range(8)]
    async with make_scheduler(pool, spec_config(decode_chain=True)) as sched:
        handles = [sched.submit(make_request(p, 200)) for p in prompts]
        emitted: dict[int, list[int]] = {i: [] for i in range(8)}

        async def consume(i, h, cancel_after):
            async for ev in h:
                emitted[i].extend(getattr(ev, "token_ids", ()))
                if len(emitted[i]) >= cancel_after:
                    await h.cancel()
            return h

        await asyncio.gather(*(consume(i, h, 5 + 7 * i) for i, h in enumerate(handles)))
        await sched.check_integrity()
        drafted = sum(h._seq.finish.drafted_tokens for h in handles if h._seq.finish)
    assert drafted > 0
    for s in range(4):
        rec = [int(t) for t in pool.record(s)]
        assert any(rec == (p + emitted[i])[: len(rec)] for i, p in enumerate(prompts)), s


@pytest.mark.parametrize("rollback", [0, 1, 3])
async def test_recurrent_drafts_stay_within_the_rollback_ring(rollback):
    """A recurrent pool drafts at most rollback - 1 tokens a step (so a rejected draft, or a
    whole step a chain ran past its request, can be cut back), none with fewer than 2 states;
    the output is plain decoding's either way."""
    kw = {"recurrent": True, "rollback": rollback}
    prompts = [code_prompt(s) for s in range(2)]
    reqs = lambda: [make_request(p, 40) for p in prompts]  # noqa: E731
    plain = await run_all(copy_pool(2, **kw), make_config(), reqs())
    pool = copy_pool(2, **kw)
    rows: list[int] = []  # logits rows of each item: a drafted decode asks for 1 + its draft
    pool.forward_hook = lambda batch: rows.extend(int(it.want_logits) for it in batch)
    spec = await run_all(pool, spec_config(draft_max=6), reqs())
    assert [o.tokens for o in plain] == [o.tokens for o in spec]
    if rollback < 2:
        assert sum(o.finish.drafted_tokens for o in spec) == 0 and max(rows) == 1
        return
    assert_drafted(spec)
    assert max(rows) == rollback  # drafts of rollback - 1 tokens, never longer
