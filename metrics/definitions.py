"""Every pushed slotserve metric: names, help, label values and histogram buckets, in one place.

Design: `PushedMetrics(registry)` creates the counters and histograms the scheduler's events feed
(levels read at scrape time live in `levels.py`). Every labelled series is created at start-up
with value 0, for two reasons: PromQL ratios such as the reuse hit rate need every series present
from the first scrape (a series that appears mid-range skews `rate()` extrapolation), and the
step loop then never allocates a label child. Names follow Prometheus practice: `slotserve_`
prefix, base units in the name, `_total` only on counters, no colons (colons are for recording
rules, see deploy/prometheus/rules.yml).
"""

from __future__ import annotations

import enum

from prometheus_client import CollectorRegistry, Counter, Histogram
from slotserve.scheduler.divergence import MissReason
from slotserve.scheduler.stats import (
    CaptureRule,
    CheckpointEventKind,
    CheckpointTier,
    Outcome,
    Phase,
    PrefillClass,
    RestoreReason,
    ReuseSource,
)

# ---------------------------------------------------------------- label values (the contract)
# The enums of scheduler/stats.py, in their order, are the label values: every series exists from
# start-up, and a stats field can only hold one of them.

CheckpointKey = tuple[CheckpointEventKind, CheckpointTier, CaptureRule | None]


class StatsKind(str, enum.Enum):
    """Which StatsSink method dropped an event (`slotserve_stats_dropped_total{kind}`)."""

    STEP = "step"
    REQUEST = "request"
    CHECKPOINT = "checkpoint"
    CANCEL = "cancel"
    ROUTE = "route"


ENGINE_PHASES = (Phase.PREFILL, Phase.DECODE)  # engine tokens
CANCEL_PHASES = (Phase.QUEUED, Phase.PREFILL, Phase.DECODE)  # where a request was when cancelled
REUSED_SOURCES: tuple[ReuseSource, ...] = tuple(s for s in ReuseSource if s is not ReuseSource.NONE)
UNKNOWN_RULE = "unknown"  # the rule label of an event with rule None (a disk restore or drop)


def rule_label(rule: CaptureRule | None) -> str:
    return rule.value if rule is not None else UNKNOWN_RULE


class Stage(str, enum.Enum):
    """Where a request ended (`slotserve_requests_total{stage}`)."""

    SCHEDULER = "scheduler"  # the scheduler saw it: admitted, or refused at submit
    GATEWAY = "gateway"  # it ended before: no route, no key, bad or slow body, client gone, draining


# Requests that ended in the gateway before the scheduler saw them (gateway/http_guard.py):
# cancelled = client gone during its body, timeout = body past --body-timeout-s (408),
# rejected = any other 4xx or a 503, error = another 5xx.
GATEWAY_OUTCOMES = (Outcome.CANCELLED, Outcome.TIMEOUT, Outcome.REJECTED, Outcome.ERROR)

# The rendered parts a prompt can diverge in: gateway/prompt_parts.PartKind's values (a test keeps
# them equal; metrics/ does not import the gateway).
DIVERGENCE_PARTS = ("system", "tools", "message", "generation_prompt", "prompt")

# ---------------------------------------------------------------- buckets (seconds unless noted)
# Sized for a CPU server: a long cold prefill on a big model takes minutes, a small model's
# decode step a few milliseconds.

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0, 600.0)
QUEUE_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
CANCEL_ACK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
STEP_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.035,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
STEP_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)  # tokens
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)  # slots


class PushedMetrics:
    """The counters and histograms fed by scheduler events, registered on `registry`.

    Attributes are prometheus-client metric objects; `requests[outcome]`-style dicts hold the
    pre-created label children so recording is a dict lookup plus an `inc`/`observe`.
    """

    def __init__(self, registry: CollectorRegistry):
        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        def histogram(
            name: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()
        ) -> Histogram:
            return Histogram(name, doc, labels, registry=registry, buckets=buckets)

        # -- requests and tokens (one update per finished request)
        requests = counter(
            "slotserve_requests_total",
            "Finished requests by outcome, and by the stage they ended in: the scheduler, or the "
            "gateway before it (no route, no key, bad body, client gone, draining).",
            ("outcome", "stage"),
        )
        self.requests = {o: requests.labels(o.value, Stage.SCHEDULER.value) for o in Outcome}
        self.gateway_requests = {o: requests.labels(o.value, Stage.GATEWAY.value) for o in GATEWAY_OUTCOMES}
        prefix_divergence = counter(
            "slotserve_prefix_divergence_total",
            "Requests that reused less than their whole prompt (but the last token), by the "
            "rendered part their prompt diverged in from the best source held (system, tools, "
            "message, generation_prompt; prompt for raw completions) and why (divergence.py).",
            ("part", "reason"),
        )
        # every series exists from the start (rates read 0, not absent)
        self.prefix_divergence = {
            (part, r.value): prefix_divergence.labels(part, r.value)
            for part in DIVERGENCE_PARTS
            for r in MissReason
            if r is not MissReason.NONE
        }
        reuse_requests = counter(
            "slotserve_reuse_requests_total",
            "Requests that reached a slot, by where their reused prefix came from "
            '(source="none": cold prefill). Hit rate = source!="none" / all.',
            ("source",),
        )
        self.reuse_requests = {s: reuse_requests.labels(s.value) for s in ReuseSource}
        self.prompt_tokens = counter(
            "slotserve_prompt_tokens_total", "Prompt tokens of requests that reached a slot."
        )
        reused = counter(
            "slotserve_reused_tokens_total",
            "Prompt tokens not computed because KV was reused, by source.",
            ("source",),
        )
        self.reused_tokens = {s: reused.labels(s.value) for s in REUSED_SOURCES}
        self.prefilled_tokens = counter(
            "slotserve_prefilled_tokens_total",
            "Prompt tokens computed by prefill (resumed prefills count once).",
        )
        self.generated_tokens = counter("slotserve_generated_tokens_total", "Completion tokens sampled.")
        self.ttft = histogram(
            "slotserve_time_to_first_token_seconds", "Admission to first token.", TTFT_BUCKETS
        )
        ttft_by_class = histogram(
            "slotserve_time_to_first_token_by_class_seconds",
            "Admission to first token, by class: warm = more than half of the prompt reused "
            "(returning turns), cold = the rest.",
            TTFT_BUCKETS,
            ("class",),
        )
        self.ttft_by_class = {c: ttft_by_class.labels(c.value) for c in PrefillClass}
        self.itl = histogram(
            "slotserve_inter_token_latency_seconds",
            "Gap between successive tokens of one request.",
            ITL_BUCKETS,
        )
        self.e2e = histogram("slotserve_e2e_request_latency_seconds", "Admission to finish.", E2E_BUCKETS)
        self.queue_wait = histogram(
            "slotserve_queue_wait_seconds", "Admission to slot assignment.", QUEUE_BUCKETS
        )

        # -- engine steps (one update per forward call: the hot path)
        self.step_seconds = histogram(
            "slotserve_engine_step_seconds", "Wall time of one engine forward call.", STEP_BUCKETS
        )
        self.step_tokens = histogram(
            "slotserve_engine_step_tokens",
            "Tokens fed to one engine step (prefill + decode).",
            STEP_TOKEN_BUCKETS,
        )
        self.step_batch = histogram(
            "slotserve_engine_step_batch_size", "Slots in one engine step.", BATCH_BUCKETS
        )
        engine_tokens = counter(
            "slotserve_engine_tokens_total", "Tokens fed to the engine, by phase.", ("phase",)
        )
        self.engine_tokens = {p: engine_tokens.labels(p.value) for p in ENGINE_PHASES}
        self.chained_steps = counter(
            "slotserve_engine_chained_steps_total",
            "Decode steps the engine worker started itself, without waiting for the event loop.",
        )
        self.discarded_tokens = counter(
            "slotserve_engine_discarded_tokens_total",
            "Rows a chained step computed for requests that had already ended (cut off again).",
        )
        self.spec_drafted_tokens = counter(
            "slotserve_spec_drafted_tokens_total",
            "Speculative draft tokens the engine verified (--speculative ngram).",
        )
        self.spec_accepted_tokens = counter(
            "slotserve_spec_accepted_tokens_total",
            "Speculative draft tokens the model confirmed (each one a decode step saved).",
        )

        # -- cancels and preemptions
        cancels = counter("slotserve_cancels_total", "Acknowledged cancels, by request phase.", ("phase",))
        self.cancels = {p: cancels.labels(p.value) for p in CANCEL_PHASES}
        cancel_ack = histogram(
            "slotserve_cancel_ack_seconds",
            "cancel() call to acknowledgement, by phase.",
            CANCEL_ACK_BUCKETS,
            ("phase",),
        )
        self.cancel_ack = {p: cancel_ack.labels(p.value) for p in CANCEL_PHASES}
        self.preemptions = counter(
            "slotserve_preemptions_total", "Prefills paused between segments for a higher-priority request."
        )

        # -- checkpoints
        events = counter(
            "slotserve_checkpoints_total",
            "Checkpoint events (capture, restore, evict, drop) by tier and capture rule.",
            ("event", "tier", "rule"),
        )
        sizes = counter(
            "slotserve_checkpoint_bytes_total",
            "Bytes moved by checkpoint events, by event, tier and capture rule.",
            ("event", "tier", "rule"),
        )
        rules: tuple[CaptureRule | None, ...] = (*CaptureRule, None)
        keys: list[CheckpointKey] = [
            (e, t, r) for e in CheckpointEventKind for t in CheckpointTier for r in rules
        ]
        self.checkpoints = {k: events.labels(k[0].value, k[1].value, rule_label(k[2])) for k in keys}
        self.checkpoint_bytes = {k: sizes.labels(k[0].value, k[1].value, rule_label(k[2])) for k in keys}

        # -- sliding-window rings (routing; one update per routed request)
        self.window_refused = counter(
            "slotserve_window_refused_rewinds_total",
            "Routed requests for which a live slot shared more of the prompt than its "
            "sliding-window ring could be cut back to.",
        )
        self.window_recomputed = counter(
            "slotserve_window_recomputed_tokens_total",
            "Prompt tokens prefilled because a ring could not be cut back and no checkpoint held them.",
        )
        restores = counter(
            "slotserve_checkpoint_restores_total",
            "Requests routed to a checkpoint restore, by tier and reason (window: a live slot shared "
            "as much but its ring could not be cut back; evicted: no live slot held it).",
            ("tier", "reason"),
        )
        self.restores: dict[tuple[CheckpointTier, RestoreReason], Counter] = {
            (t, r): restores.labels(t.value, r.value) for t in CheckpointTier for r in RestoreReason
        }

        # -- the sink's own health
        dropped = counter(
            "slotserve_stats_dropped_total",
            "Scheduler stats events dropped because a field broke the stats contract (a bug).",
            ("kind",),
        )
        self.dropped = {k: dropped.labels(k.value) for k in StatsKind}
