"""How long prompts hurt short requests: TTFT and ITL of the short ones while a long one prefills.

A long request *prefills* from its start until its first token (``[start, start + ttft]``; the
server may queue it first, which counts: the prompt is still ahead of its first token). A short
request's TTFT counts as *during* a long prefill when its own wait for the first token
``[start, start + ttft]`` overlaps one; each of its inter-token gaps counts as during one when
the gap overlaps one. Everything else is *outside*. Requests are classed by their session label
(``long`` / ``short``, set by the ``long-short-mix`` workload); other workloads have no section.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from loadtest.types import RequestRecord

Window = tuple[float, float]
INTERFERENCE_PERCENTILES = (50.0, 90.0, 99.0)


def prefill_windows(records: Sequence[RequestRecord]) -> list[Window]:
    """``[start, first token]`` of every successful long request, in start order."""
    longs = [r for r in records if r.label == "long" and r.success]
    return sorted((r.start_s, r.start_s + r.ttft_s) for r in longs)


def overlaps(begin_s: float, end_s: float, windows: Sequence[Window]) -> bool:
    """True when ``[begin_s, end_s]`` meets any window."""
    return any(begin_s <= w_end and w_begin <= end_s for w_begin, w_end in windows)


def token_times(record: RequestRecord) -> np.ndarray:
    """Arrival time of every token chunk of ``record`` (run-relative seconds)."""
    gaps = np.asarray(record.itl_s, dtype=np.float64)
    return record.start_s + record.ttft_s + np.concatenate(([0.0], np.cumsum(gaps)))


def split_short_samples(
    records: Sequence[RequestRecord], windows: Sequence[Window]
) -> dict[str, dict[str, list[float]]]:
    """Short requests' TTFT and ITL samples (seconds), ``during`` vs ``outside`` long prefills."""
    out: dict[str, dict[str, list[float]]] = {
        side: {"ttft": [], "itl": []} for side in ("during", "outside")
    }
    for r in records:
        if r.label != "short" or not r.success:
            continue
        side = "during" if overlaps(r.start_s, r.start_s + r.ttft_s, windows) else "outside"
        out[side]["ttft"].append(r.ttft_s)
        times = token_times(r)
        for begin_s, end_s in itertools.pairwise(times.tolist()):
            gap_side = "during" if overlaps(begin_s, end_s, windows) else "outside"
            out[gap_side]["itl"].append(end_s - begin_s)
    return out


def _stats(samples_s: list[float], metric: str) -> dict[str, Any]:
    stats: dict[str, Any] = {f"num_{metric}_samples": len(samples_s)}
    if not samples_s:
        return (
            stats
            | {f"mean_{metric}_ms": None}
            | {f"p{p:g}_{metric}_ms": None for p in INTERFERENCE_PERCENTILES}
        )
    values_ms = np.asarray(samples_s, dtype=np.float64) * 1000.0
    stats[f"mean_{metric}_ms"] = float(values_ms.mean())
    for p in INTERFERENCE_PERCENTILES:
        stats[f"p{p:g}_{metric}_ms"] = float(np.percentile(values_ms, p))
    return stats


def interference_summary(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """The ``interference`` section of the summary; None without long and short requests."""
    longs = [r for r in records if r.label == "long"]
    shorts = [r for r in records if r.label == "short"]
    if not longs or not shorts:
        return None
    windows = prefill_windows(records)
    samples = split_short_samples(records, windows)
    sections = {
        "short_during_long_prefill": samples["during"],
        "short_outside_long_prefill": samples["outside"],
        "short_all": {
            metric: samples["during"][metric] + samples["outside"][metric]
            for metric in ("ttft", "itl")
        },
    }
    summary: dict[str, Any] = {
        "long_requests": len(longs),
        "long_completed": sum(1 for r in longs if r.success),
        "long_prompt_tokens_max": max(r.prompt_tokens for r in longs),
        "short_requests": len(shorts),
        "short_completed": sum(1 for r in shorts if r.success),
        "long_prefill_total_s": float(sum(end - begin for begin, end in windows)),
    }
    for name, section in sections.items():
        summary[name] = _stats(section["ttft"], "ttft") | _stats(section["itl"], "itl")
    return summary
