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
from typing import Any

import ray
from ray import serve

from core.config import EngineConfig, ModelConfig, TransferConfig
from core.errors import PdserveError, UnavailableError
from core.messages import PrefillRequest
from engine.parallel.async_ep import expert_load_stats
from engine.replica_hooks import GangEngineFactory, KVEventPublisherFactory, StatsReporter
from prefill.worker import build_prefill_worker

logger = logging.getLogger(__name__)


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
        rank_engine = (
            gang.start(model_cfg, engine_cfg, kv_event_callback=callback) if gang else None
        )
        self._worker = build_prefill_worker(
            model_cfg,
            engine_cfg,
            transfer_cfg,
            node_host=node_host,
            kv_event_callback=callback,
            async_engine=rank_engine,
        )
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
