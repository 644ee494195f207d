"""What the composition root (``cluster/``) plugs into a replica.

The roles may not import ``cluster`` (nor Ray), so the app builder hands each replica a
:class:`ReplicaHooks` of small picklable objects that satisfy these protocols; each one's
methods run inside the replica. Without hooks a replica runs alone: no stats board, no KV
index, no gang, and an identity made up locally (unit tests, one-process use).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from core.config import EngineConfig, ModelConfig
from core.kv_events import KVEventBatch
from core.lora_registry import RegisteredAdapter
from core.stats import ReplicaStats
from core.transfer_faults import FaultInjection
from engine.async_engine import AsyncEngine
from replica.kv_token import KVToken


@dataclass(frozen=True)
class ReplicaIdentity:
    """Who this replica is: its id and application (KV events are keyed by them) and its node."""

    replica_id: str
    app_name: str
    node_host: str | None = None
    """The node's address; None: the transfer layer finds it."""


class ReplicaIdentitySource(Protocol):
    """Reads the running replica's identity (Serve's replica context, inside the replica)."""

    def current(self) -> ReplicaIdentity:
        """This replica's identity."""
        ...


@dataclass(frozen=True)
class LocalIdentity:
    """The identity of a replica that runs outside Serve: this process."""

    app_name: str = ""

    def current(self) -> ReplicaIdentity:
        """``local-<pid>`` of ``app_name``; the node address is left to the transfer layer."""
        return ReplicaIdentity(replica_id=f"local-{os.getpid()}", app_name=self.app_name)


class StatsReporter(Protocol):
    """``reporter(role, stats_fn, on_faults, on_adapters, on_hand_off) -> stop``: publishes the
    replica's stats while it lives; ``on_faults`` receives the transfer faults the cluster asks
    this role to inject (``/admin/faults``, off unless configured) and ``FaultInjection()`` when
    they end; ``on_adapters`` is awaited with the LoRA adapters the cluster registered for this
    replica's model (``/v1/load_lora_adapter``), after every report; ``on_hand_off`` is awaited
    after each report while the cluster asks the replica's pool to hand its requests off (a
    rolling upgrade taking it away)."""

    def __call__(
        self,
        role: str,
        stats: Callable[[], ReplicaStats],
        on_faults: Callable[[FaultInjection], None] | None = None,
        on_adapters: Callable[[Sequence[RegisteredAdapter]], Awaitable[None]] | None = None,
        on_hand_off: Callable[[], Awaitable[object]] | None = None,
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


class KVTokenSource(Protocol):
    """Picklable settings from the app builder; ``fetch`` runs inside the replica's constructor
    and returns the KV transfer secret of the app the replica joins (a rolling upgrade's second
    app shares the running app's, so both versions' replicas may pull from each other)."""

    def fetch(self) -> KVToken:
        """The secret; a typed error (``core.errors``) when it cannot be had."""
        ...


@dataclass(frozen=True)
class ReplicaHooks:
    """Everything the composition root plugs into one replica; None: that part is off."""

    identity: ReplicaIdentitySource = LocalIdentity()
    stats_reporter: StatsReporter | None = None
    kv_events: KVEventPublisherFactory | None = None
    gang: GangEngineFactory | None = None
    kv_token: KVTokenSource | None = None
    """Where the replica fetches the cluster's generated KV secret at boot, unless a token is
    configured in its process; None: the spec's (or the configured) token."""
