"""Streamed chat requests that also read where a virtual model routed them.

:class:`loadtest.http_client.OpenAIStreamClient` times streams but never returns response
headers; a request to a virtual model (``auto``) says in its headers which served model
answered, why, and (after a cascade escalation) what the first attempt spent. :func:`send_routed`
sends one streamed chat completion and returns a :class:`RoutedOutcome` with the answering model
(the chunks' ``model``, checked against the header), the route reason, TTFT (to the first chunk
carrying choices, as ``vllm bench serve`` times it), the usage and the cascade usage.
:func:`run_poisson` sends a list of requests at seeded Poisson arrivals.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
import numpy as np

from loadtest.arrivals import arrival_times
from loadtest.clock import now_s
from loadtest.config import ArrivalConfig
from loadtest.http_client import new_request_id
from loadtest.sse import SSEParser
from loadtest.tiered_cost import RoutedOutcome, parse_cascade_usage

# NOTE: these mirror cluster.ingress.model_routing.router; the load tester is a client and
# imports no server code (import-linter), a unit test keeps the two in step.
ROUTED_MODEL_HEADER = "x-pdserve-routed-model"
ROUTE_REASON_HEADER = "x-pdserve-route-reason"
CASCADE_USAGE_HEADER = "x-pdserve-cascade-usage"


@dataclass(frozen=True)
class RoutedRequest:
    """One chat request of a workload, sent the same way whichever model it names."""

    request_id: str
    kind: str
    """The workload class it belongs to."""
    text: str
    """The user message."""
    max_tokens: int
    hard: bool = False
    """A routing rule is meant to send it to the large model."""
    headers: dict[str, str] = field(default_factory=dict)


class _StreamState:
    """Folds a chat stream's SSE data into the answering model, TTFT and usage."""

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s
        self.ttft_s: float | None = None
        self.model: str | None = None
        self.usage: dict[str, int] = {}
        self.done = False
        self.error: str | None = None

    def on_data(self, data: str, now_s: float) -> None:
        if data.strip() == "[DONE]":
            self.done = True
            return
        chunk = json.loads(data)
        if chunk.get("error"):
            self.error = f"error event: {chunk['error']}"
            return
        self.model = chunk.get("model") or self.model
        if chunk.get("choices") and self.ttft_s is None:
            self.ttft_s = now_s - self.start_s
        self.usage = chunk.get("usage") or self.usage


def chat_body(req: RoutedRequest, model: str) -> dict[str, object]:
    """The streamed, greedy, fixed-length chat body of ``req`` naming ``model``."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": req.text}],
        "max_tokens": req.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def send_routed(
    http: httpx.AsyncClient, base_url: str, req: RoutedRequest, model: str
) -> RoutedOutcome:
    """Stream ``req`` to ``model``; its outcome (never raises for server or network faults)."""
    failed = RoutedOutcome(req.request_id, req.kind, req.hard)
    headers = {"x-request-id": new_request_id(), **req.headers}
    url = base_url.rstrip("/") + "/v1/chat/completions"
    state = _StreamState(now_s())
    try:
        async with http.stream("POST", url, json=chat_body(req, model), headers=headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:300]
                return failed.with_error(f"HTTP {resp.status_code}: {text}")
            parser = SSEParser()
            async for raw in resp.aiter_bytes():
                for event in parser.feed(raw):
                    state.on_data(event.data, now_s())
            for event in parser.close():
                state.on_data(event.data, now_s())
            routed = resp.headers.get(ROUTED_MODEL_HEADER)
            reason = resp.headers.get(ROUTE_REASON_HEADER)
            cascade = parse_cascade_usage(resp.headers.get(CASCADE_USAGE_HEADER))
    except (httpx.HTTPError, ValueError) as e:
        return failed.with_error(f"{type(e).__name__}: {e}")
    if state.error or not state.done or state.ttft_s is None:
        return failed.with_error(state.error or "the stream ended without [DONE] or tokens")
    if routed is not None and routed != state.model:
        return failed.with_error(f"{ROUTED_MODEL_HEADER} {routed!r} != model {state.model!r}")
    return RoutedOutcome(
        req.request_id,
        req.kind,
        req.hard,
        model=state.model,
        reason=reason,
        ttft_s=state.ttft_s,
        prompt_tokens=int(state.usage.get("prompt_tokens", 0)),
        completion_tokens=int(state.usage.get("completion_tokens", 0)),
        cascade=cascade,
    )


async def run_poisson(
    http: httpx.AsyncClient,
    base_url: str,
    requests: Sequence[RoutedRequest],
    model: str,
    *,
    rate: float,
    seed: int,
) -> list[RoutedOutcome]:
    """Send every request to ``model`` at seeded Poisson arrivals (``rate`` per second), all
    concurrently; the outcomes in request order."""
    arrivals = ArrivalConfig.model_validate(
        {"request_rate": rate, "num_requests": max(1, len(requests)), "seed": seed}
    )
    offsets = arrival_times(arrivals, np.random.default_rng(seed))
    start_s = now_s()

    async def at(offset_s: float, req: RoutedRequest) -> RoutedOutcome:
        await asyncio.sleep(max(0.0, start_s + offset_s - now_s()))
        return await send_routed(http, base_url, req, model)

    return list(await asyncio.gather(*(at(next(offsets), req) for req in requests)))
