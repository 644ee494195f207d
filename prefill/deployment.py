"""The ``Prefill`` Ray Serve deployment: one replica runs one :class:`PrefillWorker`.

Plain class; ``cluster.app`` turns it into a deployment with the pool's options
(``serve.deployment(PrefillDeployment).options(...)``), so no constants are baked in here.
Across the Serve boundary everything is a JSON-shaped dict: a request is
``PrefillRequest.to_dict()``; the reply is ``{"result": PrefillResult.to_dict()}`` or, on a
typed failure, ``{"error": {"class", "message", "param", "reason", "retry_after_s"}}`` so the
caller can re-raise the same ``core.errors`` class without unpickling anything.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import ray
from ray import serve

from core.config import EngineConfig, ModelConfig, TransferConfig
from core.errors import PdserveError, UnavailableError
from core.kv_events import KVEventBatch
from core.messages import PrefillRequest
from engine.async_engine import AsyncEngine
from engine.parallel.async_ep import expert_load_stats
from prefill.worker import PrefillWorker, build_prefill_worker
from transfer import GrpcKVTransport, InMemoryTransferMetrics

logger = logging.getLogger(__name__)

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


def error_to_dict(error: PdserveError) -> dict[str, Any]:
    """A typed error as plain values (``cluster`` rebuilds the same class from it)."""
    return {
        "class": type(error).__name__,
        "message": error.message,
        "param": error.param,
        "reason": getattr(error, "reason", None),
        "retry_after_s": getattr(error, "retry_after_s", None),
    }


class PrefillDeployment:
    """One prefill replica: the engine in prefill mode plus its KV export server."""

    def __init__(
        self,
        model: dict[str, Any],
        engine: dict[str, Any],
        transfer: dict[str, Any],
        stats_reporter: StatsReporter | None = None,
        kv_events: KVEventPublisherFactory | None = None,
        gang: GangEngineFactory | None = None,
    ) -> None:
        context = serve.get_replica_context()
        self._publisher = (
            kv_events.start(context.replica_id.unique_id, context.app_name) if kv_events else None
        )
        model_cfg, engine_cfg = (
            ModelConfig.model_validate(model),
            EngineConfig.model_validate(engine),
        )
        transfer_cfg = TransferConfig.model_validate(transfer)
        callback = self._publisher.callback if self._publisher else None
        node_host = ray.util.get_node_ip_address()
        if gang is None:
            self._worker = build_prefill_worker(
                model_cfg, engine_cfg, transfer_cfg, node_host=node_host, kv_event_callback=callback
            )
        else:
            rank_engine = gang.start(model_cfg, engine_cfg, kv_event_callback=callback)
            self._worker = _worker_on(rank_engine, transfer_cfg, node_host)
        self._num_requests = 0
        self._stop_reporting = stats_reporter("prefill", self.stats) if stats_reporter else None

    async def prefill(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run one prompt: ``{"result": PrefillResult dict}`` or ``{"error": ...}``."""
        self._num_requests += 1
        try:
            result = await self._worker.prefill(PrefillRequest.from_dict(request))
        except PdserveError as e:
            logger.info("prefill %s failed: %s", request.get("request_id"), e.message)
            return {"error": error_to_dict(e)}
        return {"result": result.to_dict()}

    def stats(self) -> dict[str, float | int]:
        """The worker's stats (KV blocks, pinned exports, transfer counters) plus
        ``requests_total``, the prefill calls this replica received."""
        return {
            **self._worker.stats(),
            **expert_load_stats(self._worker.engine),
            "requests_total": self._num_requests,
        }

    def check_health(self) -> None:
        """Serve's health check: unhealthy once the engine stopped (for an expert-parallel
        rank: its gang broke, so Serve restarts the whole gang)."""
        if not self._worker.engine.is_running():
            raise UnavailableError("the prefill engine stopped")

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


def _worker_on(engine: AsyncEngine, transfer: TransferConfig, node_host: str) -> PrefillWorker:
    """A prefill worker on an already built engine (an expert-parallel rank's)."""
    metrics = InMemoryTransferMetrics()
    transport = GrpcKVTransport(
        engine.engine.parts.storage, transfer, serve=True, node_host=node_host, metrics=metrics
    )
    return PrefillWorker(engine, transport, metrics=metrics)
