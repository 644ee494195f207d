"""Property-based fuzzing of the HTTP API from its own OpenAPI document (schemathesis): every
route the live app describes gets generated bodies, valid and not; no case may get a 5xx and
the server must be healthy after each one. ``/admin/faults`` is left out (it kills replicas on
purpose). Bodies name the served model (so they get past the model check) and generation
lengths are capped (``max_tokens`` <= 8) so a case costs a fraction of a second on CPU;
everything else is as generated. The short form tries a few cases per route,
``make chaos`` many; the tally goes to ``PDSERVE_CHAOS_RESULTS`` for ``docs/reliability.md``."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from tests.chaos.harness import FULL
from tests.cluster_fixtures import ServingApp
from tests.integration.support import SERVED_NAME

pytestmark = [pytest.mark.ray, pytest.mark.timeout(1800)]

EXAMPLES = 100 if FULL else 6
"""Cases per route and generation mode (valid bodies, then invalid ones)."""
MAX_TOKENS = 8
TALLY: Counter[str] = Counter()


def _aim(body: Any) -> None:
    """Name the served model (so generated bodies get past the model check and into
    validation and generation) and cap the generation length."""
    if isinstance(body, dict):
        if "model" in body or "prompt" in body or "messages" in body:
            body["model"] = SERVED_NAME
        for field in ("max_tokens", "max_completion_tokens"):
            value = body.get(field)
            if value is None or (isinstance(value, int) and value > MAX_TOKENS):
                body[field] = MAX_TOKENS


def _fuzz(operation: Any, mode: GenerationMode, base_url: str, health_url: str) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        _aim(case.body)
        response = case.call(base_url=base_url, timeout=120)
        TALLY[f"{case.method} {case.path} {response.status_code // 100}xx"] += 1
        assert response.status_code < 500, (case.method, case.path, case.body, response.text[:500])
        health = httpx.get(health_url, timeout=30)
        assert health.status_code == 200, health.text

    check()


def test_no_input_gets_a_server_error(serving_app: ServingApp) -> None:
    schema = schemathesis.openapi.from_url(serving_app.url("/openapi.json"))
    operations = [
        result.ok() for result in schema.exclude(path="/admin/faults").get_all_operations()
    ]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions"}
    try:
        for operation in operations:
            _fuzz(
                operation, GenerationMode.POSITIVE, serving_app.url(""), serving_app.url("/health")
            )
            if operation.method.upper() == "POST":  # a body to break (GETs take no input)
                _fuzz(
                    operation,
                    GenerationMode.NEGATIVE,
                    serving_app.url(""),
                    serving_app.url("/health"),
                )
    finally:
        path = os.environ.get("PDSERVE_CHAOS_RESULTS")
        if path and TALLY:
            with Path(path).open("a") as f:
                f.write(json.dumps({"fuzz": dict(TALLY)}) + "\n")
