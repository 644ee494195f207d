"""The Grafana dashboard shipped in ``configs/grafana`` reads only what a running cluster exports:
every metric its queries (and its template variable) name is a family of the ingress's
``/metrics``, with the right suffix for its type, and every label a query groups or filters by is
a label of that metric's series."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.serve.config_file import REPO_CONFIGS
from tests.cluster_fixtures import ServingApp
from tests.integration.support import SERVED_NAME

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

DASHBOARD = REPO_CONFIGS / "grafana" / "pdserve-dashboard.json"
METRIC = re.compile(r"pdserve:[a-z0-9_:]+")
SUFFIXES = {"_total": {"counter"}, "_bucket": {"histogram"}, "_sum": {"histogram", "summary"},
            "_count": {"histogram", "summary"}}  # fmt: skip


def queries(node: Any) -> Iterator[str]:
    """Every PromQL string in the dashboard: panel targets and template variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from queries(item)


def family_of(name: str, types: dict[str, str]) -> str | None:
    """The exported family a query's series name belongs to, or None."""
    if name in types:
        return name
    for suffix, kinds in SUFFIXES.items():
        base = name.removesuffix(suffix)
        if base != name and types.get(base) in kinds:
            return base
    return None


def label_names(expr: str) -> set[str]:
    """Labels an expression groups by (``by (...)``) or filters on (``{label=...}``)."""
    names = {n.strip() for group in re.findall(r"by \(([^)]*)\)", expr) for n in group.split(",")}
    for selector in re.findall(r"\{([^}]*)\}", expr):
        names |= set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector))
    return names - {"", "le"}


def test_every_metric_the_dashboard_queries_is_exported(serving_app: ServingApp) -> None:
    long_prompt = "Dashboards read what the ingress exports, " * 4
    for prompt in ("Hi", long_prompt):  # one local and one remote prefill: histograms have series
        body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 3}
        response = httpx.post(serving_app.url("/v1/completions"), json=body, timeout=60)
        assert response.status_code == 200, response.text
    text = httpx.get(serving_app.url("/metrics"), timeout=60).text
    families = list(text_string_to_metric_families(text))
    types = {f.name: f.type for f in families}
    labels: dict[str, set[str]] = {}
    for family in families:
        for sample in family.samples:
            labels.setdefault(family.name, set()).update(sample.labels)
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = list(queries(dashboard))
    assert len(exprs) >= 20, "the dashboard lost its panels"
    named = {name for expr in exprs for name in METRIC.findall(expr)}
    missing = sorted(n for n in named if family_of(n, types) is None)
    assert not missing, f"queried but not exported: {missing}"
    for expr in exprs:
        for name in METRIC.findall(expr):
            family = family_of(name, types)
            assert family is not None
            if family in labels:  # a labelled family with no series yet has no labels to check
                unknown = label_names(expr) - labels[family] - {"le"}
                assert not unknown, f"{expr}: {family} has no label(s) {sorted(unknown)}"
