"""`slotserve bench routing`: the route decision and the checkpoint lookup are checked against
brute force before they are timed, and every figure is reported."""

from __future__ import annotations

import argparse
import json

from slotserve.bench import routing


def run(capsys, *argv: str) -> dict:
    parser = argparse.ArgumentParser()
    routing.configure(parser)
    assert (
        routing.run(
            parser.parse_args(["--prompt-tokens", "300", "--slots", "3", "--repeat", "3", "--json", *argv])
        )
        == 0
    )
    return json.loads(capsys.readouterr().out)


def test_route_figures(capsys):
    report = run(capsys)
    assert report["route_us"] > 0 and report["lcp_us_per_slot"] > 0
    assert "checkpoints" not in report
    assert report["decision"].startswith("rewind")


def test_checkpoint_lookup_figures(capsys):
    report = run(capsys, "--checkpoints", "40", "--system-tokens", "70")
    assert report["checkpoints"] == 40 and report["find_us"] > 0
    assert report["find_common"] >= 70  # every entry shares the system prompt (one may share more)
