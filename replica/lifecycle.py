"""The part of a replica's lifecycle that is the same for the prefill and the decode role.

:class:`RoleReplica` is the base of both roles' Serve deployment classes: it reports the
replica's typed stats, answers Serve's health check and routing-stats hook, turns a worker's
typed failure into the one :class:`~core.errors.ErrorReport` both roles send, and stops the
worker when Serve stops the replica.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any, Protocol

from core.codec import to_plain
from core.errors import ErrorReport, PdserveError, UnavailableError
from core.stats import ReplicaStats
from engine.async_engine import AsyncEngine
from engine.parallel.async_ep import expert_load_stats
from replica.hooks import KVEventPublisher
from replica.planner_signals import PlannerSignals

logger = logging.getLogger(__name__)


class RoleWorker(Protocol):
    """What :class:`RoleReplica` needs of a prefill or decode worker."""

    @property
    def engine(self) -> AsyncEngine:
        """The worker's engine."""
        ...

    def stats(self) -> ReplicaStats:
        """KV blocks, queues and transfer counters."""
        ...

    async def drain(self, timeout_s: float) -> int:
        """Before a planned stop: wait (bounded) for what others still need from this replica;
        returns what is left."""
        ...

    async def shutdown(self) -> None:
        """Stop the transport and the engine."""
        ...


class RoleReplica:
    """The replica lifecycle both roles' Serve deployments share: stats, Serve's health check
    and routing-stats hook, error reports, and the stop. Subclasses set ``role`` and, in
    ``__init__``, ``_worker``, ``_publisher`` and ``_stop_reporting``; they count
    ``_num_requests``."""

    role = ""
    _worker: RoleWorker
    _publisher: KVEventPublisher | None = None
    _stop_reporting: Callable[[], None] | None = None
    _num_requests = 0
    _drain_timeout_s = 0.0
    _planner_signals: PlannerSignals | None = None

    def replica_stats(self) -> ReplicaStats:
        """The worker's stats, expert load (expert-parallel ranks) and ``requests_total``,
        the calls this replica received."""
        return dataclasses.replace(
            self._worker.stats(),
            expert_load=expert_load_stats(self._worker.engine),
            requests_total=self._num_requests,
        )

    def stats(self) -> dict[str, Any]:
        """:meth:`replica_stats` as plain data (the Serve method; decode with ``core.codec``)."""
        plain: dict[str, Any] = to_plain(self.replica_stats())
        return plain

    def report_failure(self, request_id: str, error: PdserveError) -> ErrorReport:
        """Log a request's typed failure and return what the caller receives."""
        logger.info("%s %s failed: %s: %s", self.role, request_id, error.error_type, error.message)
        return ErrorReport.of(error)

    def check_health(self) -> None:
        """Serve's health check: unhealthy once the engine stopped (for an expert-parallel
        rank: its gang broke, so Serve restarts the whole gang)."""
        if not self._worker.engine.is_running():
            raise UnavailableError(f"the {self.role} engine stopped")

    def record_routing_stats(self) -> dict[str, Any]:
        """Serve's routing-stats hook: ``core.stats.RoutingStats`` as plain data (Serve's hook
        must return a dict; the routers decode it with the same codec)."""
        # NOTE: every field it needs is the engine's; no transfer-metrics snapshot per report.
        plain: dict[str, Any] = to_plain(self._worker.engine.kv_stats().routing())
        return plain

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics hook: the load and rates pdserve's planner sizes
        pools by (``replica.planner_signals``; Serve averages each over its look-back window)."""
        if self._planner_signals is None:
            self._planner_signals = PlannerSignals()
        return self._planner_signals.report(self.replica_stats())

    async def __del__(self) -> None:
        """Serve calls this once when the replica stops (after the requests in flight ended or
        the pool's graceful shutdown timeout): drain what others still need (a prefill's KV
        exports, up to ``_drain_timeout_s``), end reports, free the engine."""
        if self._drain_timeout_s > 0:
            await self._worker.drain(self._drain_timeout_s)
        if self._stop_reporting is not None:
            self._stop_reporting()
        if self._publisher is not None:
            self._publisher.close()
        await self._worker.shutdown()
