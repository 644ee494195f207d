"""The export side over gRPC: a sync server in the prefill worker's process.

:class:`KVExportServer` serves ``pdserve.kv.v1.KVTransfer`` (Pull, Heartbeat, Release, Await) and
the standard ``grpc.health.v1`` service from a thread pool (a sync server: it streams bulk bytes
faster than grpc.aio). It binds the node's address (``transfer.addressing``), sets message size
limits explicitly, checks the auth token before any handler runs and serves mTLS when configured.
The wire-independent rules (leases, validation, faults) live in :class:`KVExporter`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from core.config import TransferConfig
from core.errors import ConfigError, TransferError
from core.kv_compat import KVCompat
from core.kv_handle import KVHandle, TransferFailure
from transfer.addressing import host_port, is_loopback, is_wildcard, node_address
from transfer.block_store import BlockStore
from transfer.checksums import ChecksumAlgorithm
from transfer.chunk_wire import encode_chunk
from transfer.exporter import KVExporter
from transfer.faults import FaultInjection
from transfer.leases import OnRelease
from transfer.proto._generated import kv_transfer_pb2 as pb
from transfer.rpc import SERVICE_NAME, generic_handler, message_options
from transfer.same_node import local_node_id
from transfer.security import TokenAuthInterceptor, resolve_auth_token, server_credentials
from transfer.shards import KVShard
from transfer.status_codes import REASON_METADATA_KEY, code_for
from transfer.transfer_metrics import InMemoryTransferMetrics, TransferMetrics

logger = logging.getLogger(__name__)

AWAIT_MAX_WAIT_S = 5.0
"""Longest an Await call holds a server thread before answering anyway (the importer asks
again)."""


class _KVTransferServicer:
    def __init__(self, exporter: KVExporter) -> None:
        self._exporter = exporter

    def Pull(self, request: pb.PullRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        cancelled = threading.Event()
        context.add_callback(cancelled.set)
        try:
            if request.same_node:
                locations = self._exporter.pull_locations(
                    request.transfer_id,
                    list(request.block_indices),
                    request.layout_fingerprint,
                    request.exporter_epoch,
                    cancelled,
                    _encode_locations,
                    list(request.accepted_checksums),
                    device=request.device,
                    kv_compat=request.kv_compat,
                )
                with closing(locations):
                    yield from locations
                return
            chunks = self._exporter.pull(
                request.transfer_id,
                list(request.block_indices),
                request.layout_fingerprint,
                request.exporter_epoch,
                cancelled,
                encode_chunk,
                list(request.accepted_checksums),
                keep_export=request.keep_export,
                shard=_shard_of(request),
                kv_compat=request.kv_compat,
            )
            with closing(chunks):
                yield from chunks
        except TransferError as e:
            _abort(context, e)

    def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.ServicerContext
    ) -> pb.HeartbeatResponse:
        try:
            deadline_ms = self._exporter.heartbeat(request.transfer_id)
        except TransferError as e:
            _abort(context, e)
        return pb.HeartbeatResponse(lease_deadline_unix_ms=deadline_ms)

    def Release(
        self, request: pb.ReleaseRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseResponse:
        try:
            self._exporter.release(request.transfer_id, completed=request.completed)
        except TransferError as e:
            _abort(context, e)
        return pb.ReleaseResponse()

    def Await(self, request: pb.AwaitRequest, context: grpc.ServicerContext) -> pb.AwaitResponse:
        wait_s = min(request.wait_ms / 1000, AWAIT_MAX_WAIT_S)
        try:
            num_ready, done = self._exporter.await_ready(
                request.transfer_id, request.min_ready_blocks, wait_s
            )
        except TransferError as e:
            _abort(context, e)
        if done is None:
            return pb.AwaitResponse(num_ready_blocks=num_ready)
        return pb.AwaitResponse(
            num_ready_blocks=num_ready,
            done=True,
            first_token_id=done.first_token_id,
            prompt_chunk_ends=list(done.prompt_chunk_ends),
        )


def _shard_of(request: pb.PullRequest) -> KVShard | None:
    """The request's shard of the heads (None: whole blocks)."""
    if not request.head_count:
        return None
    return KVShard(request.shard_rank, request.head_start, request.head_count)


def _encode_locations(
    offset_bytes: int, total_bytes: int, algorithm: int, checksum: int, block_ids: list[int]
) -> bytes:
    """A same-node ``Chunk``: where its blocks lie and their bytes' checksum (none on the
    device path), no payload."""
    chunk = pb.Chunk(
        offset_bytes=offset_bytes,
        total_bytes=total_bytes,
        checksum_algorithm=algorithm,  # type: ignore[arg-type]
        source_block_ids=block_ids,
    )
    if algorithm == ChecksumAlgorithm.CRC32:
        chunk.crc32 = checksum
    elif algorithm == ChecksumAlgorithm.XXH3_64:
        chunk.checksum64 = checksum
    return chunk.SerializeToString()


def _abort(context: grpc.ServicerContext, error: TransferError) -> None:
    reason = TransferFailure(error.reason)
    context.set_trailing_metadata(((REASON_METADATA_KEY, reason.value),))
    context.abort(code_for(reason), error.message)


class KVExportServer:
    """Serves one block store's exports over gRPC until :meth:`stop`."""

    def __init__(
        self,
        store: BlockStore,
        config: TransferConfig,
        *,
        node_host: str | None = None,
        metrics: TransferMetrics | None = None,
        faults: FaultInjection | None = None,
        rank_stores: Sequence[BlockStore] = (),
        kv_compat: KVCompat | None = None,
    ) -> None:
        """Bind, register the services and start serving.

        ``node_host`` is the node's address as the caller knows it (Ray's node IP); it is used
        when ``config.bind_host`` is unset. ``rank_stores``: every rank's store on rank 0 of a
        tensor-parallel gang (see :class:`KVExporter`). Raises ``ConfigError`` if the address
        cannot be bound.
        """
        self.metrics = metrics or InMemoryTransferMetrics()
        token = resolve_auth_token(config)
        host = config.bind_host or node_host or node_address()
        if token is None:
            if not is_loopback(host):
                raise ConfigError(
                    f"the kv transfer server would bind {host}, which is not a loopback "
                    "address, without an auth token: configure transfer.auth_token_file or the "
                    f"{config.auth_token_env or 'transfer.auth_token_env'} variable (pdserve "
                    "generates a per-cluster secret when it deploys the app)",
                    param="transfer.auth_token_env",
                )
            logger.warning("kv transfer server on loopback %s runs WITHOUT an auth token", host)
        self._executor = ThreadPoolExecutor(
            config.server_threads, thread_name_prefix="pdserve-kv-export"
        )
        self._server = grpc.server(
            self._executor,
            interceptors=[TokenAuthInterceptor(token, self.metrics.call_rejected)] if token else [],
            options=[*message_options(config), ("grpc.so_reuseport", 0)],
        )
        port = self._bind(host, config)
        advertised = (node_host or node_address()) if is_wildcard(host) else host
        self.exporter = KVExporter(
            store,
            address=host_port(advertised, port),
            lease_s=config.lease_s,
            chunk_bytes=config.chunk_bytes,
            metrics=self.metrics,
            faults=faults,
            node_id=local_node_id(),
            rank_stores=rank_stores,
            kv_compat=kv_compat,
        )
        self._server.add_generic_rpc_handlers(
            (generic_handler(_KVTransferServicer(self.exporter)),)
        )
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        for service in ("", SERVICE_NAME):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        self._server.start()
        self._stopped = False
        logger.info("kv transfer server listening on %s (tls=%s)", self.address, self.tls)

    def _bind(self, host: str, config: TransferConfig) -> int:
        credentials = server_credentials(config)
        self.tls = credentials is not None
        target = host_port(host, config.port)
        try:
            if credentials is None:
                port = self._server.add_insecure_port(target)
            else:
                port = self._server.add_secure_port(target, credentials)
        except RuntimeError as e:
            raise ConfigError(
                f"cannot bind kv transfer server to {target}: {e}", param="transfer.port"
            ) from e
        if port == 0:
            raise ConfigError(f"cannot bind kv transfer server to {target}", param="transfer.port")
        return port

    @property
    def address(self) -> str:
        """``host:port`` that importers dial (carried by every handle)."""
        return self.exporter.address

    def export(self, block_ids: Sequence[int], on_release: OnRelease | None = None) -> KVHandle:
        """Pin ``block_ids`` under a lease; see :meth:`KVExporter.export`."""
        return self.exporter.export(block_ids, on_release)

    def set_faults(self, faults: FaultInjection) -> None:
        """Inject ``faults`` into every pull that starts from now on."""
        self.exporter.faults = faults

    def stop(self, grace_s: float = 0.0) -> None:
        """Stop serving (in-flight pulls end), free every export, join the threads. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._health.enter_graceful_shutdown()
        self._server.stop(grace_s).wait()
        self.exporter.close()
        self._executor.shutdown(wait=True)
        logger.info("kv transfer server on %s stopped", self.address)

    def __enter__(self) -> KVExportServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
