"""Failover of a model's remote prefill: when to try the prefill pool, and what a failed
remote prefill means for the request (fall back to local prefill on decode, or fail).

The breaker (:class:`~cluster.ingress.dispatch.breaker.PrefillBreaker`) keeps a pool that just
failed out of the path for its cooldown; with ``fallback_to_local_prefill`` off, a failed
remote prefill fails its request instead.
"""

from __future__ import annotations

import logging

from cluster.ingress.dispatch.breaker import PrefillBreaker
from cluster.ingress.telemetry.request_metrics import IngressMetrics
from core.config import DisaggregationConfig
from core.errors import InvalidRequestError, OverloadedError, PdserveError, UnavailableError

logger = logging.getLogger(__name__)


class PrefillFailover:
    """One model's prefill failover state: its breaker and the fallback setting."""

    def __init__(
        self, breaker: PrefillBreaker, config: DisaggregationConfig, metrics: IngressMetrics
    ) -> None:
        self.breaker = breaker
        self._config = config
        self._metrics = metrics

    def available(self, pool_healthy: bool) -> bool:
        """Whether a request may try remote prefill now: a replica is live and, with fallback
        on, no remote prefill failed within the cooldown."""
        if not self._config.fallback_to_local_prefill:
            return pool_healthy
        return self.breaker.allows(pool_healthy)

    def succeeded(self) -> None:
        """A remote prefill answered."""
        self.breaker.succeeded()

    def capacity_failed(self) -> None:
        """A remote prefill failed for lack of capacity (see :class:`PrefillBreaker`)."""
        if self._config.fallback_to_local_prefill:
            if not self.breaker.is_open:
                self._metrics.prefill_failovers.inc()
            self.breaker.failed()

    def handle(self, request_id: str, error: Exception) -> None:
        """Re-raise a remote prefill's failure, or return to fall back to local prefill."""
        if isinstance(error, InvalidRequestError):
            raise error  # the request itself is at fault: local prefill would fail the same way
        # a dead replica surfaces as any exception type
        if not isinstance(error, OverloadedError):  # a busy pool is alive: no failover
            self.capacity_failed()
        if not self._config.fallback_to_local_prefill:
            if isinstance(error, PdserveError | TimeoutError):
                raise error
            logger.warning(
                "request %s: remote prefill failed: %s: %s",
                request_id, type(error).__name__, error,
            )  # fmt: skip
            raise UnavailableError(
                f"request {request_id}: the prefill pool failed to serve it"
            ) from error
        logger.warning(
            "request %s: remote prefill failed (%s: %s); prefilling locally on decode",
            request_id, type(error).__name__, error,
        )  # fmt: skip
