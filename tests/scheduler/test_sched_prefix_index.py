"""PrefixIndex (scheduler/prefix_index.py): its three queries against brute force on random
token sets, and the checkpoint stores finding entries that share fewer than 32 tokens (the old
head-hash lookup's blind spot) with a prompt, or a prompt shorter than that."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from slotserve.scheduler import checkpoint_store as ck
from slotserve.scheduler.checkpoint_store import CaptureRule, MemoryCheckpointStore
from slotserve.scheduler.disk_store import DiskCheckpointStore
from slotserve.scheduler.prefix import common_prefix_len
from slotserve.scheduler.prefix_index import PrefixIndex

# Small alphabets and lengths around the 32-token head, so entries share prefixes of every length.
seqs = st.lists(st.integers(0, 2), min_size=1, max_size=40).map(lambda x: np.asarray(x, np.int32))


@settings(max_examples=150, deadline=None)
@given(entries=st.lists(seqs, max_size=30), queries=st.lists(seqs, min_size=1, max_size=5), drop=st.data())
def test_queries_equal_brute_force(entries, queries, drop):
    index, kept = PrefixIndex(), {}
    for t in entries:
        key = ck.tokens_key(t)
        if key not in kept:
            index.add(key, t)
            kept[key] = t
    for key in drop.draw(st.lists(st.sampled_from(sorted(kept)), unique=True)) if kept else []:
        assert index.remove(key)
        del kept[key]
    index.check_integrity()
    for q in queries:
        got = list(index.sharing(q))
        commons = [c for _, c in got]
        assert commons == sorted(commons, reverse=True)  # best first
        assert dict(got) == {k: common_prefix_len(q, t) for k, t in kept.items()}
        starts = {k for k, t in kept.items() if common_prefix_len(q, t) == len(q)}
        assert set(index.starting_with(q)) == starts
        prefixes = {k for k, t in kept.items() if len(t) <= len(q) and common_prefix_len(q, t) == len(t)}
        assert set(index.prefixes_of(q)) == prefixes


def toks(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, n).astype(np.int32)


def short_prefix_cases() -> list[tuple[np.ndarray, np.ndarray, int]]:
    """(checkpoint tokens, prompt, common prefix): every one shares fewer than 32 tokens."""
    head = toks(1, 20)
    return [
        (np.concatenate([head, toks(2, 60)]), np.concatenate([head, toks(3, 40)]), 20),  # diverge at 20
        (toks(4, 60), toks(4, 60)[:25], 25),  # prompt shorter than 32, a prefix of the entry
        (head[:12], np.concatenate([head, toks(5, 30)]), 12),  # a short entry, whole prefix
    ]


def test_memory_store_finds_checkpoints_sharing_fewer_than_32_tokens():
    for tokens, prompt, common in short_prefix_cases():
        store = MemoryCheckpointStore(1 << 20)
        store.insert(toks(9, 80), bytes(10), CaptureRule.EVICT)  # shares nothing
        store.insert(tokens, bytes(10), CaptureRule.EVICT)
        m = store.find(prompt)
        assert m is not None and (m.key, m.num_tokens) == (ck.tokens_key(tokens), len(tokens))
        assert m.common == common
        assert store.covering(prompt[: min(common, 5)]) is not None  # short tokens: no scan needed
        store.check_integrity()


def test_disk_store_finds_checkpoints_sharing_fewer_than_32_tokens(tmp_path):
    d = DiskCheckpointStore(tmp_path, 1 << 20, "fp-short")
    d.start()
    assert d.index_ready.wait(5)
    cases = short_prefix_cases()
    for i, (tokens, _, _) in enumerate(cases):
        d.put(tokens if i != 2 else toks(8, 50), bytes(10), "evict")  # case 2's short entry: below
    d.flush()
    for tokens, prompt, common in cases[:2]:
        m = d.find(prompt)
        assert m is not None and (m.key, m.common) == (ck.tokens_key(tokens), common)
    d.close()


def test_find_skips_the_many_entries_that_share_only_a_header(monkeypatch):
    """A thousand entries that share their first 4 tokens (a chat header) with the prompt, one
    that shares 40: find compares the prompt with a handful of them, not all."""
    header = np.asarray([7, 8, 9, 10], np.int32)
    store = MemoryCheckpointStore(1 << 30)
    for i in range(1000):
        store.insert(np.concatenate([header, toks(100 + i, 30)]), bytes(1), CaptureRule.EVICT)
    conv = np.concatenate([header, toks(1, 36)])
    store.insert(conv, bytes(1), CaptureRule.HINT)
    calls = []
    real = ck.usable_len

    def counting(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(ck, "usable_len", counting)
    m = store.find(np.concatenate([conv, toks(2, 10)]))
    assert m is not None and (m.key, m.common) == (ck.tokens_key(conv), 40)
    assert len(calls) == 1  # the best alone: every other entry shares 4 < 40 tokens


def test_find_with_least_skips_header_sharers_even_when_a_ring_makes_them_unusable(monkeypatch):
    """Ring KV: an entry longer than what it shares cannot be cut back (floor n), so no entry
    sharing only the 4-token header supplies anything; with least=64 (the routing floor) find
    stops at once instead of comparing the prompt with all of them."""
    header = np.asarray([7, 8, 9, 10], np.int32)
    store = MemoryCheckpointStore(1 << 30, restored_floor=lambda n: n)
    for i in range(300):
        store.insert(np.concatenate([header, toks(100 + i, 100)]), bytes(1), CaptureRule.EVICT)
    calls = []
    real = ck.usable_len
    monkeypatch.setattr(ck, "usable_len", lambda *a: calls.append(a) or real(*a))
    prompt = np.concatenate([header, toks(1, 50)])
    assert store.find(prompt, least=64) is None and calls == []
    assert store.find(prompt) is None and len(calls) == 300  # without it: every one, all unusable


@settings(max_examples=150, deadline=None)
@given(
    entries=st.lists(seqs, max_size=30),
    prompt=seqs,
    reach=st.sampled_from([None, 0, 3, 10]),
    least=st.integers(1, 6),
)
def test_best_match_supplies_what_brute_force_says(entries, prompt, reach, least):
    """Full KV (reach None) or a ring that can cut a restored entry back only if it holds at
    most `reach` tokens: the match supplies the most any entry sharing `least` tokens does."""

    def floor(n: int) -> int:
        return 0 if reach is None or n <= reach else n

    index = PrefixIndex()
    for t in {ck.tokens_key(t): t for t in entries}.values():
        index.add(ck.tokens_key(t), t)
    L = len(prompt)
    want = 0
    for t in entries:
        c = common_prefix_len(prompt, t)
        if c >= least:
            want = max(want, ck.usable_len(c, len(t), L, floor(len(t))))
    got = ck.best_match(index, prompt, floor, least)
    if want == 0:
        assert got is None
    else:
        key, n, common = got
        t = index.tokens(key)
        assert (n, common) == (len(t), common_prefix_len(prompt, t))
        assert ck.usable_len(common, n, L, floor(n)) == want


def counting_usable_len(monkeypatch) -> list:
    calls = []
    real = ck.usable_len
    monkeypatch.setattr(ck, "usable_len", lambda *a: calls.append(a) or real(*a))
    return calls


def test_thousands_of_ties_cost_a_bounded_number_of_comparisons(monkeypatch):
    """2,000 conversations share a 100-token system prompt and nothing more with a new one: each
    supplies those 100 tokens; the lookup takes one and compares at most MAX_TIES others."""
    system = toks(1, 100)
    store = MemoryCheckpointStore(1 << 30)
    for i in range(2000):
        store.insert(np.concatenate([system, toks(100 + i, 200)]), bytes(1), CaptureRule.EVICT)
    calls = counting_usable_len(monkeypatch)
    m = store.find(np.concatenate([system, toks(2, 50)]), least=64)
    assert m is not None and m.common >= 100  # one may share a token more by chance
    assert len(calls) <= 1 + ck.MAX_TIES


def test_a_ring_finds_the_system_prompts_own_checkpoint_among_unusable_longer_ones(monkeypatch):
    """Ring KV: 500 conversations extend a 100-token system prompt whose own (hint) checkpoint is
    stored too; the longer ones cannot be cut back to 100 tokens. The lookup goes to the hint by
    its key instead of comparing the prompt with every conversation."""
    system = toks(1, 100)
    store = MemoryCheckpointStore(1 << 30, restored_floor=lambda n: n)
    store.insert(system, bytes(1), CaptureRule.HINT)
    for i in range(500):
        store.insert(np.concatenate([system, toks(100 + i, 200)]), bytes(1), CaptureRule.EVICT)
    assert len(store) == 501  # a ring keeps the prefix entry beside the longer ones
    calls = counting_usable_len(monkeypatch)
    m = store.find(np.concatenate([system, toks(2, 50)]), least=64)
    assert m is not None and (m.key, m.common) == (ck.tokens_key(system), 100)
    assert len(calls) <= 2 + ck.MAX_TIES
