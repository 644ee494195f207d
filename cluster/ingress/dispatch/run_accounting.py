"""What one request's run has produced and cost: its usage, the tokens and text sent to the
client, its finish reason, where its TTFT went, and the metrics it reports.

Every delta a run yields is made by :meth:`RunAccounting.record` (so the tokens a migration
resumes from are exactly those sent) and seen by :meth:`RunAccounting.observe` as it leaves
(TTFT, inter-token latency, the finished request); the run's decisions and failures are counted
here too.
"""

from __future__ import annotations

import logging
import time

from cluster.ingress.dispatch.deltas import Delta, RequestUsage
from cluster.ingress.dispatch.disagg import DisaggDecision
from cluster.ingress.dispatch.ttft_breakdown import TtftBreakdown, with_import, with_prefill
from cluster.ingress.http.error_responses import rejection_reason
from cluster.ingress.telemetry.request_metrics import IngressMetrics
from core.errors import PdserveError
from core.messages import StageTimes, TokenLogprobs

logger = logging.getLogger(__name__)


class RunAccounting:
    """The tallies of one request's run (single event loop)."""

    def __init__(
        self, request_id: str, num_prompt_tokens: int, arrival_s: float, metrics: IngressMetrics
    ) -> None:
        self._request_id = request_id
        self._metrics = metrics
        self._arrival_s = arrival_s
        self.usage = RequestUsage(num_prompt_tokens=num_prompt_tokens)
        self.finish_reason: str | None = None
        self.prefill_path = "local"
        self.sent_token_ids: list[int] = []
        """Tokens handed to the client (what a migration resumes)."""
        self.text_sent = ""
        self._last_token_s: float | None = None
        self._ttft_s: float | None = None
        self._stages = StageTimes()

    def ttft_breakdown(self) -> TtftBreakdown | None:
        """Where this request's TTFT went (None before its first token)."""
        if self._ttft_s is None:
            return None
        return TtftBreakdown(self.prefill_path, self._ttft_s, self._stages)

    def prefill_reported(self, num_cached_tokens: int, stage_times: StageTimes | None) -> None:
        """The prefill (remote, or local on decode) reported its cache hits and stage times."""
        self.usage.num_cached_tokens = num_cached_tokens
        if stage_times is not None:
            self._stages = with_prefill(self._stages, stage_times)

    def import_reported(self, stage_times: StageTimes) -> None:
        """The decode replica reported the stage times of its KV import."""
        self._stages = with_import(self._stages, stage_times)

    def record(
        self,
        token_ids: list[int],
        text: str,
        finish_reason: str | None,
        logprobs: tuple[TokenLogprobs, ...] = (),
        prompt_logprobs: tuple[TokenLogprobs | None, ...] = (),
    ) -> Delta:
        """The delta of new output, counted as sent."""
        self.usage.num_generated_tokens += len(token_ids)
        self.sent_token_ids.extend(token_ids)
        self.text_sent += text
        if finish_reason is not None:
            self.finish_reason = finish_reason
        return Delta(token_ids, text, finish_reason, logprobs, prompt_logprobs)

    def count_decision(self, decision: DisaggDecision) -> None:
        """Count the disaggregation decision (and a fallback's, when it changed)."""
        self._metrics.count_decision(decision.label, decision.reason)

    def count_migration(self, reason: str) -> None:
        """Count a migration of the decode stream (``timeout``, ``replica_failed``, or
        ``handed_off`` by a leaving replica)."""
        self._metrics.migrations.labels(reason).inc()

    def count_handoff(self, pipelined: bool) -> None:
        """Count a KV hand-off from the prefill pool."""
        self._metrics.kv_handoffs.labels("pipelined" if pipelined else "one_shot").inc()

    def failed(self, error: BaseException) -> None:
        """Count the run's failure: a typed error, a timeout, or a client that went away."""
        if isinstance(error, PdserveError):
            self._metrics.count_failed(rejection_reason(error))
        elif isinstance(error, TimeoutError):
            self._metrics.count_failed("timeout")
        elif self.finish_reason is None:
            self._metrics.count_failed("client_disconnected")
            logger.info("request %s: client went away; aborting", self._request_id)

    def observe(self, delta: Delta) -> None:
        """Report a delta as it leaves: TTFT or inter-token latency, and the finished request."""
        now_s = time.perf_counter()
        if delta.token_ids:
            if self._last_token_s is None:
                self._ttft_s = now_s - self._arrival_s
                self._metrics.observe_ttft(self.prefill_path, self._ttft_s)
            else:
                self._metrics.observe_itl(self.prefill_path, now_s - self._last_token_s)
            self._last_token_s = now_s
        if delta.finish_reason is not None:
            self._metrics.observe_finished(
                self.prefill_path,
                now_s - self._arrival_s,
                delta.finish_reason,
                self.usage.num_prompt_tokens,
                self.usage.num_cached_tokens,
                self.usage.num_generated_tokens,
            )
