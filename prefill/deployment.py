"""The ``Prefill`` Ray Serve deployment: one replica runs one :class:`PrefillWorker`.

Plain class; ``cluster.serve.app_builder`` turns it into a deployment with the pool's options
(``serve.deployment(PrefillDeployment).options(...)``), so no constants are baked in here.
Across the Serve boundary everything is plain data through ``core.codec``: a request is a
``PrefillRequest``; the reply a ``PrefillReply`` holding the ``PrefillResult`` or, on a typed
failure, the ``ErrorReport`` the caller turns back into the same ``core.errors`` class.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray import serve

from core.codec import from_plain, to_plain
from core.config import EngineConfig, ModelConfig, TransferConfig
from core.errors import PdserveError
from core.messages import PrefillReply, PrefillRequest
from prefill.worker import PrefillWorker, build_prefill_worker
from replica import GangEngineFactory, KVEventPublisherFactory, RoleReplica, StatsReporter
from replica.kv_token import KVToken

logger = logging.getLogger(__name__)


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
        kv_token: KVToken | None = None,
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
        if kv_token is not None:
            transfer_cfg = kv_token.install(transfer_cfg)
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
        self._drain_timeout_s = transfer_cfg.lease_s  # an export unpulled by then has expired
        self._stop_reporting = (
            stats_reporter("prefill", self.replica_stats, self._worker.set_faults)
            if stats_reporter
            else None
        )

    async def prefill(self, request: dict[str, Any]) -> dict[str, Any]:
        """Run one prompt (a plain ``PrefillRequest``); a plain ``PrefillReply``."""
        self._num_requests += 1
        prefill_request = from_plain(PrefillRequest, request)
        try:
            reply = PrefillReply(result=await self._worker.prefill(prefill_request))
        except PdserveError as e:
            reply = PrefillReply(error=self.report_failure(prefill_request.request_id, e))
        plain: dict[str, Any] = to_plain(reply)
        return plain
