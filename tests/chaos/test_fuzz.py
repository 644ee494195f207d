"""Property-based fuzzing of the HTTP API from its own OpenAPI document (schemathesis): every
route the live app describes gets generated bodies, valid and not; no case may get a 5xx and
the server must be healthy after each one. ``/admin/faults`` is left out (it kills replicas on
purpose). Generation lengths are capped (``max_tokens`` <= 8) so a case costs a fraction of a
second on CPU; everything else is as generated. The short form tries a few cases per route,
``make chaos`` many; the tally goes to ``PDSERVE_CHAOS_RESULTS`` for ``docs/reliability.md``."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.chaos.harness import FULL
from tests.conftest import ServingApp

pytestmark = [pytest.mark.ray, pytest.mark.timeout(1800)]

EXAMPLES = 150 if FULL else 12
MAX_TOKENS = 8
TALLY: Counter[str] = Counter()


@pytest.fixture(scope="module")
def api_schema(serving_app: ServingApp) -> Iterator[Any]:
    yield schemathesis.openapi.from_url(serving_app.url("/openapi.json")).exclude(
        path="/admin/faults"
    )
    path = os.environ.get("PDSERVE_CHAOS_RESULTS")
    if path and TALLY:
        with Path(path).open("a") as f:
            f.write(json.dumps({"fuzz": dict(TALLY)}) + "\n")


schema = schemathesis.pytest.from_fixture("api_schema")


def _cap_lengths(body: Any) -> None:
    if isinstance(body, dict):
        for field in ("max_tokens", "max_completion_tokens"):
            value = body.get(field)
            if value is None or (isinstance(value, int) and value > MAX_TOKENS):
                body[field] = MAX_TOKENS


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))  # fmt: skip
def test_no_input_gets_a_server_error(case: Any, serving_app: ServingApp) -> None:
    _cap_lengths(case.body)
    response = case.call(base_url=serving_app.url(""), timeout=120)
    TALLY[f"{case.method} {case.path} {response.status_code // 100}xx"] += 1
    assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
    health = httpx.get(serving_app.url("/health"), timeout=30)
    assert health.status_code == 200, health.text
