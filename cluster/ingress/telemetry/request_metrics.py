"""The ingress's Prometheus metrics, in a per-app registry, named after vLLM's under ``pdserve:``.

Request latencies (TTFT, inter-token, end-to-end) are measured here, where the client's clock
is, and labelled ``role="ingress"`` plus ``prefill="remote"|"local"``; the workers' KV and
transfer gauges come from :class:`~cluster.ingress.telemetry.worker_stats.WorkerStatsCollector`.
"""

from __future__ import annotations

import copy

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from cluster.ingress.telemetry.recent_latency import RecentLatency
from cluster.ingress.telemetry.worker_stats import WorkerStatsCollector

ROLE = "ingress"
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS_S = (
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
)  # fmt: skip


class IngressMetrics:
    """Every metric the ingress exposes at ``/metrics``."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.recent_ttft = RecentLatency()
        self.recent_itl = RecentLatency()
        self.registry = CollectorRegistry()
        self.worker_stats = WorkerStatsCollector(model_name)
        self.registry.register(self.worker_stats)
        r = self.registry
        request_labels = ["model_name", "role", "prefill"]
        self.ttft_s = Histogram(
            "pdserve:time_to_first_token_seconds",
            "Time from request arrival to its first token.",
            request_labels, registry=r, buckets=TTFT_BUCKETS_S,
        )  # fmt: skip
        self.itl_s = Histogram(
            "pdserve:inter_token_latency_seconds",
            "Time between two streamed chunks of one request.",
            request_labels, registry=r, buckets=ITL_BUCKETS_S,
        )  # fmt: skip
        self.e2e_s = Histogram(
            "pdserve:e2e_request_latency_seconds",
            "Time from request arrival to its last token.",
            request_labels, registry=r, buckets=E2E_BUCKETS_S,
        )  # fmt: skip
        token_labels = ["model_name", "role"]
        self.prompt_tokens = Counter(
            "pdserve:prompt_tokens", "Prompt tokens of finished requests.", token_labels,
            registry=r,
        )  # fmt: skip
        self.cached_prompt_tokens = Counter(
            "pdserve:prompt_tokens_cached", "Prompt tokens served from a prefix cache.",
            token_labels, registry=r,
        )  # fmt: skip
        self.generation_tokens = Counter(
            "pdserve:generation_tokens", "Generated tokens.", token_labels, registry=r
        )
        self.request_success = Counter(
            "pdserve:request_success", "Requests that finished, by finish reason.",
            ["model_name", "role", "finished_reason"], registry=r,
        )  # fmt: skip
        self.decisions = Counter(
            "pdserve:disagg_decisions", "Where requests prefilled (remote or local), and why.",
            ["decision", "reason"], registry=r,
        )  # fmt: skip
        self.rejected = Counter(
            "pdserve:requests_rejected", "Requests refused before generation, by reason.",
            ["reason"], registry=r,
        )  # fmt: skip
        self.failed = Counter(
            "pdserve:requests_failed", "Accepted requests that ended in an error, by reason.",
            ["reason"], registry=r,
        )  # fmt: skip
        self.in_flight = Gauge(
            "pdserve:requests_in_flight", "Requests this ingress is serving.", ["role"],
            registry=r,
        )  # fmt: skip
        self.degraded = Gauge(
            "pdserve:serving_degraded",
            "1 while requests are served without a part of the cluster (reason: "
            "prefill_unavailable - every prompt prefills on decode).",
            ["reason"], registry=r,
        )  # fmt: skip
        self.migrations = Counter(
            "pdserve:request_migrations",
            "Requests moved to another decode replica mid-stream, by what ended the first "
            "stream (replica_failed, timeout, handed_off: its replica was leaving).",
            ["reason"], registry=r,
        )  # fmt: skip
        self.model_routes = Counter(
            "pdserve:model_routing_decisions",
            "Requests to a virtual model (e.g. auto), by the served model that answered and "
            "why (a rule's reason, default, cascade_accepted, escalated_<check>).",
            ["virtual_model", "model_name", "reason"], registry=r,
        )  # fmt: skip
        self.prefill_failovers = Counter(
            "pdserve:prefill_failovers",
            "Times a failed remote prefill switched the ingress to local prefill for a cooldown.",
            registry=r,
        )  # fmt: skip
        self.kv_handoffs = Counter(
            "pdserve:kv_handoffs",
            "Remote prefills by how their KV reached decode: pipelined (pulled while the prompt "
            "was computed) or one_shot (after it).",
            ["mode"], registry=r,
        )  # fmt: skip

    def for_model(self, model_name: str) -> IngressMetrics:
        """These metrics (same registry and series) labelling requests with ``model_name``."""
        view = copy.copy(self)
        view.model_name = model_name
        return view

    def observe_ttft(self, prefill: str, seconds: float) -> None:
        """One request's time to first token."""
        self.recent_ttft.observe(seconds)
        self.ttft_s.labels(self.model_name, ROLE, prefill).observe(seconds)

    def observe_itl(self, prefill: str, seconds: float) -> None:
        """One gap between streamed chunks."""
        self.recent_itl.observe(seconds)
        self.itl_s.labels(self.model_name, ROLE, prefill).observe(seconds)

    def observe_finished(
        self,
        prefill: str,
        e2e_s: float,
        finish_reason: str,
        num_prompt_tokens: int,
        num_cached_tokens: int,
        num_generated_tokens: int,
    ) -> None:
        """A request that completed normally."""
        self.e2e_s.labels(self.model_name, ROLE, prefill).observe(e2e_s)
        self.prompt_tokens.labels(self.model_name, ROLE).inc(num_prompt_tokens)
        self.cached_prompt_tokens.labels(self.model_name, ROLE).inc(num_cached_tokens)
        self.generation_tokens.labels(self.model_name, ROLE).inc(num_generated_tokens)
        self.request_success.labels(self.model_name, ROLE, finish_reason).inc()

    def count_decision(self, decision: str, reason: str) -> None:
        """One disaggregation decision."""
        self.decisions.labels(decision, reason).inc()

    def count_rejected(self, reason: str) -> None:
        """One request refused before generation."""
        self.rejected.labels(reason).inc()

    def count_failed(self, reason: str) -> None:
        """One accepted request that failed."""
        self.failed.labels(reason).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of the registry."""
        return generate_latest(self.registry)
