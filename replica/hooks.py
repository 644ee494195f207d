"""What the roles' Serve deployments accept from the composition root (``cluster/``).

The roles may not import ``cluster``, so the app builder hands each replica small picklable
factories that satisfy these protocols; ``start`` runs inside the replica.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from core.config import EngineConfig, ModelConfig
from core.kv_events import KVEventBatch
from core.stats import ReplicaStats
from core.transfer_faults import FaultInjection
from engine.async_engine import AsyncEngine


class StatsReporter(Protocol):
    """``reporter(role, stats_fn, on_faults) -> stop``: publishes the replica's stats while it
    lives; ``on_faults`` receives the transfer faults the cluster asks this role to inject
    (``/admin/faults``, off unless configured) and ``FaultInjection()`` when they end."""

    def __call__(
        self,
        role: str,
        stats: Callable[[], ReplicaStats],
        on_faults: Callable[[FaultInjection], None] | None = None,
    ) -> Callable[[], None]:
        """Start reporting; returns ``stop``."""
        ...


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
