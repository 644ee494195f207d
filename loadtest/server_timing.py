"""The server's TTFT breakdown per request (``usage.ttft_breakdown``, pdserve's extension), its
summary per prefill path, and a stacked plot.

Stages, in the order they happen: ``dispatch`` (admission, routing, calls between processes),
``queue`` (waiting for the first batch), ``prefill``, ``export`` (remote path: pinning and
exporting the KV), then on decode ``transfer`` (pulling the KV) and ``first_decode``. The first
four make up TTFT; on the remote path the last two come after the first token and before the
second. A server that does not report the breakdown (another engine) leaves it empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

STAGES = ("dispatch", "queue", "prefill", "export", "transfer", "first_decode")


@dataclass(frozen=True)
class ServerTiming:
    """One request's breakdown as the server reported it (milliseconds)."""

    path: str
    ttft_ms: float
    stages_ms: tuple[float, ...]
    """One per :data:`STAGES` entry."""

    @classmethod
    def parse(cls, usage: dict[str, Any]) -> ServerTiming | None:
        """The breakdown in a ``usage`` object, or None when it has none or it is malformed."""
        body = usage.get("ttft_breakdown")
        if not isinstance(body, dict):
            return None
        try:
            stages = tuple(float(body[f"{stage}_ms"]) for stage in STAGES)
            return cls(str(body["path"]), float(body["ttft_ms"]), stages)
        except (KeyError, TypeError, ValueError):
            return None

    def stage_ms(self, stage: str) -> float:
        """The time of one stage."""
        return self.stages_ms[STAGES.index(stage)]


def breakdown_summary(timings: Sequence[ServerTiming]) -> dict[str, Any]:
    """Per prefill path: how many requests reported, and the mean and p90 of TTFT and of
    each stage (ms); empty when no request carried a breakdown."""
    summary: dict[str, Any] = {}
    for path in sorted({t.path for t in timings}):
        mine = [t for t in timings if t.path == path]
        entry: dict[str, Any] = {"count": len(mine)}
        columns = {"ttft": [t.ttft_ms for t in mine]}
        columns |= {stage: [t.stage_ms(stage) for t in mine] for stage in STAGES}
        for name, values in columns.items():
            entry[f"mean_{name}_ms"] = round(float(np.mean(values)), 3)
            entry[f"p90_{name}_ms"] = round(float(np.percentile(values, 90)), 3)
        summary[path] = entry
    return summary


def write_breakdown_plot(
    starts_s: Sequence[float], timings: Sequence[ServerTiming], path: Path
) -> Path | None:
    """A stacked bar per request (in start order): each stage's milliseconds, TTFT marked;
    None (nothing written) when no request reported a breakdown."""
    if not timings:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = np.argsort(np.asarray(starts_s))
    x = np.arange(len(order))
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = np.zeros(len(order))
    for stage in STAGES:
        heights = np.asarray([timings[i].stage_ms(stage) for i in order])
        ax.bar(x, heights, bottom=bottom, width=1.0, label=stage)
        bottom += heights
    ax.plot(x, [timings[i].ttft_ms for i in order], "k.", markersize=3, label="TTFT (server)")
    ax.set(xlabel="request (by start time)", ylabel="ms", title="Server-reported TTFT breakdown")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
