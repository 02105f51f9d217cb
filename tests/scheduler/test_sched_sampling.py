"""Sampling: greedy, temperature, top-k, top-p, min-p, seeds, penalties."""

from __future__ import annotations

import numpy as np
import pytest
from slotserve.scheduler.request import SamplingParams
from slotserve.scheduler.sampling import Sampler, _top_p_ids, validate_params

V = 50


def logits(seed=0, n=V) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32) * 2


def draws(params: SamplingParams, row: np.ndarray, n: int) -> np.ndarray:
    s = Sampler(params, row.shape[0])
    return np.array([s.sample(row) for _ in range(n)])


def test_greedy_is_argmax_and_top_k_1_is_greedy_at_any_temperature():
    row = logits(1)
    assert set(draws(SamplingParams(temperature=0), row, 5)) == {int(np.argmax(row))}
    assert set(draws(SamplingParams(temperature=2.0, top_k=1, seed=3), row, 50)) == {int(np.argmax(row))}


def test_plain_greedy_takes_the_float32_argmax_fast_path_and_picks_what_the_full_path_picks():
    plain = Sampler(SamplingParams(temperature=0), V)
    full = Sampler(SamplingParams(temperature=0, logit_bias=((0, 0.0),)), V)  # a zero bias: full path
    assert plain.is_plain_greedy and not full.is_plain_greedy
    for extra in (dict(logprobs=0), dict(presence_penalty=0.5), dict(temperature=0.7)):
        assert not Sampler(SamplingParams(**{"temperature": 0, **extra}), V).is_plain_greedy
    rng = np.random.default_rng(7)
    for seed in range(200):
        row = logits(seed)
        if seed % 2:  # ties: both must keep the first of the equal best ids
            row[rng.integers(0, V, 3)] = row.max()
        assert plain.sample(row) == full.sample(row) == int(np.argmax(row.astype(np.float64)))


@pytest.mark.parametrize("min_p", [0.0, 0.1])
def test_a_tiny_temperature_is_greedy_not_an_overflow(min_p):
    # logits / 1e-320 overflow to inf; the draw must still be the argmax (and never raise)
    row = logits(2) * 20
    got = draws(SamplingParams(temperature=1e-320, min_p=min_p, top_p=0.9, seed=1), row, 5)
    assert set(got) == {int(np.argmax(row))}


def test_same_seed_same_tokens_other_seed_other_tokens():
    row = logits(2)
    a = draws(SamplingParams(temperature=1.0, seed=11), row, 40)
    b = draws(SamplingParams(temperature=1.0, seed=11), row, 40)
    c = draws(SamplingParams(temperature=1.0, seed=12), row, 40)
    assert (a == b).all() and not (a == c).all()


def test_temperature_sampling_follows_the_softmax():
    row = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    got = np.bincount(draws(SamplingParams(temperature=1.0, seed=5), row, 8000), minlength=4)
    p = np.exp(row - row.max())
    p /= p.sum()
    assert np.abs(got / 8000 - p).max() < 0.02


def test_top_k_top_p_min_p_only_draw_allowed_ids():
    row = logits(3)
    order = np.argsort(-row)
    got = set(draws(SamplingParams(temperature=1.5, top_k=5, seed=1), row, 500))
    assert got <= set(order[:5].tolist()) and len(got) > 1
    p = np.exp(row.astype(np.float64) - row.max())
    p /= p.sum()
    nucleus = order[: int(np.searchsorted(np.cumsum(p[order]), 0.8)) + 1]
    got = set(draws(SamplingParams(temperature=1.0, top_p=0.8, seed=2), row, 1000))
    assert got <= set(nucleus.tolist()) and len(got) > 1
    allowed = set(np.flatnonzero(p >= 0.05 * p.max()).tolist())
    assert 1 < len(allowed) < V
    got = set(draws(SamplingParams(temperature=1.0, min_p=0.05, seed=4), row, 1000))
    assert got <= allowed and len(got) > 1


def test_top_p_ids_fast_path_matches_full_sort():
    rng = np.random.default_rng(9)
    for peaked in (True, False):
        x = rng.standard_normal(49152) * (8 if peaked else 0.5)
        probs = np.exp(x - x.max())
        for top_p in (0.5, 0.9, 0.99):
            order = np.argsort(-probs, kind="stable")
            cum = np.cumsum(probs[order])
            want = set(order[: int(np.searchsorted(cum, top_p * probs.sum())) + 1].tolist())
            assert set(_top_p_ids(probs, top_p).tolist()) == want


def test_frequency_and_presence_penalties_discourage_repeats():
    row = np.zeros(V, dtype=np.float32)
    row[7], row[8] = 1.0, 0.9
    plain = draws(SamplingParams(temperature=0), row, 4)
    assert plain.tolist() == [7, 7, 7, 7]
    freq = draws(SamplingParams(temperature=0, frequency_penalty=0.5), row, 4)
    assert freq.tolist()[:2] == [7, 8]
    pres = draws(SamplingParams(temperature=0, presence_penalty=2.0), row, 3)
    assert pres.tolist()[:2] == [7, 8] and pres[2] not in (7, 8)


@pytest.mark.parametrize(
    "params, msg",
    [
        (SamplingParams(temperature=-1), "temperature"),
        (SamplingParams(top_k=-1), "top_k"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(min_p=2), "min_p"),
        (SamplingParams(max_tokens=0), "max_tokens"),
        (SamplingParams(presence_penalty=float("nan")), "presence_penalty"),
        (SamplingParams(frequency_penalty=float("-inf")), "frequency_penalty"),
        (SamplingParams(stop_token_ids=(V,)), "stop token id"),
        (SamplingParams(stop=("",)), "stop strings"),
    ],
)
def test_bad_parameters_are_rejected_with_the_fix(params, msg):
    with pytest.raises(ValueError, match=msg):
        validate_params(params, V)


# ---- logit_bias, logprobs, grammar masks


def test_logit_bias_shifts_and_minus_100_bans():
    row = logits(4)
    best = int(np.argmax(row))
    other = int(np.argsort(-row)[5])
    assert draws(SamplingParams(temperature=0, logit_bias=((other, 50.0),)), row, 1)[0] == other
    got = draws(SamplingParams(temperature=0, logit_bias=((best, -100.0),)), row, 1)[0]
    assert got == int(np.argsort(-row)[1])
    # a ban holds even against a logit far above the rest (a finite -100 would be outbid)
    huge = row.copy()
    huge[best] = 1e6
    banned = draws(SamplingParams(temperature=1.0, seed=1, logit_bias=((best, -100.0),)), huge, 200)
    assert best not in set(banned.tolist())


def test_logprobs_greedy_token_is_top_and_mass_at_most_one():
    row = logits(5)
    s = Sampler(SamplingParams(temperature=0, logprobs=5), V)
    tok = s.sample(row)
    lp = s.last_logprob
    assert lp is not None and lp.token_id == tok and lp.top[0][0] == tok
    assert lp.logprob == pytest.approx(lp.top[0][1])
    vals = [v for _, v in lp.top]
    assert vals == sorted(vals, reverse=True) and len(vals) == 5
    assert np.exp(vals).sum() <= 1.0 + 1e-9
    ref = row.astype(np.float64) - np.log(np.exp(row.astype(np.float64)).sum())
    assert lp.logprob == pytest.approx(ref[tok])


def test_logprobs_off_leaves_nothing():
    s = Sampler(SamplingParams(temperature=0), V)
    s.sample(logits(6))
    assert s.last_logprob is None


class _EvenThenOdd:
    """A toy grammar: even ids, then odd ids, alternating; records what it accepted."""

    def __init__(self):
        self.accepted: list[int] = []

    def start(self):
        return self

    def allowed(self):
        parity = len(self.accepted) % 2
        return np.arange(V) % 2 == parity

    def accept(self, token):
        assert self.allowed()[token]
        self.accepted.append(token)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_grammar_mask_restricts_every_draw_and_advances(temperature):
    g = _EvenThenOdd()
    s = Sampler(SamplingParams(temperature=temperature, seed=3, grammar=g, logprobs=3), V)
    got = [s.sample(logits(i)) for i in range(20)]
    assert [t % 2 for t in got] == [i % 2 for i in range(20)] and g.accepted == got
    # masked ids carry no probability: every top logprob is an allowed id
    assert all(t % 2 == 1 for t, _ in s.last_logprob.top)


def test_validate_params_rejects_bad_bias_logprobs_and_ignore_eos_with_grammar():
    with pytest.raises(ValueError, match="logit_bias"):
        validate_params(SamplingParams(logit_bias=((V, 1.0),)), V)
    with pytest.raises(ValueError, match="logprobs"):
        validate_params(SamplingParams(logprobs=21), V)
    with pytest.raises(ValueError, match="ignore_eos"):
        validate_params(SamplingParams(grammar=_EvenThenOdd(), ignore_eos=True), V)
