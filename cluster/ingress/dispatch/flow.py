"""One request's path through the pools: decide, prefill, stream the first token, decode.

Remote path: the prefill pool computes the prompt and returns the first token plus a KV handle;
the first token is yielded at once (TTFT never waits for the KV transfer), then the decode pool
pulls the KV and streams the rest, one chunk per engine step. Pipelined remote path (prompts of
``pipelined_from_tokens`` and more): the prefill answers at once with an export the decode can
pull from while the prompt is computed, so the decode call starts right away and the transfer
hides behind the rest of the prefill; the first token follows as before. Local path (short or
cached prompt, no healthy prefill capacity, or a failed remote prefill): decode runs the whole
request. Every await is bounded; closing the event iterator closes the decode stream, which
aborts the request on its replica and frees its blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, replace

from cluster.ingress.dispatch.breaker import PrefillBreaker
from cluster.ingress.dispatch.disagg import DisaggDecision, DisaggPolicy
from cluster.ingress.dispatch.migration import (
    DetokenizerFactory,
    ResumedText,
    can_migrate,
    migrated_request,
)
from cluster.ingress.dispatch.pool_clients import DecodeClient, PrefillClient
from cluster.ingress.dispatch.prepared_prompt import PreparedPrompt
from cluster.ingress.dispatch.ttft_breakdown import TtftBreakdown, with_import, with_prefill
from cluster.ingress.http.error_responses import rejection_reason
from cluster.ingress.settings import IngressSettings
from cluster.ingress.telemetry.request_metrics import IngressMetrics
from core.errors import InvalidRequestError, OverloadedError, PdserveError, UnavailableError
from core.messages import (
    DecodeRequest,
    PrefillRequest,
    PrefillResult,
    PrefillStarted,
    StageTimes,
    TokenChunk,
    TokenLogprobs,
)

logger = logging.getLogger(__name__)

_MIGRATION_BACKOFF_S = 0.2
"""Pause before the first migration attempt; doubled for each further one (capped at 2 s)."""
_FAILED_FINISH_REASONS = frozenset({"abort", "error"})
"""Finish reasons of a decode chunk that mean the request failed rather than finished."""


@dataclass(frozen=True)
class Delta:
    """New output of one step: token ids, their text, and the finish reason on the last one."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    logprobs: tuple[TokenLogprobs, ...] = ()
    """One per token when the request asked for logprobs."""
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()
    """On the first delta, when the request asked for prompt logprobs (``echo``)."""


@dataclass
class RequestUsage:
    """Token counts of one request (the OpenAI ``usage`` object)."""

    num_prompt_tokens: int
    num_cached_tokens: int = 0
    num_generated_tokens: int = 0
    ttft_breakdown: TtftBreakdown | None = None
    """The first choice's (``usage.ttft_breakdown``)."""


class GenerationFlow:
    """Runs requests against a prefill client and a decode client."""

    def __init__(
        self,
        prefill: PrefillClient,
        decode: DecodeClient,
        policy: DisaggPolicy,
        settings: IngressSettings,
        metrics: IngressMetrics,
        detokenizer: DetokenizerFactory | None = None,
    ) -> None:
        self.detokenizer = detokenizer  # renders a migrated request's text (see migration.py)
        self.prefill = prefill
        self.decode = decode
        self.policy = policy
        self.settings = settings
        self.metrics = metrics
        self.breaker = PrefillBreaker(settings.disaggregation.prefill_failover_cooldown_s)

    def prefill_available(self) -> bool:
        """Whether a request may try remote prefill now: a replica is live and, with fallback
        on, no remote prefill failed within the cooldown."""
        healthy = self.prefill.healthy()
        if not self.settings.disaggregation.fallback_to_local_prefill:
            return healthy
        return self.breaker.allows(healthy)

    def prefill_failed(self) -> None:
        """A remote prefill failed for lack of capacity (see :class:`PrefillBreaker`)."""
        if self.settings.disaggregation.fallback_to_local_prefill:
            if not self.breaker.is_open:
                self.metrics.prefill_failovers.inc()
            self.breaker.failed()

    def start(self, request_id: str, prompt: PreparedPrompt, arrival_s: float) -> RequestRun:
        """A run of one request; iterate :meth:`RequestRun.events` to drive it."""
        return RequestRun(self, request_id, prompt, arrival_s)


class RequestRun:
    """The state of one request's generation; :meth:`events` yields its deltas."""

    def __init__(
        self, flow: GenerationFlow, request_id: str, prompt: PreparedPrompt, arrival_s: float
    ) -> None:
        self._flow = flow
        self.request_id = request_id
        self.prompt = prompt
        self.usage = RequestUsage(num_prompt_tokens=prompt.num_prompt_tokens)
        self.finish_reason: str | None = None
        self.prefill_path = "local"
        self._arrival_s = arrival_s
        self._last_token_s: float | None = None
        self._sent: list[int] = []  # tokens handed to the client (what a migration resumes)
        self._text_sent = ""
        self._resumed: ResumedText | None = None  # after a migration: the text from the ids
        self._ttft_s: float | None = None
        self._stages = StageTimes()

    def ttft_breakdown(self) -> TtftBreakdown | None:
        """Where this request's TTFT went (None before its first token)."""
        if self._ttft_s is None:
            return None
        return TtftBreakdown(self.prefill_path, self._ttft_s, self._stages)

    async def events(self) -> AsyncGenerator[Delta, None]:
        """The request's deltas; raises ``PdserveError`` or ``TimeoutError`` on failure."""
        try:
            async with aclosing(self._generate()) as deltas:
                async for delta in deltas:
                    self._observe(delta)
                    yield delta
        except PdserveError as e:
            self._flow.metrics.count_failed(rejection_reason(e))
            raise
        except TimeoutError:
            self._flow.metrics.count_failed("timeout")
            raise
        except (asyncio.CancelledError, GeneratorExit):
            if self.finish_reason is None:
                self._flow.metrics.count_failed("client_disconnected")
                logger.info("request %s: client went away; aborting", self.request_id)
            raise

    async def _generate(self) -> AsyncGenerator[Delta, None]:
        flow = self._flow
        decision = flow.policy.decide(
            self.prompt.num_prompt_tokens, self.prompt.block_hashes, flow.prefill_available()
        )
        self._count(decision)
        if decision.remote:
            prefilled = await (
                self._pipelined_prefill() if self._pipelined() else self._remote_prefill()
            )
            if prefilled is not None:
                self.prefill_path = "remote"
                result, opened = prefilled
                flow.metrics.kv_handoffs.labels("pipelined" if opened else "one_shot").inc()
                async with aclosing(self._after_remote_prefill(result, opened)) as deltas:
                    async for delta in deltas:
                        yield delta
                return
            self._count(DisaggPolicy.fallback(self.prompt.num_prompt_tokens))
        async with aclosing(self._decode_stream(self._decode_request(None))) as deltas:
            async for delta in deltas:
                yield delta

    def _pipelined(self) -> bool:
        threshold = self._flow.settings.pipelined_from_tokens
        return threshold is not None and self.prompt.num_prompt_tokens >= threshold

    def _prefill_request(self) -> PrefillRequest:
        return PrefillRequest(
            self.request_id,
            list(self.prompt.prompt_token_ids),
            self.prompt.sampling,
            self.prompt.routing,
        )

    async def _remote_prefill(self) -> tuple[PrefillResult, None] | None:
        """The prefill result, or None to fall back to local prefill."""
        try:
            async with asyncio.timeout(self._flow.settings.server.prefill_timeout_s):
                result = await self._flow.prefill.prefill(self._prefill_request())
            self._flow.breaker.succeeded()
            return result, None
        except Exception as e:
            self._prefill_failed(e)
            return None

    async def _pipelined_prefill(self) -> tuple[PrefillResult, _OpenDecode | None] | None:
        """The pipelined prefill: the decode call starts on the prefill's first answer (its
        open export), then the prefill result arrives; None to fall back to local prefill (the
        decode call, if started, is closed)."""
        opened: _OpenDecode | None = None
        try:
            async with asyncio.timeout(self._flow.settings.server.prefill_timeout_s):
                updates = self._flow.prefill.prefill_stream(self._prefill_request())
                async with aclosing(updates):  # type: ignore[type-var]
                    async for update in updates:
                        if isinstance(update, PrefillStarted):
                            request = replace(
                                self._decode_request(None), kv_handle=update.kv_handle
                            )
                            opened = _OpenDecode.start(self._flow.decode, request)
                            continue
                        self._flow.breaker.succeeded()
                        if update.finish_reason is not None or update.kv_handle is None:
                            await _close_opened(opened)  # nothing to decode after all
                            opened = None
                        return update, opened
            raise UnavailableError(f"request {self.request_id}: the prefill stream ended early")
        except BaseException as e:
            await _close_opened(opened)
            if not isinstance(e, Exception):
                raise
            self._prefill_failed(e)
            return None

    def _prefill_failed(self, error: Exception) -> None:
        """Re-raise a remote prefill's failure, or return to fall back to local prefill."""
        if isinstance(error, InvalidRequestError):
            raise error  # the request itself is at fault: local prefill would fail the same way
        # a dead replica surfaces as any exception type
        if not isinstance(error, OverloadedError):  # a busy pool is alive: no failover
            self._flow.prefill_failed()
        if not self._flow.settings.disaggregation.fallback_to_local_prefill:
            if isinstance(error, PdserveError | TimeoutError):
                raise error
            logger.warning(
                "request %s: remote prefill failed: %s: %s",
                self.request_id, type(error).__name__, error,
            )  # fmt: skip
            raise UnavailableError(
                f"request {self.request_id}: the prefill pool failed to serve it"
            ) from error
        logger.warning(
            "request %s: remote prefill failed (%s: %s); prefilling locally on decode",
            self.request_id, type(error).__name__, error,
        )  # fmt: skip

    async def _after_remote_prefill(
        self, result: PrefillResult, opened: _OpenDecode | None
    ) -> AsyncGenerator[Delta, None]:
        self.usage.num_cached_tokens = result.num_cached_tokens
        self._stages = with_prefill(self._stages, result.stage_times)
        done = result.finish_reason is not None or result.kv_handle is None
        finish_reason = (result.finish_reason or "stop") if done else None
        first_logprobs = () if result.first_logprobs is None else (result.first_logprobs,)
        yield self._delta(
            [result.first_token_id], result.first_text, finish_reason,
            first_logprobs, result.prompt_logprobs,
        )  # fmt: skip
        if not done:
            request = opened.request if opened is not None else self._decode_request(result)
            async with aclosing(self._decode_stream(request, opened)) as deltas:
                async for delta in deltas:
                    yield delta

    def _decode_request(self, result: PrefillResult | None) -> DecodeRequest:
        return DecodeRequest(
            request_id=self.request_id,
            prompt_token_ids=list(self.prompt.prompt_token_ids),
            sampling=self.prompt.sampling,
            routing=self.prompt.routing,
            first_token_id=None if result is None else result.first_token_id,
            kv_handle=None if result is None else result.kv_handle,
            prompt_chunk_ends=() if result is None else result.prompt_chunk_ends,
        )

    async def _decode_stream(
        self, request: DecodeRequest, opened: _OpenDecode | None = None
    ) -> AsyncGenerator[Delta, None]:
        """The decode pool's deltas (the first attempt on ``opened`` when the call already
        started); a stream that dies mid-way continues on another replica
        (``cluster.ingress.dispatch.migration``) up to ``migration_limit`` times."""
        attempt = 0
        while True:
            try:
                async with aclosing(self._one_decode_stream(request, opened)) as deltas:
                    async for delta in deltas:
                        yield delta
                return
            except (PdserveError, TimeoutError) as e:
                limit = self._flow.settings.routing.migration_limit
                if attempt >= limit or not can_migrate(e) or self.finish_reason is not None:
                    raise
                attempt += 1
                reason = "timeout" if isinstance(e, TimeoutError) else "replica_failed"
                self._flow.metrics.migrations.labels(reason).inc()
                logger.warning(
                    "request %s: decode stream failed after %d tokens (%s); migrating (%d/%d)",
                    self.request_id, len(self._sent), e, attempt, limit,
                )  # fmt: skip
                opened = None
                request = migrated_request(
                    self._decode_request(None),
                    list(self._sent),
                    attempt,
                    block_size=self._flow.settings.block_size,
                    hash_seed=self._flow.settings.hash_seed,
                )
                factory = self._flow.detokenizer
                if factory is not None:
                    self._resumed = ResumedText(
                        factory(list(self.prompt.prompt_token_ids)), self._sent, self._text_sent
                    )
                # let Serve drop the dead replica from its routing before the next try
                await asyncio.sleep(min(_MIGRATION_BACKOFF_S * 2 ** (attempt - 1), 2.0))

    async def _one_decode_stream(
        self, request: DecodeRequest, opened: _OpenDecode | None
    ) -> AsyncGenerator[Delta, None]:
        stream = self._flow.decode.generate(request) if opened is None else opened.stream
        pending = None if opened is None else opened.first
        try:
            while True:
                chunk = await self._next_chunk(stream, pending)
                pending = None
                if chunk.error is not None:
                    raise chunk.error.to_error()
                if chunk.finished and chunk.finish_reason in _FAILED_FINISH_REASONS:
                    # NOTE: the ingress aborts only for a client that left; an abort seen here is
                    # the server's doing, so the client must not mistake it for a short answer.
                    raise UnavailableError(
                        f"request {self.request_id} ended on the decode worker "
                        f"({chunk.finish_reason})"
                    )
                if request.kv_handle is None and not self._sent:
                    self.usage.num_cached_tokens = chunk.num_cached_tokens
                    if chunk.stage_times is not None:
                        self._stages = with_prefill(self._stages, chunk.stage_times)
                elif chunk.stage_times is not None and request.kv_handle is not None:
                    self._stages = with_import(self._stages, chunk.stage_times)
                finish_reason = (chunk.finish_reason or "stop") if chunk.finished else None
                text = chunk.text
                if self._resumed is not None:
                    text = self._resumed.render(list(chunk.token_ids), chunk.finished)
                yield self._delta(
                    list(chunk.token_ids), text, finish_reason, chunk.logprobs,
                    chunk.prompt_logprobs,
                )  # fmt: skip
                if chunk.finished:
                    return
        finally:
            await _close(stream)

    async def _next_chunk(
        self, stream: AsyncIterator[TokenChunk], pending: asyncio.Future[TokenChunk] | None = None
    ) -> TokenChunk:
        """The stream's next chunk (``pending``: the first one, already asked for)."""
        try:
            async with asyncio.timeout(self._flow.settings.server.chunk_timeout_s):
                return await (anext(stream) if pending is None else pending)
        except StopAsyncIteration as e:
            raise UnavailableError("the decode stream ended before the request finished") from e
        except (PdserveError, TimeoutError):
            raise
        except Exception as e:  # a dead decode replica surfaces as any exception type
            logger.warning(
                "request %s: decode stream failed: %s: %s", self.request_id, type(e).__name__, e
            )
            raise UnavailableError(
                f"request {self.request_id}: the decode pool failed to serve it"
            ) from e

    def _delta(
        self,
        token_ids: list[int],
        text: str,
        finish_reason: str | None,
        logprobs: tuple[TokenLogprobs, ...] = (),
        prompt_logprobs: tuple[TokenLogprobs | None, ...] = (),
    ) -> Delta:
        self.usage.num_generated_tokens += len(token_ids)
        self._sent.extend(token_ids)
        self._text_sent += text
        if finish_reason is not None:
            self.finish_reason = finish_reason
        return Delta(token_ids, text, finish_reason, logprobs, prompt_logprobs)

    def _count(self, decision: DisaggDecision) -> None:
        self._flow.metrics.count_decision(decision.label, decision.reason)

    def _observe(self, delta: Delta) -> None:
        metrics = self._flow.metrics
        now_s = time.perf_counter()
        if delta.token_ids:
            if self._last_token_s is None:
                self._ttft_s = now_s - self._arrival_s
                metrics.observe_ttft(self.prefill_path, self._ttft_s)
            else:
                metrics.observe_itl(self.prefill_path, now_s - self._last_token_s)
            self._last_token_s = now_s
        if delta.finish_reason is not None:
            metrics.observe_finished(
                self.prefill_path,
                now_s - self._arrival_s,
                delta.finish_reason,
                self.usage.num_prompt_tokens,
                self.usage.num_cached_tokens,
                self.usage.num_generated_tokens,
            )


async def _close(stream: AsyncIterator[TokenChunk]) -> None:
    """Close a decode stream (aborting the request upstream) if it can be closed."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


@dataclass
class _OpenDecode:
    """A decode call started ahead of its first token (the pipelined handoff): its request,
    its stream, and the task already waiting for its first chunk (which sends the call)."""

    request: DecodeRequest
    stream: AsyncIterator[TokenChunk]
    first: asyncio.Future[TokenChunk]

    @classmethod
    def start(cls, decode: DecodeClient, request: DecodeRequest) -> _OpenDecode:
        """Send ``request`` to the decode pool now."""
        stream = decode.generate(request)
        return cls(request, stream, asyncio.ensure_future(anext(stream)))


async def _close_opened(opened: _OpenDecode | None) -> None:
    """Abandon a started decode call: cancel its wait and close its stream (both sides free)."""
    if opened is None:
        return
    opened.first.cancel()
    with contextlib.suppress(BaseException):
        await opened.first
    await _close(opened.stream)
