"""The ``Decode`` Ray Serve deployment: one replica runs one :class:`DecodeWorker`.

Plain class; ``cluster.app`` applies the pool's options with ``.options(...)``. ``generate``
is a Serve streaming generator (callers use ``handle.options(stream=True)``): it takes a
``DecodeRequest.to_dict()`` and yields one ``TokenChunk.to_dict()`` per engine step. When the
caller goes away Serve cancels the generator; closing the worker's stream then aborts the
request, cancels its KV pull and frees its blocks.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from ray import serve

from core.config import EngineConfig, ModelConfig, TransferConfig
from core.errors import PdserveError, UnavailableError
from core.messages import DecodeRequest, TokenChunk
from decode.worker import build_decode_worker
from engine.parallel.async_ep import expert_load_stats
from engine.replica_hooks import GangEngineFactory, KVEventPublisherFactory, StatsReporter

logger = logging.getLogger(__name__)


class DecodeDeployment:
    """One decode replica: KV import, local prefill when asked, token streaming."""

    def __init__(
        self,
        model: dict[str, Any],
        engine: dict[str, Any],
        transfer: dict[str, Any],
        kv_failure_policy: str = "recompute",
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
        callback = self._publisher.callback if self._publisher else None
        rank_engine = (
            gang.start(model_cfg, engine_cfg, kv_event_callback=callback) if gang else None
        )
        self._worker = build_decode_worker(
            model_cfg,
            engine_cfg,
            TransferConfig.model_validate(transfer),
            kv_failure_policy=kv_failure_policy,
            kv_event_callback=callback,
            async_engine=rank_engine,
        )
        self._num_requests = 0
        self._stop_reporting = stats_reporter("decode", self.stats) if stats_reporter else None

    async def generate(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Stream ``TokenChunk`` dicts; a typed failure ends the stream with an error chunk."""
        decode_request = DecodeRequest.from_dict(request)
        self._num_requests += 1
        try:
            stream = cast(AsyncGenerator[TokenChunk, None], self._worker.generate(decode_request))
            async with contextlib.aclosing(stream) as chunks:
                async for chunk in chunks:
                    yield chunk.to_dict()
        except PdserveError as e:
            logger.info("decode %s failed: %s", decode_request.request_id, e.message)
            yield TokenChunk(
                request_id=decode_request.request_id,
                token_ids=[],
                text="",
                finished=True,
                finish_reason="error",
                num_prompt_tokens=len(decode_request.prompt_token_ids),
                error_type=e.error_type,
                error_message=e.message,
            ).to_dict()

    def stats(self) -> dict[str, float | int]:
        """The worker's stats (KV blocks in use, running requests, transfers in flight) plus
        ``requests_total``, the streams this replica was asked for."""
        return {
            **self._worker.stats(),
            **expert_load_stats(self._worker.engine),
            "requests_total": self._num_requests,
        }

    def check_health(self) -> None:
        """Serve's health check: unhealthy once the engine stopped (for an expert-parallel
        rank: its gang broke, so Serve restarts the whole gang)."""
        if not self._worker.engine.is_running():
            raise UnavailableError("the decode engine stopped")

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
