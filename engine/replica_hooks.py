"""What the roles' Serve deployments accept from the composition root (``cluster/``).

The roles may not import ``cluster``, so the app builder hands each replica small picklable
factories that satisfy these protocols; ``start`` runs inside the replica. They live here, one
layer below both roles, so prefill and decode share one definition — as does
:class:`RoleReplica`, the part of a replica's lifecycle that is the same for both roles.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from core.config import EngineConfig, ModelConfig
from core.errors import UnavailableError
from core.kv_events import KVEventBatch
from engine.async_engine import AsyncEngine
from engine.parallel.async_ep import expert_load_stats

StatsReporter = Callable[[str, Callable[[], Mapping[str, float | int]]], Callable[[], None]]
"""``reporter(role, stats_fn) -> stop``: publishes the worker's stats while the replica lives."""


class KVEventPublisher(Protocol):
    """A running feed of this replica's KV events to the cluster's KV index."""

    def callback(self, batch: KVEventBatch) -> None:
        """The engine's ``kv_event_callback``."""
        ...

    def close(self) -> None:
        """Stop publishing (the replica is going away)."""
        ...


class KVEventPublisherFactory(Protocol):
    """Picklable settings from the app builder; ``start`` runs inside the replica."""

    def start(self, replica_id: str, app_name: str) -> KVEventPublisher:
        """Begin publishing for ``replica_id`` of ``app_name``."""
        ...


class GangEngineFactory(Protocol):
    """Picklable settings from the app builder for an expert-parallel pool; ``start`` runs
    inside the replica: it joins the replica's gang and returns its rank's engine."""

    def start(
        self,
        model: ModelConfig,
        engine: EngineConfig,
        *,
        kv_event_callback: Callable[[KVEventBatch], None] | None = None,
    ) -> AsyncEngine:
        """Join this replica's gang; the rank's engine, stepping in lockstep with its peers."""
        ...


class RoleWorker(Protocol):
    """What :class:`RoleReplica` needs of a prefill or decode worker."""

    @property
    def engine(self) -> AsyncEngine:
        """The worker's engine."""
        ...

    def stats(self) -> dict[str, float | int]:
        """KV blocks, queues and transfer counters."""
        ...

    async def shutdown(self) -> None:
        """Stop the transport and the engine."""
        ...


class RoleReplica:
    """The replica lifecycle both roles' Serve deployments share: stats, Serve's health check
    and routing-stats hook, and the stop. Subclasses set ``role`` and, in ``__init__``,
    ``_worker``, ``_publisher`` and ``_stop_reporting``; they count ``_num_requests``."""

    role = ""
    _worker: RoleWorker
    _publisher: KVEventPublisher | None = None
    _stop_reporting: Callable[[], None] | None = None
    _num_requests = 0

    def stats(self) -> dict[str, float | int]:
        """The worker's stats, expert load (expert-parallel ranks) and ``requests_total``,
        the calls this replica received."""
        return {
            **self._worker.stats(),
            **expert_load_stats(self._worker.engine),
            "requests_total": self._num_requests,
        }

    def check_health(self) -> None:
        """Serve's health check: unhealthy once the engine stopped (for an expert-parallel
        rank: its gang broke, so Serve restarts the whole gang)."""
        if not self._worker.engine.is_running():
            raise UnavailableError(f"the {self.role} engine stopped")

    def record_routing_stats(self) -> dict[str, float | int]:
        """Serve's routing-stats hook: what a request router reads (KV blocks, queue)."""
        return dict(self._worker.stats())

    async def __del__(self) -> None:
        """Serve calls this once when the replica stops: end reports, free the engine."""
        if self._stop_reporting is not None:
            self._stop_reporting()
        if self._publisher is not None:
            self._publisher.close()
        await self._worker.shutdown()
