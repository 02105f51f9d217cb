"""PNG plots of a results file: TTFT by turn index, TTFT CDF, throughput over time.

matplotlib is imported inside `write_plots` with the Agg backend (no display needed).
Token arrival times are rebuilt from each record: start + TTFT + cumulative ITLs.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from .results import Results

PLOT_FILES = ("ttft_by_turn.png", "ttft_cdf.png", "throughput.png")


def token_times(results: Results) -> list[float]:
    """Arrival time (seconds after the start) of every streamed text chunk."""
    out = []
    for r in results.requests:
        if r.ttft_s is None:
            continue
        t = r.start_s + r.ttft_s
        out.append(t)
        for gap in r.itl_s:
            t += gap
            out.append(t)
    return out


def write_plots(results: Results, out_dir: str | Path) -> list[Path]:
    """Write the three PNGs into `out_dir` (created if missing); return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    title = f"{results.config.workload} - {results.config.url}"
    streamed = [r for r in results.requests if r.ttft_s is not None and r.status in ("ok", "aborted")]
    paths = [out / name for name in PLOT_FILES]

    by_turn: dict[int, list[float]] = defaultdict(list)
    for r in streamed:
        by_turn[r.turn_index].append(r.ttft_s * 1000)  # type: ignore[operator]
    fig, ax = plt.subplots(figsize=(7, 4))
    turns = sorted(by_turn)
    if turns:
        ax.boxplot([by_turn[t] for t in turns], positions=turns, widths=0.6)
    ax.set(xlabel="turn index", ylabel="TTFT (ms)", title=f"TTFT by turn: {title}")
    fig.tight_layout()
    fig.savefig(paths[0], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = sorted(r.ttft_s * 1000 for r in streamed)  # type: ignore[operator]
    if xs:
        ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post")
    ax.set(xlabel="TTFT (ms)", ylabel="fraction of requests", ylim=(0, 1.02), title=f"TTFT CDF: {title}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=100)
    plt.close(fig)

    times = token_times(results)
    ends = [r.start_s + r.e2e_s for r in results.requests if r.status == "ok"]
    span = max(times + ends, default=0.0)
    width = max(span / 40, 0.05)  # ~40 bins
    num_bins = int(span / width) + 1
    tok_bins, req_bins = [0] * num_bins, [0] * num_bins
    for t in times:
        tok_bins[min(int(t / width), num_bins - 1)] += 1
    for t in ends:
        req_bins[min(int(t / width), num_bins - 1)] += 1
    centers = [(i + 0.5) * width for i in range(num_bins)]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(centers, [n / width for n in tok_bins], label="output chunks/s")
    ax.set(xlabel="time since start (s)", ylabel="output chunks/s", title=f"throughput: {title}")
    ax2 = ax.twinx()
    ax2.plot(centers, [n / width for n in req_bins], color="tab:orange", label="requests/s")
    ax2.set_ylabel("completed requests/s")
    fig.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(paths[2], dpi=100)
    plt.close(fig)
    return paths
