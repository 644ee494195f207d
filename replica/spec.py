"""What one replica boots from, and what the boot hands the role's worker builder.

:class:`ReplicaSpec` is built once per pool by the app builder (``cluster.serve``) from the one
``ClusterConfig`` and crosses into the replica as plain data through ``core.codec``: the role,
the model and engine sections (the pool's engine overrides merged in), the transfer section,
the role's own options and the cluster's generated KV token. Every value keeps its type on both
sides: the config sections are the schema's own models, re-validated on decode.

:class:`WorkerBoot` is what :class:`~replica.lifecycle.RoleReplica` has prepared when it asks
the role for its worker: the spec, the transfer settings with the token installed, the node's
address, the KV-event callback, and a gang rank's engine when the pool is expert-parallel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from core.config import EngineConfig, KVFailurePolicy, ModelConfig, Role, TransferConfig
from core.kv_events import KVEventBatch
from engine.async_engine import AsyncEngine
from replica.kv_token import KVToken


@dataclass(frozen=True)
class ReplicaSpec:
    """One pool's replica, as the app builder configured it (codec-encodable)."""

    role: Role
    model: ModelConfig
    engine: EngineConfig
    transfer: TransferConfig
    kv_failure_policy: KVFailurePolicy = "recompute"
    """Decode's option: what a failed KV pull does (the decode pool's ``kv_failure_policy``)."""
    kv_token: KVToken | None = None
    """The cluster's generated KV transfer secret; None when the config names a token."""

    def transfer_config(self) -> TransferConfig:
        """The transfer section for this process, with the generated token installed."""
        if self.kv_token is None:
            return self.transfer
        return self.kv_token.install(self.transfer)


@dataclass(frozen=True)
class WorkerBoot:
    """What a role's ``build_worker`` gets: everything prepared, nothing left to look up."""

    spec: ReplicaSpec
    transfer: TransferConfig
    """``spec.transfer`` with the KV token installed."""
    node_host: str | None
    """This node's address (the export server advertises it); None: the transfer decides."""
    kv_event_callback: Callable[[KVEventBatch], None] | None
    """The engine's KV-event callback (the cluster's KV index feed); None: not published."""
    engine: AsyncEngine | None
    """An expert-parallel rank's engine, joined to its gang; None: the worker builds one."""
