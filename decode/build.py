"""Building a :class:`~decode.worker.DecodeWorker` for a replica: a real engine (or an
expert-parallel rank's) plus an import-only gRPC transport with its own transfer metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable

from core.config import EngineConfig, KVFailurePolicy, ModelConfig, TransferConfig
from core.kv_events import KVEventBatch
from decode.worker import DecodeWorker
from engine.async_engine import AsyncEngine
from engine.engine_builder import build_async_engine
from replica.kv_compat import replica_kv_compat
from replica.lora_adapters import ReplicaAdapters
from transfer import GrpcKVTransport, InMemoryTransferMetrics

logger = logging.getLogger(__name__)


def build_decode_worker(
    model: ModelConfig,
    engine: EngineConfig,
    transfer: TransferConfig,
    *,
    kv_failure_policy: KVFailurePolicy = "recompute",
    kv_event_callback: Callable[[KVEventBatch], None] | None = None,
    async_engine: AsyncEngine | None = None,
) -> DecodeWorker:
    """A decode worker on a real engine and an import-only :class:`GrpcKVTransport`.

    ``async_engine``: an engine built elsewhere (an expert-parallel rank's); default: build one.
    """
    if async_engine is None:
        async_engine = build_async_engine(model, engine, kv_event_callback=kv_event_callback)
    parts = async_engine.engine.parts
    kv_compat = replica_kv_compat(parts, model, engine)
    metrics = InMemoryTransferMetrics()
    transport = GrpcKVTransport(
        parts.storage,
        transfer,
        serve=False,
        metrics=metrics,
        rank_stores=async_engine.engine.rank_storages,
        kv_compat=kv_compat,
    )
    logger.info(
        "decode worker ready: %d KV blocks, layout %s, KV fingerprint %s, kv_failure_policy=%s",
        parts.storage.num_blocks,
        parts.layout.fingerprint(),
        kv_compat.fingerprint(),
        kv_failure_policy,
    )
    adapters = ReplicaAdapters(model.lora_modules)
    adapters.load_all(async_engine)
    return DecodeWorker(
        async_engine,
        transport,
        kv_failure_policy=kv_failure_policy,
        metrics=metrics,
        kv_compat=kv_compat,
        adapters=adapters,
    )
