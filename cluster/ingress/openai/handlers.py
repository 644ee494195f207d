"""The two generation endpoints: admit, parse, prepare, run, and render (whole or streamed).

Errors before the first token become a JSON error with the right status (the stream's first
event is awaited before the response starts); errors after it become an SSE error event followed
by ``[DONE]``. Every request gets an id, echoed as ``x-request-id`` (the client's, when it sent
one; internally a fresh unique id is always used).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from cluster.ingress.dispatch.flow import RequestRun
from cluster.ingress.dispatch.prepared_prompt import PreparedPrompt
from cluster.ingress.http.api_keys import authenticate, tenant_salt
from cluster.ingress.http.error_responses import (
    error_response,
    from_validation_error,
    rejection_reason,
    timeout_response,
    too_large_response,
)
from cluster.ingress.http.event_stream import EventStreamResponse
from cluster.ingress.http.json_body import parse_json_object
from cluster.ingress.http.public_errors import for_client
from cluster.ingress.http.request_gate import Admission, RequestGate
from cluster.ingress.model_routing.cascade_run import CascadeRunner, Job
from cluster.ingress.model_routing.router import ModelPick, ModelRouter
from cluster.ingress.model_table import ModelTable, ServedRoute
from cluster.ingress.openai.choices import (
    best,
    check_choices,
    collect_all,
    interleaved,
    total_usage,
)
from cluster.ingress.openai.prompts import PromptBuilder
from cluster.ingress.openai.responses import Choice, Echo, ResponseRenderer
from cluster.ingress.openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
)
from cluster.ingress.openai.sse_body import SSEStream
from cluster.ingress.telemetry.request_metrics import IngressMetrics
from cluster.routing.sessions import extract_session_id
from core.errors import PdserveError, UnavailableError
from core.ids import new_request_id

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"
_MAX_CLIENT_ID_CHARS = 128


class GenerationHandlers:
    """``/v1/completions`` and ``/v1/chat/completions`` over every served model."""

    def __init__(
        self,
        table: ModelTable,
        router: ModelRouter,
        gate: RequestGate,
        metrics: IngressMetrics,
    ) -> None:
        self._settings = table.default.settings  # the server section all models share
        self._adapters = table.adapters
        self._router = router
        self._gate = gate
        self._metrics = metrics
        self._cascade = CascadeRunner(router, self._generate)

    async def completions(self, request: Request) -> Response:
        """``POST /v1/completions``."""
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        return await self._serve(request, chat=True)

    async def _serve(self, request: Request, *, chat: bool) -> Response:
        arrival_s = time.perf_counter()
        request_id = new_request_id("chatcmpl" if chat else "cmpl")
        client_id = _client_request_id(request)
        headers = {REQUEST_ID_HEADER: client_id or request_id}
        try:
            authenticate(request.headers.get("authorization"), self._settings.api_keys)
            admission = self._gate.admit()
        except PdserveError as e:
            return self._reject(e, headers)
        handed_over = False
        try:
            raw = await _read_body(request, self._settings.server.max_request_body_bytes)
            if raw is None:
                self._metrics.count_rejected("body_too_large")
                return too_large_response(self._settings.server.max_request_body_bytes, headers)
            try:
                data = parse_json_object(raw)
                model = data.get("model")
                await self._router.table.sync(model if isinstance(model, str) else None)
                pick = self._router.pick(data, request.headers, chat=chat)
            except PdserveError as e:
                return self._reject(for_client(e, request_id), headers)
            logger.debug("request %s accepted (client id %s)", request_id, client_id)
            job = Job(request_id, chat, request.headers, arrival_s, admission, headers)
            if pick.cascade is not None:
                response = await self._cascade.run(pick, job)
            else:
                headers.update(pick.headers())
                response = await self._generate(pick, job)
                self._router.count(pick)
            handed_over = isinstance(response, EventStreamResponse)
            return response
        except PdserveError as e:  # failed after acceptance: counted by the run, not rejected
            return error_response(for_client(e, request_id), headers)
        finally:
            if not handed_over:
                admission.release()

    async def _generate(self, pick: ModelPick, job: Job) -> Response:
        """Run ``pick.data`` on ``pick.route`` and render it, whole or streamed."""
        route = pick.route
        try:
            body, prompts = self._prepare(route, pick.data, job.request_headers, chat=job.chat)
            check_choices(body, route.settings.server.max_n)
        except PdserveError as e:
            return self._reject(for_client(e, job.request_id), job.headers)
        runs = self._start(route, job.request_id, prompts, body, job.arrival_s)
        echoes = [_echo(p) if getattr(body, "echo", False) else None for p in prompts]
        renderer = ResponseRenderer(
            chat=job.chat,
            response_id=job.request_id,
            model=body.model or route.name,
            logprobs=body.requested_logprobs(),
        )
        if body.stream:
            return await self._stream(runs, renderer, body, echoes, job.admission, job.headers)
        return await self._complete(runs, renderer, body, echoes, job.headers)

    def _prepare(
        self, route: ServedRoute, data: dict[str, Any], headers: Mapping[str, str], *, chat: bool
    ) -> tuple[GenerationRequest, list[PreparedPrompt]]:
        session_id = extract_session_id(headers, data)
        salt = None
        if self._settings.server.cache_salt_per_api_key:
            salt = tenant_salt(headers.get("authorization"))
        adapter = self._adapters.find(data.get("model"))
        lora_name = adapter.name if adapter is not None else None
        builder = PromptBuilder(route.tokenizer, route.settings, lora_name)
        try:
            if chat:
                chat_body = ChatCompletionRequest.model_validate(data)
                return chat_body, [builder.chat(chat_body, session_id, salt)]
            body = CompletionRequest.model_validate(data)
            return body, builder.completion_batch(body, session_id, salt)
        except ValidationError as e:
            raise from_validation_error(e) from e

    def _start(
        self,
        route: ServedRoute,
        request_id: str,
        prompts: list[PreparedPrompt],
        body: GenerationRequest,
        arrival_s: float,
    ) -> list[tuple[int, RequestRun]]:
        """A run per sequence: each prompt's ``best_of`` (else ``n``) samples, prompt-major."""
        samples = body.num_samples
        runs = []
        for index, prompt in enumerate(prompts):
            for j in range(samples):
                k = index * samples + j
                run_id = request_id if k == 0 else f"{request_id}-{k}"
                runs.append((index, route.flow.start(run_id, prompt.sample(j), arrival_s)))
        return runs

    async def _complete(
        self,
        runs: list[tuple[int, RequestRun]],
        renderer: ResponseRenderer,
        body: GenerationRequest,
        echoes: list[Echo | None],
        headers: dict[str, str],
    ) -> Response:
        try:
            samples = await collect_all(runs)
        except TimeoutError:
            return timeout_response(f"request {renderer.response_id} timed out", headers)
        chosen = best(samples, len(echoes), body.num_choices)
        choices = [
            Choice(s.text, s.run.finish_reason, s.logprobs, s.prompt_logprobs,
                   echoes[s.prompt_index])
            for s in chosen
        ]  # fmt: skip
        usage = total_usage([run for _, run in runs], len(echoes))
        return JSONResponse(renderer.full_choices(choices, usage), headers=headers)

    async def _stream(
        self,
        runs: list[tuple[int, RequestRun]],
        renderer: ResponseRenderer,
        body: GenerationRequest,
        echoes: list[Echo | None],
        admission: Admission,
        headers: dict[str, str],
    ) -> Response:
        events = interleaved([run for _, run in runs])
        try:
            first = await anext(events)
        except StopAsyncIteration:
            await events.aclose()
            raise UnavailableError(f"request {renderer.response_id} produced no output") from None
        except TimeoutError:
            await events.aclose()
            return timeout_response(f"request {renderer.response_id} timed out", headers)
        except BaseException:
            await events.aclose()
            raise

        async def on_close() -> None:
            await events.aclose()
            admission.release()

        stream = SSEStream(renderer, body, echoes, [run for _, run in runs])
        return EventStreamResponse(stream.body(first, events), on_close, headers)

    def _reject(self, e: PdserveError, headers: dict[str, str]) -> JSONResponse:
        reason = "draining" if self._gate.draining and e.status_code == 503 else None
        self._metrics.count_rejected(reason or rejection_reason(e))
        return error_response(e, headers)


def _echo(prompt: PreparedPrompt) -> Echo:
    return Echo(prompt.prompt_text, prompt.first_token_text)


async def _read_body(request: Request, limit_bytes: int) -> bytes | None:
    """The body, or None when it is larger than ``limit_bytes``."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit_bytes:
        return None
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit_bytes:
            return None
        parts.append(part)
    return b"".join(parts)


def _client_request_id(request: Request) -> str | None:
    value = request.headers.get(REQUEST_ID_HEADER)
    if value and len(value) <= _MAX_CLIENT_ID_CHARS and value.isprintable():
        return value
    return None
