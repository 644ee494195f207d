"""The ``Decode`` Ray Serve deployment: one replica runs one :class:`DecodeWorker`.

Plain class; ``cluster.serve.app_builder`` applies the pool's options with ``.options(...)``.
``generate`` is a Serve streaming generator (callers use ``handle.options(stream=True)``): it
takes a plain ``DecodeRequest`` and yields one plain ``TokenChunk`` per engine step (``core.
codec``). When the caller goes away Serve cancels the generator; closing the worker's stream then
aborts the request, cancels its KV pull and frees its blocks.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from ray import serve

from core.codec import from_plain, to_plain
from core.config import EngineConfig, ModelConfig, TransferConfig
from core.messages import DecodeRequest, TokenChunk
from decode.build import build_decode_worker
from decode.worker import DecodeWorker
from replica import GangEngineFactory, KVEventPublisherFactory, RoleReplica, StatsReporter
from replica.kv_token import KVToken

logger = logging.getLogger(__name__)


class DecodeDeployment(RoleReplica):
    """One decode replica: KV import, local prefill when asked, token streaming."""

    role = "decode"
    _worker: DecodeWorker

    def __init__(
        self,
        model: dict[str, Any],
        engine: dict[str, Any],
        transfer: dict[str, Any],
        kv_failure_policy: str = "recompute",
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
        callback = self._publisher.callback if self._publisher else None
        rank_engine = (
            gang.start(model_cfg, engine_cfg, kv_event_callback=callback) if gang else None
        )
        self._worker = build_decode_worker(
            model_cfg,
            engine_cfg,
            _transfer_config(transfer, kv_token),
            kv_failure_policy=kv_failure_policy,
            kv_event_callback=callback,
            async_engine=rank_engine,
        )
        self._num_requests = 0
        self._stop_reporting = (
            stats_reporter("decode", self.replica_stats) if stats_reporter else None
        )

    async def generate(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Stream plain ``TokenChunk`` s; a typed failure ends the stream with a chunk carrying
        its ``ErrorReport`` (the worker's own last chunk)."""
        decode_request = from_plain(DecodeRequest, request)
        self._num_requests += 1
        stream = cast(AsyncGenerator[TokenChunk, None], self._worker.generate(decode_request))
        async with contextlib.aclosing(stream) as chunks:
            async for chunk in chunks:
                yield to_plain(chunk)


def _transfer_config(transfer: dict[str, Any], kv_token: KVToken | None) -> TransferConfig:
    config = TransferConfig.model_validate(transfer)
    return kv_token.install(config) if kv_token is not None else config
