"""A real prefill and decode pair for the P/D hand-off tests: the ``Pair`` over one transport
kind (in-process or gRPC), how it is made from the session's workers, and the check that both
sides end quiescent.

The gRPC pair uses the workers of the real builders (``build_prefill_worker`` /
``build_decode_worker``, gRPC on 127.0.0.1); the in-process pair wraps the same engines with
``InProcKVTransport``s, so every test runs over both transports without loading more models.
The prefill's KV lives in shared memory: the in-process pair copies it on the same-node path,
while the gRPC decode has ``transfer.same_node: off`` and pulls the bytes over the wire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from core.config import TransferConfig
from decode.worker import DecodeWorker
from prefill.worker import PrefillWorker
from tests.unit.engine.async_engine.tiny_engine import check_integrity
from tests.waiting import wait_until
from transfer import FaultInjection, GrpcKVTransport, InProcKVHub, InProcKVTransport, KVTransport

TRANSFER = TransferConfig(
    bind_host="127.0.0.1",
    insecure_test_token="roles-unit-test",
    pull_deadline_s=10.0,
    rpc_deadline_s=2.0,
)


@dataclass
class Pair:
    """A prefill worker and decode workers (one per failure policy) over one transport kind."""

    kind: str
    prefill: PrefillWorker
    decode: DecodeWorker
    decode_fail: DecodeWorker
    set_faults: Callable[[FaultInjection], None]
    make_exporter_of: Callable[[float], KVTransport]
    hub: InProcKVHub | None = None
    extra: list[PrefillWorker] = field(default_factory=list)
    closables: list[KVTransport] = field(default_factory=list)

    def make_exporter(self, lease_s: float) -> KVTransport:
        """Another exporter over the prefill engine's storage, with its own lease; closed at
        teardown, reachable by ``decode``."""
        transport = self.make_exporter_of(lease_s)
        self.closables.append(transport)
        return transport

    @property
    def block_bytes(self) -> int:
        """Bytes of one KV block."""
        return self.prefill.engine.engine.parts.layout.block_bytes


def make_pair(kind: str, prefill: PrefillWorker, decode: DecodeWorker) -> Pair:
    storage = prefill.engine.engine.parts.storage
    if kind == "grpc":
        transport = prefill.transport
        assert isinstance(transport, GrpcKVTransport) and transport.server is not None
        fail = DecodeWorker(decode.engine, decode.transport, kv_failure_policy="fail")

        def grpc_exporter(lease_s: float) -> KVTransport:
            config = TRANSFER.model_copy(update={"lease_s": lease_s})
            return GrpcKVTransport(storage, config, serve=True, kv_compat=prefill.kv_compat)

        return Pair(kind, prefill, decode, fail, transport.server.set_faults, grpc_exporter)
    hub = InProcKVHub()
    chunk_bytes = 2 * storage.layout.block_bytes  # several chunks per pull
    exporter = InProcKVTransport(storage, hub, chunk_bytes=chunk_bytes)
    importer = InProcKVTransport(decode.engine.engine.parts.storage, hub)
    pair = Pair(
        kind,
        PrefillWorker(prefill.engine, exporter),
        DecodeWorker(decode.engine, importer, kv_failure_policy="recompute"),
        DecodeWorker(decode.engine, importer, kv_failure_policy="fail"),
        exporter.set_faults,
        lambda lease_s: InProcKVTransport(storage, hub, lease_s=lease_s),
        hub,
    )
    pair.closables += [exporter, importer]
    return pair


def assert_quiescent(pair: Pair, timeout_s: float = 5.0) -> None:
    """No used KV block, no live export, no pull in flight, consistent bookkeeping — both sides."""
    workers: list[PrefillWorker | DecodeWorker] = [pair.prefill, *pair.extra, pair.decode]

    def idle() -> bool:
        for worker in workers:
            stats = worker.stats()
            if stats.kv_blocks_used or stats.transfer.in_flight or stats.exports_pinned:
                return False
            if stats.num_running or stats.num_waiting:
                return False
        return True

    assert wait_until(idle, timeout_s), [w.stats() for w in workers]
    for engine in (pair.prefill.engine, pair.decode.engine):
        asyncio.run(check_integrity(engine))
