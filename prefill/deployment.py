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
from core.errors import PdserveError
from core.messages import PrefillRequest
from engine.replica_hooks import (
    GangEngineFactory,
    KVEventPublisherFactory,
    RoleReplica,
    StatsReporter,
)
from prefill.worker import PrefillWorker, build_prefill_worker

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


class PrefillDeployment(RoleReplica):
    """One prefill replica: the engine in prefill mode plus its KV export server."""

    role = "prefill"
    _worker: PrefillWorker

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
