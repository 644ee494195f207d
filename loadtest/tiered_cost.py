"""What a tiered-routing run cost and where its requests went (pure; no Ray, no HTTP).

Cost is counted the way an operator pays for compute: every prefilled and every generated token
costs the answering model's active parameters per token (a dense model's parameters, a MoE's
shared plus top-k experts). An escalated cascade answer also pays for the cheap first attempt,
which the ingress reports in ``x-pdserve-cascade-usage``. :func:`pass_summary` folds one pass's
:class:`RoutedOutcome` s into the numbers ``benchmarks/model_tier_routing.py`` prints.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class CascadeUsage:
    """The tokens a cascade's first (cheap) attempt spent before it was escalated."""

    model: str
    prompt_tokens: int
    completion_tokens: int


def parse_cascade_usage(value: str | None) -> CascadeUsage | None:
    """``model=NAME; prompt_tokens=N; completion_tokens=M`` as a :class:`CascadeUsage`; None
    when the header is absent. ValueError when it is present but malformed."""
    if value is None:
        return None
    fields: dict[str, str] = {}
    for part in value.split(";"):
        key, sep, item = part.strip().partition("=")
        if not sep:
            raise ValueError(f"malformed cascade usage {value!r}: {part!r} has no '='")
        fields[key.strip()] = item.strip()
    try:
        return CascadeUsage(
            model=fields["model"],
            prompt_tokens=int(fields["prompt_tokens"]),
            completion_tokens=int(fields["completion_tokens"]),
        )
    except (KeyError, ValueError) as e:
        raise ValueError(f"malformed cascade usage {value!r}: {e}") from e


@dataclass(frozen=True)
class RoutedOutcome:
    """One request of one pass: what it was, who answered, how fast and how many tokens."""

    request_id: str
    kind: str
    """The workload class (easy, long, hinted, regex)."""
    hard: bool
    """A routing rule is meant to send this request to the large model."""
    model: str | None = None
    """The served model that answered (None: the request failed)."""
    reason: str | None = None
    """``x-pdserve-route-reason`` (None when the request named a served model)."""
    ttft_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cascade: CascadeUsage | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Answered, with no error."""
        return self.error is None and self.model is not None

    def with_error(self, error: str) -> RoutedOutcome:
        """This request, failed with ``error`` (no model, TTFT or tokens)."""
        return replace(
            self, model=None, ttft_s=None, prompt_tokens=0, completion_tokens=0, error=error
        )


def request_cost(outcome: RoutedOutcome, active_params: Mapping[str, int]) -> float:
    """Parameter-token cost: (prompt + completion tokens) x the answering model's active
    parameters, plus the cascade's first attempt at its own model's; 0 for a failed request."""
    if not outcome.ok or outcome.model is None:
        return 0.0
    tokens = outcome.prompt_tokens + outcome.completion_tokens
    cost = float(tokens) * active_params[outcome.model]
    first = outcome.cascade
    if first is not None:
        cost += float(first.prompt_tokens + first.completion_tokens) * active_params[first.model]
    return cost


def _ttft_ms(outcomes: Sequence[RoutedOutcome]) -> dict[str, float | None]:
    samples = [o.ttft_s * 1000.0 for o in outcomes if o.ttft_s is not None]
    if not samples:
        return {"p50_ttft_ms": None, "p99_ttft_ms": None}
    return {
        "p50_ttft_ms": float(np.percentile(samples, 50.0)),
        "p99_ttft_ms": float(np.percentile(samples, 99.0)),
    }


def pass_summary(
    outcomes: Sequence[RoutedOutcome], active_params: Mapping[str, int]
) -> dict[str, Any]:
    """Requests, failures, share and TTFT per model, route reasons and costs of one pass."""
    answered = [o for o in outcomes if o.ok]
    models = sorted({o.model for o in answered if o.model is not None})
    per_model: dict[str, Any] = {}
    for model in models:
        mine = [o for o in answered if o.model == model]
        per_model[model] = {
            "num_requests": len(mine),
            "share": len(mine) / len(outcomes),
            **_ttft_ms(mine),
            "prompt_tokens": sum(o.prompt_tokens for o in mine),
            "completion_tokens": sum(o.completion_tokens for o in mine),
            "cost": sum(request_cost(o, active_params) for o in mine),
        }
    by_kind: dict[str, Counter[str]] = {}
    for o in outcomes:
        by_kind.setdefault(o.kind, Counter())[o.model or "failed"] += 1
    return {
        "num_requests": len(outcomes),
        "failed": len(outcomes) - len(answered),
        "errors": [f"{o.request_id}: {o.error}" for o in outcomes if not o.ok][:10],
        "models": per_model,
        "by_kind": {kind: dict(counts) for kind, counts in sorted(by_kind.items())},
        "route_reasons": dict(Counter(o.reason for o in answered if o.reason is not None)),
        "num_escalated": sum(1 for o in answered if o.cascade is not None),
        **_ttft_ms(answered),
        "total_cost": sum(request_cost(o, active_params) for o in answered),
    }


def share_answered_by(outcomes: Sequence[RoutedOutcome], model: str, *, hard: bool) -> float | None:
    """The share of the ``hard`` (or easy) requests that ``model`` answered; a failed request
    counts as not answered by it. None when there are no such requests."""
    picked = [o for o in outcomes if o.hard == hard]
    if not picked:
        return None
    return sum(1 for o in picked if o.ok and o.model == model) / len(picked)
