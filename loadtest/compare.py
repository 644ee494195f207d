"""``pdserve bench compare A.json B.json``: two summaries side by side (ours or vLLM's).

Rows are the headline numbers followed by every latency field either file has; the change is
``(B - A) / A``; "better" knows throughputs rise and latencies and failures fall.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from loadtest.types import THROUGHPUT_KEYS

_HEADLINE = (*THROUGHPUT_KEYS, "max_output_tokens_per_s", "max_concurrent_requests")
_HIGHER_IS_BETTER = {
    "completed",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
}
_LOWER_IS_BETTER_EXTRA = {"failed"}
_EQUAL_TOLERANCE = 1e-9


@dataclass(frozen=True)
class ComparisonRow:
    """One metric of both runs."""

    metric: str
    a: float | None
    b: float | None
    change_pct: float | None
    better: str | None


def load_result(path: Path) -> dict[str, Any]:
    """A summary JSON file; for vLLM's ``--append-result`` files, the last record."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e}", param="path") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        lines = [line for line in text.splitlines() if line.strip()]
        try:
            data = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not a benchmark result JSON: {e}", param="path") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a benchmark result JSON object", param="path")
    return data


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _better(metric: str, a: float, b: float) -> str:
    if abs(a - b) <= _EQUAL_TOLERANCE * max(abs(a), abs(b), 1.0):
        return "="
    if metric in _HIGHER_IS_BETTER:
        return "B" if b > a else "A"
    if metric.endswith("_ms") or metric in _LOWER_IS_BETTER_EXTRA:
        return "B" if b < a else "A"
    return ""


def compare_results(a: dict[str, Any], b: dict[str, Any]) -> list[ComparisonRow]:
    """Rows for every numeric headline or latency metric present in either summary."""
    latency = sorted({k for k in (*a, *b) if k.endswith("_ms")})
    rows = []
    for metric in (*_HEADLINE, *latency):
        va, vb = _number(a.get(metric)), _number(b.get(metric))
        if va is None and vb is None:
            continue
        change = None
        if va is not None and vb is not None and va != 0.0:
            change = (vb - va) / abs(va) * 100.0
        better = _better(metric, va, vb) if va is not None and vb is not None else None
        rows.append(ComparisonRow(metric, va, vb, change, better or None))
    return rows
