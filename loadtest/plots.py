"""PNG plots of a run (matplotlib, Agg backend: no display needed).

- ``ttft_vs_input``: TTFT of each successful request against its prompt length;
- ``itl_cdf``: the empirical CDF of every inter-token gap;
- ``timeline``: output tokens per second and requests in flight, per 1-second bucket;
- ``ttft_breakdown``: the server-reported stages of each request's TTFT, stacked (when the
  server reports them: ``loadtest.server_timing``);
- ``interference`` (long-short mix only): the short requests' TTFT over time with the long
  prompts' prefill windows shaded, and their ITL CDF during those windows against outside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.interference import prefill_windows, split_short_samples
from loadtest.server_timing import write_breakdown_plot
from loadtest.types import RequestRecord


def timeline(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(output tokens per second, requests in flight) per 1-s bucket from the first start."""
    ok = [r for r in records if r.success]
    if not ok:
        return np.zeros(0), np.zeros(0)
    end_s = max(r.start_s + r.latency_s for r in ok)
    num_buckets = int(np.ceil(end_s)) + 1
    tokens = np.zeros(num_buckets)
    in_flight = np.zeros(num_buckets)
    for r in ok:
        times = r.start_s + r.ttft_s + np.concatenate(([0.0], np.cumsum(r.itl_s)))
        np.add.at(tokens, np.clip(times.astype(int), 0, num_buckets - 1), 1)
        first, last = int(r.start_s), int(np.ceil(r.start_s + r.latency_s))
        in_flight[first : min(last, num_buckets)] += 1
    return tokens, in_flight


def write_plots(records: Sequence[RequestRecord], stem: Path) -> list[Path]:
    """Write the three PNGs next to ``stem`` (``stem.ttft_vs_input.png`` ...); return paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if r.success]
    paths = [stem.with_name(stem.name + f".{kind}.png") for kind in ("ttft_vs_input", "itl_cdf")]
    paths.append(stem.with_name(stem.name + ".timeline.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([r.prompt_tokens for r in ok], [r.ttft_s * 1000 for r in ok], s=8)
    ax.set(xlabel="prompt tokens", ylabel="TTFT (ms)", title="TTFT vs input length")
    fig.tight_layout()
    fig.savefig(paths[0])
    plt.close(fig)

    gaps_ms = np.sort([g * 1000 for r in ok for g in r.itl_s])
    fig, ax = plt.subplots(figsize=(6, 4))
    if gaps_ms.size:
        ax.plot(gaps_ms, np.arange(1, gaps_ms.size + 1) / gaps_ms.size)
    ax.set(xlabel="inter-token latency (ms)", ylabel="fraction of gaps", title="ITL CDF")
    fig.tight_layout()
    fig.savefig(paths[1])
    plt.close(fig)

    tokens, in_flight = timeline(records)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(np.arange(tokens.size), tokens, label="output tokens/s", color="tab:blue")
    ax.set(xlabel="time (s)", ylabel="output tokens/s", title="Throughput and concurrency")
    other = ax.twinx()
    other.step(np.arange(in_flight.size), in_flight, where="post", color="tab:orange")
    other.set_ylabel("requests in flight")
    fig.tight_layout()
    fig.savefig(paths[2])
    plt.close(fig)
    if any(r.label == "long" for r in records) and any(r.label == "short" for r in records):
        interference = stem.with_name(stem.name + ".interference.png")
        paths.append(write_interference_plot(records, interference))
    timed = [r for r in ok if r.server_timing is not None]
    breakdown = write_breakdown_plot(
        [r.start_s for r in timed],
        [r.server_timing for r in timed if r.server_timing is not None],
        stem.with_name(stem.name + ".ttft_breakdown.png"),
    )
    return paths if breakdown is None else [*paths, breakdown]


def write_interference_plot(records: Sequence[RequestRecord], path: Path) -> Path:
    """Short-request TTFT over time under the long prefill windows, and short ITL CDFs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    windows = prefill_windows(records)
    samples = split_short_samples(records, windows)
    shorts = [r for r in records if r.label == "short" and r.success]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for begin_s, end_s in windows:
        left.axvspan(begin_s, end_s, color="tab:orange", alpha=0.2, lw=0)
    left.scatter([r.start_s for r in shorts], [r.ttft_s * 1000 for r in shorts], s=8)
    left.set(
        xlabel="request start (s); shaded: a long prompt prefilling",
        ylabel="short request TTFT (ms)",
        title="Short-request TTFT around long prompts",
    )
    for side, color in (("during", "tab:orange"), ("outside", "tab:blue")):
        gaps_ms = np.sort(np.asarray(samples[side]["itl"]) * 1000)
        if gaps_ms.size:
            fraction = np.arange(1, gaps_ms.size + 1) / gaps_ms.size
            right.plot(gaps_ms, fraction, color=color, label=f"{side} long prefill")
    right.set(xlabel="short-request ITL (ms)", ylabel="fraction of gaps", title="Short ITL CDF")
    right.set_xscale("log")
    right.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_sweep_plot(sweep: dict[str, Any], path: Path) -> Path:
    """Throughput and mean TTFT against load for a sweep summary; the knee is marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = [level["load"] for level in sweep["levels"]]
    metric = sweep["throughput_metric"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(loads, [level.get(metric) or 0.0 for level in sweep["levels"]], marker="o")
    ax.set(xlabel=sweep["mode"], ylabel=f"{metric} (req/s)", title="Throughput knee")
    if sweep["knee_load"] is not None:
        ax.axvline(sweep["knee_load"], color="tab:red", linestyle="--", label="knee")
        ax.legend()
    other = ax.twinx()
    other.plot(loads, [level.get("mean_ttft_ms") or 0.0 for level in sweep["levels"]], "x:")
    other.set_ylabel("mean TTFT (ms)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
