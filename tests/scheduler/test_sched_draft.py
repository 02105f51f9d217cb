"""The n-gram drafter, the cost gate and draft verification as pure functions."""

from __future__ import annotations

import numpy as np
import pytest
from slotserve.scheduler.draft import (
    PROBE_EVERY,
    CostModel,
    NgramPool,
    SpecState,
    choose_draft_len,
    ngram_draft,
)
from slotserve.scheduler.request import SamplingParams
from slotserve.scheduler.sampling import Sampler
from slotserve.scheduler.verify import verify_draft


def _brute_draft(h: list[int], max_len: int, nmax: int = 4, nmin: int = 2) -> list[int]:
    for n in range(min(nmax, len(h) - 1), nmin - 1, -1):
        key = h[-n:]
        for e in range(len(h) - 2, n - 2, -1):  # most recent first, e < len - 1
            if h[e - n + 1 : e + 1] == key:
                return h[e + 1 : e + 1 + max_len]
    return []


def test_draft_copies_what_followed_the_latest_match() -> None:
    h = np.array([5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 4, 1, 2, 3], dtype=np.int32)
    # the last 3-gram (1 2 3) occurs at 1..3 and 6..8: the latest wins
    assert ngram_draft(h, 4).tolist() == [7, 8, 4, 1]
    assert ngram_draft(h, 2).tolist() == [7, 8]
    assert ngram_draft(h, 0).tolist() == []


def test_draft_prefers_the_longer_suffix() -> None:
    # "2 3" occurs later (after 8) than "1 2 3", but the 3-gram match is preferred
    h = np.array([1, 2, 3, 40, 41, 8, 2, 3, 50, 1, 2, 3], dtype=np.int32)
    assert ngram_draft(h, 2).tolist() == [40, 41]


def test_no_draft_without_a_match_or_history() -> None:
    assert ngram_draft(np.arange(50, dtype=np.int32), 8).size == 0
    assert ngram_draft(np.array([1], dtype=np.int32), 8).size == 0
    assert ngram_draft(np.zeros(0, dtype=np.int32), 8).size == 0
    # a lone repeated token is a 1-gram: not enough (NGRAM_MIN = 2)
    assert ngram_draft(np.array([7, 1, 2, 7], dtype=np.int32), 8).size == 0


def test_draft_matches_brute_force_on_random_histories() -> None:
    rng = np.random.default_rng(0)
    found = 0
    for _ in range(400):
        n = int(rng.integers(1, 60))
        h = rng.integers(0, 4, size=n).astype(np.int32)
        want = _brute_draft(h.tolist(), 5)
        assert ngram_draft(h, 5).tolist() == want, h.tolist()
        found += bool(want)
    assert found > 100  # the property covered histories with matches


def test_repeated_pattern_drafts_its_own_continuation() -> None:
    h = np.array([3, 4, 5, 3, 4, 5, 3, 4], dtype=np.int32)
    assert ngram_draft(h, 5).tolist() == [5, 3, 4]


def test_shared_pool_drafts_from_other_histories() -> None:
    pool = NgramPool(capacity=100)
    pool.add(np.array([10, 11, 12, 13, 14, 15, 16], dtype=np.int32))
    assert pool.draft(np.array([1, 10, 11, 12, 13], dtype=np.int32), 2).tolist() == [14, 15]
    assert pool.draft(np.array([1, 2, 3, 4], dtype=np.int32), 2).size == 0
    small = NgramPool(capacity=3)
    small.add(np.arange(20, dtype=np.int32))
    assert len(small) == 3  # oldest n-grams dropped first
    assert small.draft(np.arange(17, dtype=np.int32), 3).tolist() == [17, 18, 19]
    assert small.draft(np.arange(5, dtype=np.int32), 3).size == 0


@pytest.mark.parametrize(
    ("acceptance", "price", "want"),
    [
        (0.9, 0.05, 8),
        (0.5, 0.05, 4),
        (0.5, 0.6, 0),
        (0.3, 0.05, 2),
        (0.0, 0.01, 0),
        (1.0, 0.5, 8),
        (0.8, 0.0, 8),
    ],
)
def test_choose_draft_len(acceptance: float, price: float, want: int) -> None:
    k = choose_draft_len(acceptance, price, available=8, draft_max=8)
    assert k == want
    # the k-th token pays and the (k+1)-th would not
    if 0 < k < 8:
        assert acceptance**k > price >= acceptance ** (k + 1)
    assert choose_draft_len(acceptance, price, available=2, draft_max=8) == min(want, 2)


def test_spec_state_tracks_acceptance_and_probes() -> None:
    s = SpecState()
    a0 = s.acceptance
    s.observe(4, 4)
    assert s.acceptance > a0
    for _ in range(10):
        s.observe(4, 0)
    assert s.acceptance < 0.25
    assert (s.num_drafted, s.num_accepted) == (44, 4)
    assert not s.probe_due()
    s.idle_steps = PROBE_EVERY
    assert s.probe_due()


def test_cost_model_prices_a_row_from_measured_steps() -> None:
    c = CostModel()
    assert c.row_price(1) == 0.0  # nothing measured: the first steps may draft
    for _ in range(20):
        c.observe(1, 1, 0.010)
        c.observe(1, 5, 0.012)  # 4 extra rows cost 2 ms
    assert c.row_price(1) == pytest.approx(0.05, rel=1e-6)
    for _ in range(20):
        c.observe(4, 4, 0.020)
    # one extra row (0.5 ms) against 4 tokens per 20 ms
    assert c.row_price(4) == pytest.approx(0.5e-3 * 4 / 0.020, rel=1e-6)


def _greedy_pick(row: np.ndarray) -> tuple[int, None]:
    return int(row.argmax()), None


def _rows_for(tokens: list[int], vocab: int = 16) -> np.ndarray:
    rows = np.zeros((len(tokens), vocab), dtype=np.float32)
    rows[np.arange(len(tokens)), tokens] = 1.0
    return rows


def test_verify_accepts_the_matching_prefix_and_emits_the_correction() -> None:
    never = lambda t, i: False  # noqa: E731
    v = verify_draft(_rows_for([4, 5, 9, 1]), np.array([4, 5, 6], dtype=np.int32), _greedy_pick, never)
    assert [t for t, _ in v.picks] == [4, 5, 9] and v.accepted == 2 and not v.ended
    assert v.rows_kept == 3  # last token + the two accepted draft tokens
    v = verify_draft(_rows_for([4, 5, 6, 1]), np.array([4, 5, 6], dtype=np.int32), _greedy_pick, never)
    assert [t for t, _ in v.picks] == [4, 5, 6, 1] and v.accepted == 3  # all + the bonus token
    v = verify_draft(_rows_for([2, 5, 6, 1]), np.array([4, 5, 6], dtype=np.int32), _greedy_pick, never)
    assert [t for t, _ in v.picks] == [2] and v.accepted == 0
    v = verify_draft(_rows_for([3]), np.zeros(0, dtype=np.int32), _greedy_pick, never)
    assert [t for t, _ in v.picks] == [3] and v.accepted == 0
    with pytest.raises(ValueError, match="logits rows"):
        verify_draft(_rows_for([3, 4]), np.zeros(0, dtype=np.int32), _greedy_pick, never)


def test_verify_stops_at_a_stop_rule_inside_an_accepted_draft() -> None:
    eos = 5
    v = verify_draft(
        _rows_for([4, 5, 6, 1]), np.array([4, 5, 6], dtype=np.int32), _greedy_pick, lambda t, i: t == eos
    )
    assert [t for t, _ in v.picks] == [4, 5] and v.ended and v.accepted == 2
    assert v.rows_kept == 2  # eos is not fed, as in plain decoding
    # max_tokens: the second emitted token is the last allowed
    v = verify_draft(
        _rows_for([4, 5, 6, 1]), np.array([4, 5, 6], dtype=np.int32), _greedy_pick, lambda t, i: i >= 1
    )
    assert [t for t, _ in v.picks] == [4, 5] and v.ended


def test_sampled_verification_equals_plain_sampling_with_the_same_seed() -> None:
    """At temperature > 0 a verification draws one number per emitted token from the request's
    generator, so a seeded request emits what it emits without drafting."""
    vocab = 6
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((5, vocab)).astype(np.float32)
    params = SamplingParams(temperature=1.3, seed=42, logprobs=2)
    plain = Sampler(params, vocab)
    spec = Sampler(params, vocab)
    draft_rng = np.random.default_rng(2)
    i = 0
    while i < rows.shape[0] - 1:
        k = min(int(draft_rng.integers(0, 4)), rows.shape[0] - 1 - i)
        draft = draft_rng.integers(0, vocab, size=k).astype(np.int32)
        v = verify_draft(
            rows[i : i + k + 1], draft, lambda r: (spec.sample(r), spec.last_logprob), lambda t, j: False
        )
        for tok, lp in v.picks:
            want = plain.sample(rows[i])
            assert tok == want and lp == plain.last_logprob
            i += 1
