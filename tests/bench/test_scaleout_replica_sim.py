"""The replica simulation: exact accounting on hand-made traces, policy ordering on a seeded one."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from slotserve.bench import replica_sim as sim
from slotserve.scheduler.policy import RouteAction, RouteDecision


def conv(
    start: float, users: list[int], replies: list[int], system: int = 10, system_id: int = 0, base: int = 0
):
    """A conversation with distinct token ids (base + running counter) so prefixes never collide by chance."""
    ids = iter(range(base + 1000, base + 100000))
    take = lambda n: np.array([next(ids) for _ in range(n)], dtype=np.int32)  # noqa: E731
    return sim.ConversationTrace(
        start_s=start,
        system_id=system_id,
        system=np.arange(system, dtype=np.int32) + 100 * system_id,
        users=tuple(take(n) for n in users),
        replies=tuple(take(n) for n in replies),
        think_s=(0.0,) + (1.0,) * (len(users) - 1),
    )


SERVICE = sim.ServiceModel(prefill_tok_s=1000.0, decode_tok_s=100.0, ctx_len=4096)


def test_two_turns_exact_reuse_per_policy():
    trace = [conv(0.0, users=[5, 7], replies=[3, 4])]
    # turn 0: 10 + 5 = 15 prompt tokens, cold; turn 1: 15 + 3 + 7 = 25 prompt tokens
    aware = sim.simulate(trace, 2, 2, sim.ClusterPolicy.CACHE_AWARE, SERVICE)
    assert (aware.num_requests, aware.prompt_tokens) == (2, 40)
    assert aware.reused_tokens == 18  # the whole first prompt + reply
    assert (aware.later_turns, aware.later_turns_home) == (1, 1)
    rr = sim.simulate(trace, 2, 2, sim.ClusterPolicy.ROUND_ROBIN, SERVICE)
    assert rr.reused_tokens == 0  # turn 1 lands on the other, empty replica
    assert (rr.later_turns, rr.later_turns_home) == (1, 0)
    assert aware.oracle_reused_tokens == rr.oracle_reused_tokens == 18


def test_shared_system_prompt_is_copied_within_a_replica():
    trace = [conv(0.0, [4], [2], system=20, base=0), conv(5.0, [6], [2], system=20, base=50000)]
    r = sim.simulate(trace, 1, 2, sim.ClusterPolicy.ROUND_ROBIN, SERVICE)
    # the second conversation copies the 20-token system prompt from the first one's slot
    assert r.reused_tokens == 20
    assert r.oracle_reused_tokens == 20


def test_one_replica_makes_every_policy_equal():
    trace = sim.make_trace(sim.TraceConfig(num_conversations=8, seed=3, ramp_s=10))
    results = {p: sim.simulate(trace, 1, 3, p, SERVICE) for p in sim.ClusterPolicy}
    reused = {r.reused_tokens for r in results.values()}
    assert len(reused) == 1 and reused.pop() > 0


def test_cache_aware_keeps_conversations_home_and_beats_round_robin_and_random():
    trace = sim.make_trace(sim.TraceConfig(num_conversations=12, seed=1, ramp_s=20, think_s=2.0))
    res = {p: sim.simulate(trace, 6, 4, p, SERVICE, seed=1) for p in sim.ClusterPolicy}
    aware, rr, rnd = (
        res[sim.ClusterPolicy.CACHE_AWARE],
        res[sim.ClusterPolicy.ROUND_ROBIN],
        res[sim.ClusterPolicy.RANDOM],
    )
    assert aware.prompt_tokens == rr.prompt_tokens == rnd.prompt_tokens  # same trace, same prompts
    # 12 conversations, 24 slots: a turn leaves home only when its replica is busy at that moment
    assert aware.home_rate >= 0.9
    assert rr.home_rate < 0.5 and rnd.home_rate < 0.5
    assert aware.hit_rate > rr.hit_rate + 0.2 and aware.hit_rate > rnd.hit_rate + 0.2
    for r in res.values():
        assert 0 <= r.reused_tokens <= r.oracle_reused_tokens <= r.prompt_tokens


def test_slot_chooser_is_pluggable():
    calls = []

    def always_cold(prompt, slots):
        calls.append(len(slots))
        dest = next(s.slot for s in slots if s.is_free)
        return RouteDecision(RouteAction.COLD, dest, 0, 0, 0)

    trace = [conv(0.0, [5, 5, 5], [2, 2, 2])]
    r = sim.simulate(trace, 2, 3, sim.ClusterPolicy.CACHE_AWARE, SERVICE, slot_chooser=always_cold)
    assert r.reused_tokens == 0 and r.num_requests == 3
    assert calls and set(calls) == {3}  # every call saw one replica's 3 slots


def test_conversation_that_outgrows_a_slot_ends():
    trace = [conv(0.0, [100, 100, 100], [50, 50, 50])]
    r = sim.simulate(trace, 1, 1, sim.ClusterPolicy.ROUND_ROBIN, sim.ServiceModel(ctx_len=300))
    assert r.num_requests == 1  # turn 2 would need 10 + 150 + 100 + 50 > 300 tokens


def test_cli_writes_table_json_and_plot(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    sim.configure(parser)
    args = parser.parse_args(
        ["--replicas", "1", "3", "--slots", "2", "--turns", "2,3", "--ramp-s", "5", "--out", str(tmp_path)]
    )
    assert sim.run(args) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert [(r["num_replicas"], r["policy"]) for r in data["results"]] == [
        (n, p.value) for n in (1, 3) for p in sim.ClusterPolicy
    ]
    table = (tmp_path / "table.md").read_text()
    assert table.count("\n| 3 |") == 3
    assert (tmp_path / "hit_rate.png").stat().st_size > 1000
    assert "cache_aware" in capsys.readouterr().out


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError):
        sim.TraceConfig(turns=(0, 2))
    with pytest.raises(ValueError):
        sim.simulate([], 0, 1, sim.ClusterPolicy.RANDOM)
    parser = argparse.ArgumentParser()
    sim.configure(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--turns", "a,b"])
