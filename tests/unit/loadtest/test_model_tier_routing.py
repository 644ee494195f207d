"""Tiered-routing helpers: cascade-usage parsing, parameter-token cost, per-pass summaries and
the routed chat client (against an ``httpx.MockTransport`` server)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from cluster.ingress.model_routing import router
from loadtest import routed_client
from loadtest.routed_client import RoutedRequest, send_routed
from loadtest.tiered_cost import (
    CascadeUsage,
    RoutedOutcome,
    parse_cascade_usage,
    pass_summary,
    request_cost,
    share_answered_by,
)

PARAMS = {"small": 2, "large": 10}


def answered(rid: str, model: str, *, hard: bool = False, ttft_s: float = 0.1) -> RoutedOutcome:
    return RoutedOutcome(
        rid,
        "hard" if hard else "easy",
        hard,
        model,
        "r",
        ttft_s,
        prompt_tokens=3,
        completion_tokens=2,
    )


def test_cascade_usage_parses_and_rejects_malformed() -> None:
    value = "model=small; prompt_tokens=12; completion_tokens=7"
    assert parse_cascade_usage(value) == CascadeUsage("small", 12, 7)
    assert parse_cascade_usage(None) is None
    for bad in (
        "model=small; prompt_tokens=12",
        "model small",
        "model=s; prompt_tokens=x; completion_tokens=1",
    ):
        with pytest.raises(ValueError, match="malformed cascade usage"):
            parse_cascade_usage(bad)


def test_cost_is_tokens_times_active_params_plus_the_cascade_attempt() -> None:
    assert request_cost(answered("a", "large"), PARAMS) == 5 * 10
    escalated = RoutedOutcome(
        "b", "easy", False, "large", "escalated_length", 0.1, 3, 2, CascadeUsage("small", 3, 4)
    )
    assert request_cost(escalated, PARAMS) == 5 * 10 + 7 * 2
    assert request_cost(answered("c", "large").with_error("boom"), PARAMS) == 0.0


def test_pass_summary_shares_ttft_costs_and_failures() -> None:
    outcomes = [
        answered("a", "small", ttft_s=0.1),
        answered("b", "small", ttft_s=0.3),
        answered("c", "large", hard=True, ttft_s=1.0),
        answered("d", "large", hard=True).with_error("HTTP 500"),
    ]
    summary = pass_summary(outcomes, PARAMS)
    assert summary["failed"] == 1
    assert summary["errors"] == ["d: HTTP 500"]
    assert summary["models"]["small"]["share"] == 0.5
    assert summary["models"]["small"]["p50_ttft_ms"] == pytest.approx(200.0)
    assert summary["models"]["large"]["p99_ttft_ms"] == pytest.approx(1000.0)
    assert summary["by_kind"] == {"easy": {"small": 2}, "hard": {"large": 1, "failed": 1}}
    assert summary["total_cost"] == 2 * 5 * 2 + 5 * 10
    assert share_answered_by(outcomes, "large", hard=True) == 0.5
    assert share_answered_by(outcomes, "small", hard=False) == 1.0
    assert share_answered_by(outcomes[:2], "large", hard=True) is None


def test_client_header_names_match_the_ingress() -> None:
    assert routed_client.ROUTED_MODEL_HEADER == router.ROUTED_MODEL_HEADER
    assert routed_client.ROUTE_REASON_HEADER == router.ROUTE_REASON_HEADER
    assert routed_client.CASCADE_USAGE_HEADER == router.CASCADE_USAGE_HEADER


def sse(*chunks: object) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def serve_once(status: int, headers: dict[str, str], body: bytes) -> RoutedOutcome:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, headers=headers, content=body)

    async def go() -> RoutedOutcome:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            req = RoutedRequest("r1", "hinted", "Prove it", 2, True, {"x-pdserve-tier": "hard"})
            return await send_routed(http, "http://test", req, "auto")

    outcome = asyncio.run(go())
    sent = json.loads(seen[0].content)
    assert seen[0].headers["x-pdserve-tier"] == "hard"
    assert (sent["model"], sent["ignore_eos"], sent["stream"]) == ("auto", True, True)
    return outcome


def test_client_reads_model_reason_usage_and_cascade() -> None:
    headers = {
        "x-pdserve-routed-model": "large",
        "x-pdserve-route-reason": "escalated_length",
        "x-pdserve-cascade-usage": "model=small; prompt_tokens=8; completion_tokens=2",
    }
    body = sse(
        {"model": "large", "choices": [{"delta": {"content": "a"}}]},
        {"model": "large", "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 2}},
    )
    outcome = serve_once(200, headers, body)
    assert (outcome.model, outcome.reason, outcome.ok) == ("large", "escalated_length", True)
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (8, 2)
    assert outcome.cascade == CascadeUsage("small", 8, 2)
    assert outcome.ttft_s is not None and outcome.hard


def test_client_fails_on_status_mismatch_and_truncation() -> None:
    chunk = {"model": "small", "choices": [{"delta": {"content": "a"}}]}
    assert serve_once(503, {}, b'{"error": "busy"}').error == 'HTTP 503: {"error": "busy"}'
    mismatch = serve_once(200, {"x-pdserve-routed-model": "large"}, sse(chunk))
    assert mismatch.error is not None and "!=" in mismatch.error
    truncated = serve_once(200, {}, f"data: {json.dumps(chunk)}\n\n".encode())
    assert not truncated.ok and truncated.model is None
