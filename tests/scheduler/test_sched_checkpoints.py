"""Checkpoint stores: memory (budget, LRU, rule classes, exact-token keys) and disk (atomic
files, index rebuild, LRU within the space budget)."""

from __future__ import annotations

import os
import time

import numpy as np
from slotserve.scheduler import checkpoint_store as ck
from slotserve.scheduler.checkpoint_store import CaptureRule, MemoryCheckpointStore
from slotserve.scheduler.disk_store import DiskCheckpointStore


def toks(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, n).astype(np.int32)


def blob(n: int) -> bytes:
    return bytes(n)


def test_find_returns_the_longest_common_prefix_comparing_tokens():
    store = MemoryCheckpointStore(1 << 20)
    base = toks(1, 100)
    a = np.concatenate([base, toks(2, 50)])
    b = np.concatenate([base[:70], toks(3, 10)])
    store.insert(a, blob(100), CaptureRule.EVICT)
    store.insert(b, blob(100), CaptureRule.HINT)
    m = store.find(np.concatenate([base, toks(4, 5)]))
    assert (m.key, m.common, m.num_tokens) == (ck.tokens_key(a), 100, 150)
    assert store.find(toks(9, 100)) is None
    store.check_integrity()


def test_a_hash_collision_is_caught_by_comparing_tokens(monkeypatch):
    monkeypatch.setattr(ck, "tokens_key", lambda t: "same-key")
    store = MemoryCheckpointStore(1 << 20)
    a, b = toks(1, 50), toks(2, 50)
    store.insert(a, blob(10), CaptureRule.HINT)
    assert store.contains_prefix(a) and not store.contains_prefix(b)
    store.insert(b, blob(10), CaptureRule.HINT)  # replaces: one key, exact tokens win
    assert store.contains_prefix(b) and not store.contains_prefix(a)
    assert len(store) == 1


def test_budget_evicts_least_recently_used_within_a_class():
    store = MemoryCheckpointStore(300)
    entries = [toks(i, 40) for i in range(3)]
    for t in entries:
        assert store.insert(t, blob(100), CaptureRule.EVICT).evicted == []
    store.get(ck.tokens_key(entries[0]))  # refresh the oldest
    evicted = store.insert(toks(10, 40), blob(100), CaptureRule.EVICT).evicted
    assert [e.key for e in evicted] == [ck.tokens_key(entries[1])]
    assert store.bytes_used == 300
    store.check_integrity()


def test_prompt_end_captures_go_first_and_never_displace_hinted_ones():
    store = MemoryCheckpointStore(300)
    hint = toks(1, 40)
    pe = toks(2, 40)
    store.insert(hint, blob(100), CaptureRule.HINT)
    store.insert(pe, blob(100), CaptureRule.PROMPT_END)
    store.insert(toks(3, 40), blob(100), CaptureRule.COMMON_PREFIX)
    store.get(ck.tokens_key(pe))  # the prompt-end entry is now the most recently used
    evicted = store.insert(toks(4, 40), blob(100), CaptureRule.HINT).evicted
    assert [e.key for e in evicted] == [ck.tokens_key(pe)]
    # full of hinted/common-prefix entries: a prompt-end capture does not fit
    assert not store.can_fit(100, CaptureRule.PROMPT_END)
    assert store.insert(toks(5, 40), blob(100), CaptureRule.PROMPT_END) is None
    assert store.contains_prefix(hint)
    assert store.insert(toks(6, 40), blob(400), CaptureRule.HINT) is None  # over the budget
    store.check_integrity()


def test_a_longer_capture_supersedes_every_prefix_of_it_and_keeps_the_highest_class():
    """One conversation's hint (system turn), an earlier prompt end and its evicted record are
    the same rows three times: the longest entry alone stays, with the hint's class."""
    store = MemoryCheckpointStore(1 << 20)
    conv = toks(1, 200)
    store.insert(conv[:100], blob(100), CaptureRule.HINT)
    done = store.insert(conv[:150], blob(150), CaptureRule.PROMPT_END)
    assert [e.num_tokens for e in done.superseded] == [100]
    done = store.insert(conv, blob(200), CaptureRule.EVICT)
    assert done.stored and done.evicted == []
    assert [(e.num_tokens, e.rule) for e in done.superseded] == [(150, CaptureRule.HINT)]
    assert len(store) == 1 and store.bytes_used == 200
    (kept,) = store.entries()
    assert kept.rule is CaptureRule.HINT  # the hint's protection moves to the longer entry
    m = store.find(np.concatenate([conv[:100], toks(2, 20)]))
    assert (m.num_tokens, m.common) == (200, 100)  # still serves the system prompt
    store.check_integrity()


def test_a_capture_a_longer_entry_already_holds_stores_nothing_and_promotes_it():
    store = MemoryCheckpointStore(1 << 20)
    conv = toks(1, 200)
    store.insert(conv, blob(200), CaptureRule.EVICT)
    done = store.insert(conv[:120], blob(120), CaptureRule.HINT)
    assert not done.stored and done.evicted == done.superseded == []
    assert len(store) == 1 and store.bytes_used == 200
    assert store.entries()[0].rule is CaptureRule.HINT
    assert store.covering(conv[:120]).num_tokens == 200
    assert store.covering(np.concatenate([conv[:120], toks(3, 5)])) is None
    store.check_integrity()


def test_a_ring_keeps_prefix_entries_a_longer_one_cannot_be_cut_back_to():
    """Past the window a restored slot cannot be cut back: nothing is covered or superseded."""
    window = 64
    store = MemoryCheckpointStore(1 << 20, restored_floor=lambda n: 0 if n <= window else n)
    conv = toks(1, 200)
    store.insert(conv[:100], blob(100), CaptureRule.HINT)
    done = store.insert(conv, blob(200), CaptureRule.EVICT)
    assert done.superseded == [] and len(store) == 2
    assert store.covering(conv[:150]) is None
    assert store.covering(conv[:100]).num_tokens == 100  # the exact entry
    store.insert(conv[:40], blob(40), CaptureRule.HINT)
    assert store.insert(conv[:60], blob(60), CaptureRule.HINT).superseded[0].num_tokens == 40  # within
    store.check_integrity()


def test_entries_a_live_slot_duplicates_are_evicted_first_whatever_their_class():
    """A hint of a slot that still holds those rows goes before an evicted conversation (which
    no slot holds), though the hint's class is higher; without the live records the evicted
    conversation would go."""
    live_conv, gone_conv = toks(1, 80), toks(2, 80)
    live = [(live_conv, 0), (np.zeros(0, np.int32), 0)]

    def filled() -> MemoryCheckpointStore:
        store = MemoryCheckpointStore(300)
        store.insert(live_conv[:60], blob(100), CaptureRule.HINT)
        store.insert(gone_conv, blob(100), CaptureRule.EVICT)
        store.insert(toks(3, 80), blob(100), CaptureRule.PROMPT_END)
        return store

    blind = filled()
    done = blind.insert(toks(4, 80), blob(200), CaptureRule.EVICT)
    assert [e.num_tokens for e in done.evicted] == [80, 80]  # the prompt end, the conversation
    assert blind.covering(gone_conv) is None

    store = filled()
    assert store.shadowed(live) == {ck.tokens_key(live_conv[:60])}
    assert store.can_fit(200, CaptureRule.PROMPT_END, live=live)  # the hint counts as room now
    assert not store.can_fit(200, CaptureRule.PROMPT_END)
    done = store.insert(toks(4, 80), blob(200), CaptureRule.EVICT, live=live)
    assert [e.num_tokens for e in done.evicted] == [60, 80]  # the live duplicate, then class 0
    assert store.covering(gone_conv) is not None
    assert store.bytes_used == 300
    store.check_integrity()


def _disk(tmp_path, space=1 << 20) -> DiskCheckpointStore:
    d = DiskCheckpointStore(tmp_path, space, "fp-test")
    d.start()
    d.index_ready.wait(5)
    return d


def test_disk_round_trip_and_index_rebuilt_after_restart(tmp_path):
    d = _disk(tmp_path)
    t = toks(1, 64)
    d.put(t, b"snapshot-bytes", "hint")
    d.flush()
    assert d.find(np.concatenate([t, toks(2, 3)])).common == 64
    tokens, data = d.load(ck.tokens_key(t))
    assert data == b"snapshot-bytes" and np.array_equal(tokens, t)
    d.close()
    assert not list(tmp_path.rglob("*.tmp"))
    d2 = _disk(tmp_path)  # a restart: the index comes from the files' headers
    assert len(d2) == 1 and d2.bytes_used == d.bytes_used
    assert d2.load(ck.tokens_key(t))[1] == b"snapshot-bytes"
    assert d2.load(ck.tokens_key(t))[1] == b"snapshot-bytes"  # stays reusable
    d2.close()


def test_disk_lru_within_the_space_budget(tmp_path):
    d = _disk(tmp_path, space=3 * 800)
    keys = []
    for i in range(3):
        t = toks(i, 64)
        d.put(t, bytes(400), "evict")
        d.flush()
        keys.append(ck.tokens_key(t))
        time.sleep(0.01)
    assert d.load(keys[0]) is not None  # refresh the oldest
    d.put(toks(9, 64), bytes(400), "evict")
    d.flush()
    names = {p.name for p in tmp_path.rglob("*.kvc")}
    assert keys[1] + ".kvc" not in names and keys[0] + ".kvc" in names and len(names) == 3
    assert d.bytes_used <= 3 * 800
    d.close()


def test_disk_truncated_file_is_removed_on_load(tmp_path):
    d = _disk(tmp_path)
    t = toks(1, 64)
    d.put(t, bytes(1000), "hint")
    d.flush()
    (path,) = list(tmp_path.rglob("*.kvc"))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 10)
    assert d.load(ck.tokens_key(t)) is None
    assert not path.exists() and len(d) == 0
    d.close()


def test_disk_files_hold_distinct_rows(tmp_path):
    """A conversation's hint, then its evicted record: the record's file replaces the hint's;
    a later write of rows a file already holds writes nothing."""
    events = []
    d = _disk(tmp_path)
    d.on_event = lambda kind, rule, nbytes, n: events.append((kind, rule, n))
    conv = toks(1, 200)
    d.put(conv[:100], bytes(1000), "hint")
    d.put(conv, bytes(2000), "evict")
    d.put(conv[:150], bytes(1500), "common_prefix")
    d.flush()
    assert events == [("capture", "hint", 100), ("capture", "evict", 200), ("evict", "hint", 100)]
    assert len(d) == 1 and len(list(tmp_path.rglob("*.kvc"))) == 1
    m = d.find(np.concatenate([conv[:100], toks(2, 9)]))
    assert (m.num_tokens, m.common) == (200, 100)
    d.close()


def test_disk_ring_files_are_not_replaced_by_longer_ones_past_the_window(tmp_path):
    window = 64
    d = DiskCheckpointStore(tmp_path, 1 << 20, "fp-ring", restored_floor=lambda n: 0 if n <= window else n)
    d.start()
    d.index_ready.wait(5)
    conv = toks(1, 200)
    d.put(conv[:100], bytes(1000), "hint")
    d.put(conv, bytes(2000), "evict")
    d.put(conv[:150], bytes(1500), "common_prefix")  # the 200-token file cannot be cut to 150
    d.flush()
    assert len(d) == 3 and len(list(tmp_path.rglob("*.kvc"))) == 3
    d.close()


async def test_a_checkpoint_sharing_fewer_than_32_tokens_is_restored():
    """One slot: conversation A is evicted to a checkpoint by B; C shares A's first 20 tokens
    only (a system prompt shorter than the stores' old 32-token lookup head) and restores them
    from that checkpoint; its tokens equal a cold run's."""
    from sched_support import cold_tokens, make_config, make_pool, make_scheduler, prompt_of, run_one
    from slotserve.scheduler.request import ReuseSource

    system = prompt_of(1, 20)
    a, b, c = system + prompt_of(2, 80), prompt_of(3, 100), system + prompt_of(4, 50)
    pool = make_pool(1, 512)
    async with make_scheduler(pool, make_config(checkpoint_memory_mb=4)) as sched:
        await run_one(sched, a, 4)
        await run_one(sched, b, 4)  # overwrites A's slot: A's record goes to a checkpoint
        before = pool.num_computed_tokens
        out = await run_one(sched, c, 4)
        await sched.check_integrity()
    r = out.finish.reuse
    assert (r.source, r.reused_tokens, r.prefilled_tokens) == (ReuseSource.CHECKPOINT_MEMORY, 20, 50)
    assert pool.num_restores == 1 and pool.num_computed_tokens - before == 50 + 3
    assert out.tokens == await cold_tokens(c, 4)


async def test_a_checkpoint_supplying_fewer_than_min_checkpoint_tokens_is_not_restored():
    """The stores find a checkpoint sharing any prefix, even one token; routing is handed only
    those that supply min_checkpoint_tokens (8 here): below that a restore costs more than the
    prefill it saves."""
    from sched_support import make_config, make_pool, make_scheduler, prompt_of, run_one
    from slotserve.scheduler.request import ReuseSource

    header = prompt_of(1, 7)
    a, b, c = header + prompt_of(2, 80), prompt_of(3, 100), header + prompt_of(4, 50)
    pool = make_pool(1, 512)
    async with make_scheduler(pool, make_config(checkpoint_memory_mb=4)) as sched:
        await run_one(sched, a, 4)
        await run_one(sched, b, 4)
        assert sched._ckpt.memory.find(np.asarray(c, np.int32)).common == 7  # found ...
        out = await run_one(sched, c, 4)  # ... but not restored
        await sched.check_integrity()
    assert (out.finish.reuse.source, out.finish.reuse.reused_tokens) == (ReuseSource.NONE, 0)
    assert pool.num_restores == 0
