"""Summary metrics, defined as ``vllm bench serve`` defines them, under the same JSON names.

Over successful requests only:

- TTFT: request sent -> first token chunk. E2EL: request sent -> last token chunk.
- TPOT: ``(e2el - ttft) / (output_tokens - 1)`` per request with more than one output token.
- ITL: every gap between successive token chunks, pooled over all requests.
- Throughput: ``completed / duration``, ``output tokens / duration``, ``(input + output) /
  duration``; ``duration`` runs from the first dispatch to the last answer.
- Goodput: requests meeting every SLO set (``ttft``, ``tpot``, ``e2el`` in ms; a request with one
  output token has TPOT 0) per second of duration; ``None`` without SLOs.

Mean/median/std/percentiles use numpy (linear interpolation); an empty list reports 0, as vLLM
does. Failed requests appear only in ``failed``, ``failures_by_kind`` and ``failure_reasons``
(grouped by kind and message, ``failures.py``). Runs of the long-short mix add an
``interference`` section (``interference.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from loadtest.config import SloConfig
from loadtest.failures import failure_reasons
from loadtest.interference import interference_summary
from loadtest.types import RequestRecord

METRIC_NAMES = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")


def percentile_key(metric: str, percentile: float) -> str:
    """vLLM's field name: ``p99_ttft_ms``, ``p99.9_itl_ms``."""
    word = str(int(percentile)) if float(percentile).is_integer() else str(percentile)
    return f"p{word}_{metric}_ms"


def metric_values_s(records: Sequence[RequestRecord]) -> dict[str, list[float]]:
    """Per-metric sample lists in seconds (TPOT only for requests with >1 output token)."""
    ok = [r for r in records if r.success]
    return {
        "ttft": [r.ttft_s for r in ok],
        "tpot": [r.tpot_s for r in ok if r.output_tokens > 1],
        "itl": [gap for r in ok for gap in r.itl_s],
        "e2el": [r.latency_s for r in ok],
    }


def is_good(record: RequestRecord, slo: SloConfig) -> bool:
    """True if a successful ``record`` meets every SLO that is set."""
    bounds_ms = (
        (slo.ttft_ms, record.ttft_s),
        (slo.tpot_ms, record.tpot_s),
        (slo.e2el_ms, record.latency_s),
    )
    return record.success and all(
        bound is None or value * 1000.0 <= bound for bound, value in bounds_ms
    )


def has_slo(slo: SloConfig) -> bool:
    """True if any SLO is set."""
    return any(v is not None for v in (slo.ttft_ms, slo.tpot_ms, slo.e2el_ms))


def peak_stats(records: Sequence[RequestRecord]) -> tuple[float, int]:
    """(max output tokens in any 1-second bucket, peak concurrent requests), as vLLM reports."""
    ok = [r for r in records if r.success]
    if not ok:
        return 0.0, 0
    origin = min(r.start_s for r in ok)
    buckets: Counter[int] = Counter()
    for r in ok:
        token_time = r.start_s + r.ttft_s
        buckets[int(token_time - origin)] += 1
        for gap in r.itl_s:
            token_time += gap
            buckets[int(token_time - origin)] += 1
    events = sorted([(r.start_s, 1) for r in ok] + [(r.start_s + r.latency_s, -1) for r in ok])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return float(max(buckets.values())), peak


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    slo: SloConfig,
    percentiles: Sequence[float] = (99.0,),
    percentile_metrics: Sequence[str] = DEFAULT_PERCENTILE_METRICS,
) -> dict[str, Any]:
    """The metric fields of the summary JSON (run settings are added by the caller)."""
    ok = [r for r in records if r.success]
    total_input = sum(r.prompt_tokens for r in ok)
    total_output = sum(r.output_tokens for r in ok)
    good = sum(1 for r in ok if is_good(r, slo))
    max_tokens_per_s, max_concurrent = peak_stats(records)
    failures = Counter(r.failure_kind.value for r in records if r.failure_kind is not None)

    def per_s(count: float) -> float:
        # NOTE: a run whose every request failed at once can take no measurable time
        return count / duration_s if duration_s > 0 else 0.0

    summary: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "failures_by_kind": dict(sorted(failures.items())),
        "failure_reasons": failure_reasons(records),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": per_s(len(ok)),
        "request_goodput": per_s(good) if has_slo(slo) else None,
        "output_throughput": per_s(total_output),
        "total_token_throughput": per_s(total_input + total_output),
        "max_output_tokens_per_s": max_tokens_per_s,
        "max_concurrent_requests": max_concurrent,
    }
    for metric, values in metric_values_s(records).items():
        samples = np.asarray(values or [0.0], dtype=np.float64) * 1000.0
        summary[f"mean_{metric}_ms"] = float(np.mean(samples))
        summary[f"median_{metric}_ms"] = float(np.median(samples))
        summary[f"std_{metric}_ms"] = float(np.std(samples))
        if metric in percentile_metrics:
            for p in percentiles:
                summary[percentile_key(metric, p)] = float(np.percentile(samples, p))
    interference = interference_summary(records)
    if interference is not None:
        summary["interference"] = interference
    return summary
