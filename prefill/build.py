"""Building a :class:`~prefill.worker.PrefillWorker` for a replica: a real engine (or an
expert-parallel rank's) plus a serving gRPC transport with its own transfer metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable

from core.config import EngineConfig, ModelConfig, TransferConfig
from core.kv_events import KVEventBatch
from engine.async_engine import AsyncEngine
from engine.engine_builder import build_async_engine
from prefill.worker import PrefillWorker
from replica.kv_compat import replica_kv_compat
from replica.lora_adapters import ReplicaAdapters
from transfer import GrpcKVTransport, InMemoryTransferMetrics

logger = logging.getLogger(__name__)


def build_prefill_worker(
    model: ModelConfig,
    engine: EngineConfig,
    transfer: TransferConfig,
    *,
    node_host: str | None = None,
    kv_event_callback: Callable[[KVEventBatch], None] | None = None,
    async_engine: AsyncEngine | None = None,
) -> PrefillWorker:
    """A prefill worker on a real engine and a serving :class:`GrpcKVTransport`.

    ``async_engine``: an engine built elsewhere (an expert-parallel rank's); default: build one,
    its KV in shared memory unless ``transfer.same_node`` is off (same-node decodes copy from it).
    """
    if async_engine is None:
        async_engine = build_async_engine(
            model,
            engine,
            kv_event_callback=kv_event_callback,
            shared_kv=transfer.same_node != "off",
        )
    parts = async_engine.engine.parts
    kv_compat = replica_kv_compat(parts, model, engine)
    metrics = InMemoryTransferMetrics()
    transport = GrpcKVTransport(
        parts.storage,
        transfer,
        serve=True,
        node_host=node_host,
        metrics=metrics,
        rank_stores=async_engine.engine.rank_storages,
        kv_compat=kv_compat,
    )
    logger.info(
        "prefill worker ready: %d KV blocks, exporting at %s (layout %s, KV fingerprint %s)",
        parts.storage.num_blocks,
        transport.address,
        parts.layout.fingerprint(),
        kv_compat.fingerprint(),
    )
    adapters = ReplicaAdapters(model.lora_modules)
    adapters.load_all(async_engine)
    return PrefillWorker(
        async_engine, transport, metrics=metrics, kv_compat=kv_compat, adapters=adapters
    )
