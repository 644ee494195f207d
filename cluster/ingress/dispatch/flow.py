"""One request's path through the pools: decide, prefill, stream the first token, decode.

Remote path: the prefill pool computes the prompt and returns the first token plus a KV handle
(:mod:`~cluster.ingress.dispatch.remote_prefill`, pipelined for long prompts); the first token
is yielded at once (TTFT never waits for the KV transfer), then the decode pool pulls the KV and
streams the rest, one chunk per engine step. Local path (short or cached prompt, no healthy
prefill capacity — none of the fingerprint the request is paired to, see
:mod:`~cluster.ingress.dispatch.pairing` — or a failed remote prefill, see
:mod:`~cluster.ingress.dispatch.prefill_failover`): decode runs the whole request. A decode
stream that dies mid-way migrates (:mod:`~cluster.ingress.dispatch.migrating_decode`); what the
run sent and cost is kept by :mod:`~cluster.ingress.dispatch.run_accounting`. Every await is
bounded; closing the event iterator closes the decode stream, which aborts the request on its
replica and frees its blocks.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator
from contextlib import aclosing

from cluster.ingress.dispatch.breaker import PrefillBreaker
from cluster.ingress.dispatch.decode_stream import DecodeStream
from cluster.ingress.dispatch.deltas import Delta, RequestUsage
from cluster.ingress.dispatch.disagg import DisaggPolicy
from cluster.ingress.dispatch.migrating_decode import MigratingDecode
from cluster.ingress.dispatch.migration import DetokenizerFactory
from cluster.ingress.dispatch.pairing import FleetVersions, Pairing, choose_pairing, paired
from cluster.ingress.dispatch.pool_clients import DecodeClient, PrefillClient
from cluster.ingress.dispatch.pool_requests import decode_request
from cluster.ingress.dispatch.prefill_failover import PrefillFailover
from cluster.ingress.dispatch.prepared_prompt import PreparedPrompt
from cluster.ingress.dispatch.remote_prefill import Prefilled, RemotePrefill
from cluster.ingress.dispatch.run_accounting import RunAccounting
from cluster.ingress.dispatch.ttft_breakdown import TtftBreakdown
from cluster.ingress.settings import IngressSettings
from cluster.ingress.telemetry.request_metrics import IngressMetrics
from core.errors import PdserveError


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
        versions: FleetVersions | None = None,
    ) -> None:
        """``versions``: the pools' live replicas by KV fingerprint, to pair each request's
        prefill and decode by (None: any pair, as when every replica runs one version)."""
        self.versions = versions
        self._rng = random.Random()
        self.detokenizer = detokenizer  # renders a migrated request's text (see migration.py)
        self.prefill = prefill
        self.decode = decode
        self.policy = policy
        self.settings = settings
        self.metrics = metrics
        self.breaker = PrefillBreaker(settings.disaggregation.prefill_failover_cooldown_s)
        self.failover = PrefillFailover(self.breaker, settings.disaggregation, metrics)
        self.remote_prefill = RemotePrefill(prefill, decode, self.failover, settings)

    def prefill_available(self) -> bool:
        """Whether a request may try remote prefill now (see :class:`PrefillFailover`)."""
        return self.failover.available(self.prefill.healthy())

    def prefill_failed(self) -> None:
        """A remote prefill failed for lack of capacity (see :class:`PrefillBreaker`)."""
        self.failover.capacity_failed()

    def pairing(self) -> Pairing | None:
        """The fingerprint a new request runs under (``dispatch.pairing``); None: any."""
        return None if self.versions is None else choose_pairing(self.versions, self._rng)

    def start(self, request_id: str, prompt: PreparedPrompt, arrival_s: float) -> RequestRun:
        """A run of one request, paired to one fingerprint; iterate :meth:`RequestRun.events`
        to drive it."""
        return RequestRun(self, request_id, prompt, arrival_s, self.pairing())


class RequestRun:
    """One request's generation; :meth:`events` yields its deltas."""

    def __init__(
        self,
        flow: GenerationFlow,
        request_id: str,
        prompt: PreparedPrompt,
        arrival_s: float,
        pairing: Pairing | None = None,
    ) -> None:
        self._flow = flow
        self.request_id = request_id
        self.pairing = pairing
        prompt = paired(prompt, pairing)
        self.prompt = prompt
        self.accounting = RunAccounting(
            request_id, prompt.num_prompt_tokens, arrival_s, flow.metrics
        )
        stream = DecodeStream(
            flow.decode, self.accounting, request_id, flow.settings.server.chunk_timeout_s
        )
        self._decode = MigratingDecode(
            stream, self.accounting, request_id, prompt, flow.settings, flow.detokenizer
        )

    @property
    def usage(self) -> RequestUsage:
        """Token counts so far."""
        return self.accounting.usage

    @property
    def finish_reason(self) -> str | None:
        """Why the request finished (None while it runs)."""
        return self.accounting.finish_reason

    @property
    def prefill_path(self) -> str:
        """``remote`` once the prefill pool served the prompt, else ``local``."""
        return self.accounting.prefill_path

    def ttft_breakdown(self) -> TtftBreakdown | None:
        """Where this request's TTFT went (None before its first token)."""
        return self.accounting.ttft_breakdown()

    async def events(self) -> AsyncGenerator[Delta, None]:
        """The request's deltas; raises ``PdserveError`` or ``TimeoutError`` on failure."""
        try:
            async with aclosing(self._generate()) as deltas:
                async for delta in deltas:
                    self.accounting.observe(delta)
                    yield delta
        except (PdserveError, TimeoutError, asyncio.CancelledError, GeneratorExit) as e:
            self.accounting.failed(e)
            raise

    async def _generate(self) -> AsyncGenerator[Delta, None]:
        flow, prompt = self._flow, self.prompt
        # NOTE: no prefill of the decode's fingerprint: local prefill, never a cross-version pull
        paired_prefill = self.pairing is None or self.pairing.has_prefill
        decision = flow.policy.decide(
            prompt.num_prompt_tokens,
            prompt.block_hashes,
            paired_prefill and flow.prefill_available(),
        )
        self.accounting.count_decision(decision)
        if decision.remote:
            prefilled = await flow.remote_prefill.run(self.request_id, prompt)
            if prefilled is not None:
                self.accounting.prefill_path = "remote"
                self.accounting.count_handoff(pipelined=prefilled.opened is not None)
                async with aclosing(self._after_remote_prefill(prefilled)) as deltas:
                    async for delta in deltas:
                        yield delta
                return
            self.accounting.count_decision(DisaggPolicy.fallback(prompt.num_prompt_tokens))
        request = decode_request(self.request_id, prompt, None)
        async with aclosing(self._decode.deltas(request)) as deltas:
            async for delta in deltas:
                yield delta

    async def _after_remote_prefill(self, prefilled: Prefilled) -> AsyncGenerator[Delta, None]:
        result, opened = prefilled.result, prefilled.opened
        self.accounting.prefill_reported(result.num_cached_tokens, result.stage_times)
        done = result.finish_reason is not None or result.kv_handle is None
        finish_reason = (result.finish_reason or "stop") if done else None
        first_logprobs = () if result.first_logprobs is None else (result.first_logprobs,)
        yield self.accounting.record(
            [result.first_token_id], result.first_text, finish_reason,
            first_logprobs, result.prompt_logprobs,
        )  # fmt: skip
        if not done:
            request = (
                opened.request
                if opened is not None
                else decode_request(self.request_id, self.prompt, result)
            )
            async with aclosing(self._decode.deltas(request, opened)) as deltas:
                async for delta in deltas:
                    yield delta
