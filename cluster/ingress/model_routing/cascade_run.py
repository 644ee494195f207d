"""Running a cascade: the cheap model answers first, the strong one when a check fires.

The first answer is always generated whole (a check such as ``finish_reason == "length"`` or
the mean token log-probability needs all of it), with the sampled tokens' log-probabilities
requested when a check reads them. When no check fires that answer is the response: as JSON, or
replayed as the SSE stream the client asked for (with the forced log-probabilities removed
again). When one fires, the request runs again on ``cascade.escalate_to`` exactly as the client
sent it (streamed if it asked), and ``x-pdserve-cascade-usage`` tells what the first attempt
spent. Either way the decision is counted once, and the routing headers name the model that
answered and why.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fastapi.responses import JSONResponse, Response

from cluster.ingress.http.event_stream import SSE_DONE, EventStreamResponse, sse_event
from cluster.ingress.http.request_gate import Admission
from cluster.ingress.model_routing.cascade import (
    escalation_reason,
    needs_logprobs,
    strip_logprobs,
    summarize_answer,
    with_logprobs,
)
from cluster.ingress.model_routing.replay import as_stream_chunks
from cluster.ingress.model_routing.router import CASCADE_USAGE_HEADER, ModelPick, ModelRouter
from core.config.virtual_models import ACCEPTED_REASON, ESCALATED_PREFIX


@dataclass(frozen=True)
class Job:
    """One accepted HTTP request, as the handlers run it on a model."""

    request_id: str
    chat: bool
    request_headers: Mapping[str, str]
    arrival_s: float
    admission: Admission
    headers: dict[str, str]
    """The response headers (the request id, the routing headers)."""


GenerateFn = Callable[[ModelPick, Job], Awaitable[Response]]
"""Runs a pick's body on its model and renders the response (the handlers' ``_generate``)."""


class CascadeRunner:
    """Runs requests whose pick carries a cascade."""

    def __init__(self, router: ModelRouter, generate: GenerateFn) -> None:
        self._router = router
        self._generate = generate

    async def run(self, pick: ModelPick, job: Job) -> Response:
        """The response to ``pick`` (whose ``cascade`` is set)."""
        cascade = pick.cascade
        assert cascade is not None
        forced = needs_logprobs(cascade) and not _asked_logprobs(pick.data, chat=job.chat)
        first = {k: v for k, v in pick.data.items() if k != "stream_options"}
        first["stream"] = False
        if forced:
            first = with_logprobs(first, chat=job.chat)
        response = await self._generate(
            replace(pick, data=first), replace(job, headers=dict(job.headers))
        )
        if response.status_code != 200:
            response.headers.update(pick.headers())
            return response
        body = json.loads(bytes(response.body))
        reason = escalation_reason(cascade, summarize_answer(body, chat=job.chat))
        if reason is None:
            return self._accept(pick, job, strip_logprobs(body) if forced else body)
        strong = pick.moved_to(
            self._router.table.find(cascade.escalate_to), ESCALATED_PREFIX + reason
        )
        job.headers.update(strong.headers())
        job.headers[CASCADE_USAGE_HEADER] = _spent(pick.route.name, body)
        escalated = await self._generate(strong, job)
        self._router.count(strong)
        return escalated

    def _accept(self, pick: ModelPick, job: Job, body: dict[str, Any]) -> Response:
        accepted = replace(pick, reason=ACCEPTED_REASON, cascade=None)
        job.headers.update(accepted.headers())
        self._router.count(accepted)
        if not pick.data.get("stream"):
            return JSONResponse(body, headers=job.headers)
        options = pick.data.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        chunks = as_stream_chunks(body, chat=job.chat, include_usage=include_usage)

        async def events() -> AsyncGenerator[bytes, None]:
            for chunk in chunks:
                yield sse_event(chunk)
            yield SSE_DONE

        async def on_close() -> None:
            job.admission.release()

        return EventStreamResponse(events(), on_close, job.headers)


def _asked_logprobs(data: Mapping[str, Any], *, chat: bool) -> bool:
    value = data.get("logprobs")
    return bool(value) if chat else value is not None


def _spent(model: str, body: Mapping[str, Any]) -> str:
    usage = body.get("usage") or {}
    return (
        f"model={model}; prompt_tokens={int(usage.get('prompt_tokens', 0))}; "
        f"completion_tokens={int(usage.get('completion_tokens', 0))}"
    )
