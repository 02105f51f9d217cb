"""Routing decisions: unit cases pinning slot ids, plus hypothesis properties against a
brute-force oracle."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from slotserve.scheduler.policy import (
    Capabilities,
    CheckpointMatch,
    CheckpointTier,
    RouteAction,
    SlotCandidate,
    route,
)
from slotserve.scheduler.prefix import common_prefix_len


def arr(xs) -> np.ndarray:
    return np.asarray(list(xs), dtype=np.int32)


def slot(i, tokens, free=True, idle=1.0, target=None, floor=0) -> SlotCandidate:
    t = None if target is None else arr(target)
    return SlotCandidate(i, arr(tokens), free, idle if free else 0.0, t, min_truncate_len=floor)


SYSTEM = list(range(10, 60))  # 50 tokens
CONV_A = SYSTEM + list(range(100, 400))  # a live conversation, 350 tokens


def test_extension_rewinds_the_slot_that_holds_the_conversation():
    prompt = arr(CONV_A + [7, 8, 9])
    d = route(prompt, [slot(0, []), slot(1, CONV_A)])
    assert (d.action, d.dest, d.reuse_len, d.lost_tokens) == (RouteAction.REWIND, 1, 350, 0)


def test_exact_prefix_reuses_prompt_len_minus_one():
    prompt = arr(CONV_A[:200])
    d = route(prompt, [slot(0, CONV_A)])
    assert (d.action, d.reuse_len, d.common) == (RouteAction.REWIND, 199, 200)
    assert not d.evicts  # the cut tail (151 tokens) is smaller than what is kept


def test_system_prompt_match_copies_into_an_empty_slot_instead_of_evicting():
    prompt = arr(SYSTEM + [500, 501, 502])
    d = route(prompt, [slot(0, CONV_A), slot(1, [])])
    assert (d.action, d.dest, d.src_slot, d.reuse_len) == (RouteAction.COPY, 1, 0, 50)
    assert d.lost_tokens == 0


def test_without_an_empty_slot_the_lowest_value_slot_is_overwritten():
    short = [900 + i for i in range(40)]
    prompt = arr(SYSTEM + [500, 501])
    d = route(prompt, [slot(0, CONV_A, idle=5), slot(1, short, idle=5)])
    assert (d.action, d.dest, d.src_slot, d.reuse_len) == (RouteAction.COPY, 1, 0, 50)
    assert d.evicts and d.lost_tokens == 40


def test_a_stale_conversation_yields_to_a_fresh_one():
    other = [900 + i for i in range(200)]
    prompt = arr([1, 2, 3])
    d = route(prompt, [slot(0, CONV_A, idle=6000), slot(1, other, idle=1)], idle_half_life_s=600)
    assert (d.action, d.dest) == (RouteAction.COLD, 0)


def test_only_a_trivial_match_and_no_other_slot_rewinds_and_flags_the_eviction():
    prompt = arr(SYSTEM + [500])
    d = route(prompt, [slot(0, CONV_A)])
    assert (d.action, d.dest, d.reuse_len) == (RouteAction.REWIND, 0, 50)
    assert d.evicts and d.lost_tokens == 300


def test_busy_slot_is_a_copy_source_never_a_destination():
    prompt = arr(CONV_A + [1])
    d = route(prompt, [slot(0, CONV_A, free=False), slot(1, [5, 6])])
    assert (d.action, d.dest, d.src_slot, d.reuse_len) == (RouteAction.COPY, 1, 0, 350)
    assert route(prompt, [slot(0, CONV_A, free=False)]).action is RouteAction.WAIT_SLOT


def test_waits_for_a_prefill_that_will_hold_more_of_the_prompt():
    prompt = arr(SYSTEM + [1, 2])
    leader = slot(0, SYSTEM[:20], free=False, target=SYSTEM + [3])
    d = route(prompt, [leader, slot(1, [])])
    assert (d.action, d.src_slot, d.common) == (RouteAction.WAIT_SHARED, 0, 50)
    # once the leader holds the shared part, the follower copies it
    leader = slot(0, SYSTEM + [3], free=False, target=SYSTEM + [3])
    d = route(prompt, [leader, slot(1, [])])
    assert (d.action, d.dest, d.reuse_len) == (RouteAction.COPY, 1, 50)


def test_checkpoint_ties_prefer_slot_then_memory_then_disk():
    prompt = arr(CONV_A + [1])
    mem = CheckpointMatch(CheckpointTier.MEMORY, "m", 350, 350)
    disk = CheckpointMatch(CheckpointTier.DISK, "d", 350, 350)
    d = route(prompt, [slot(0, [])], [disk, mem])
    assert (d.action, d.checkpoint.key, d.reuse_len) == (RouteAction.RESTORE_MEMORY, "m", 350)
    d = route(prompt, [slot(0, []), slot(1, CONV_A, free=False)], [disk, mem])
    assert d.action is RouteAction.COPY
    longer = CheckpointMatch(CheckpointTier.DISK, "d2", 351, 351)
    d = route(arr(CONV_A + [1, 2]), [slot(0, [])], [mem, longer])
    assert (d.action, d.reuse_len) == (RouteAction.RESTORE_DISK, 351)


def test_reuse_disabled_always_prefills_cold():
    prompt = arr(CONV_A + [1])
    d = route(prompt, [slot(0, CONV_A), slot(1, [])], reuse_enabled=False)
    assert (d.action, d.dest, d.reuse_len) == (RouteAction.COLD, 1, 0)


def test_capabilities_restrict_the_sources():
    prompt = arr(CONV_A + [1])
    no_copy = Capabilities(can_copy=False)
    d = route(prompt, [slot(0, CONV_A, free=False), slot(1, [])], caps=no_copy)
    assert (d.action, d.reuse_len) == (RouteAction.COLD, 0)
    # a slot that cannot be cut back at all: a pure extension still rewinds (no cut needed); a
    # divergence cannot, and the decision says the window cost it
    assert route(prompt, [slot(0, CONV_A, floor=350)]).reuse_len == 350
    d = route(arr(CONV_A[:100] + [1]), [slot(0, CONV_A, floor=350)])
    assert (d.action, d.reuse_len, d.window_refused, d.window_lost_tokens) == (RouteAction.COLD, 0, True, 100)


# ---------------------------------------------------------------------------- properties

tokens = st.lists(st.integers(0, 2), min_size=0, max_size=12)


@st.composite
def scenarios(draw):
    n_slots = draw(st.integers(1, 5))
    slots = []
    for i in range(n_slots):
        rec = draw(tokens)
        free = draw(st.booleans())
        idle = draw(st.floats(0, 5000))
        slots.append(slot(i, rec, free=free, idle=idle))
    prompt = draw(st.lists(st.integers(0, 2), min_size=1, max_size=14))
    ckpts = []
    for j, t in enumerate(draw(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=12), max_size=3))):
        c = 0
        while c < min(len(t), len(prompt)) and t[c] == prompt[c]:
            c += 1
        tier = draw(st.sampled_from([CheckpointTier.MEMORY, CheckpointTier.DISK]))
        ckpts.append(CheckpointMatch(tier, f"k{j}", len(t), c))
    return arr(prompt), slots, ckpts


def oracle_saved(prompt, slots, ckpts) -> int:
    """Brute force: the most prompt tokens any source could supply (no numpy)."""
    p = prompt.tolist()
    best = 0
    for s in slots:
        rec = s.tokens.tolist()
        c = 0
        while c < min(len(rec), len(p)) and rec[c] == p[c]:
            c += 1
        best = max(best, min(c, len(p) - 1))
    for m in ckpts:
        best = max(best, min(m.common, len(p) - 1))
    return best


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_chosen_source_saves_as_much_as_the_oracle(case):
    prompt, slots, ckpts = case
    d = route(prompt, slots, ckpts)
    if d.action is RouteAction.WAIT_SLOT:
        assert not any(s.is_free for s in slots)
        return
    assert d.action is not RouteAction.WAIT_SHARED  # no prefill targets in these scenarios
    assert d.reuse_len == oracle_saved(prompt, slots, ckpts)
    assert 0 <= d.reuse_len <= len(prompt) - 1
    # the decision is executable: the named source really holds the reused prefix
    if d.action is RouteAction.REWIND:
        rec = slots[d.dest].tokens
        assert common_prefix_len(prompt, rec) >= d.reuse_len
    elif d.action is RouteAction.COPY:
        assert d.src_slot != d.dest
        assert common_prefix_len(prompt, slots[d.src_slot].tokens) >= d.reuse_len
    elif d.action in (RouteAction.RESTORE_MEMORY, RouteAction.RESTORE_DISK):
        assert d.checkpoint.common >= d.reuse_len
    assert slots[d.dest].is_free


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_a_live_conversation_is_never_evicted_while_an_empty_slot_exists(case):
    prompt, slots, ckpts = case
    d = route(prompt, slots, ckpts)
    if not any(s.is_free and s.tokens.shape[0] == 0 for s in slots):
        return
    dest_len = int(slots[d.dest].tokens.shape[0])
    if dest_len == 0:
        return
    # using an occupied slot is allowed only as a rewind that keeps more than it cuts
    assert d.action is RouteAction.REWIND
    assert dest_len - d.reuse_len <= d.reuse_len
    assert not d.evicts


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=300), st.lists(st.integers(0, 3), max_size=300))
def test_common_prefix_len_matches_a_loop(a, b):
    c = 0
    while c < min(len(a), len(b)) and a[c] == b[c]:
        c += 1
    assert common_prefix_len(arr(a), arr(b)) == c


def test_common_prefix_len_on_long_arrays_across_block_edges():
    base = np.arange(10_000, dtype=np.int32)
    for cut in (0, 1, 63, 64, 65, 4095, 4096, 4097, 9999):
        other = base.copy()
        other[cut] = -1
        assert common_prefix_len(base, other) == cut
    assert common_prefix_len(base, base[:5000]) == 5000
