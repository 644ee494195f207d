"""The import side over gRPC: pull exported blocks into a decode worker's block store.

:class:`KVImportClient` keeps one channel per exporter address, shared by every transfer to that
peer, and runs pulls on the :class:`~transfer.importer.ImportRunner` thread pool, spread over
several concurrent streams when large (``transfer.num_streams``) and segment by segment for a
pipelined export (``Await``). Every call has a deadline (``pull_deadline_s`` for a stream,
``rpc_deadline_s`` for Heartbeat and Release, plus the wait for Await), carries the auth token
and uses mTLS when configured. Each Pull offers the checksum
algorithms this importer verifies (``transfer.checksums``). gRPC failures become
``TransferError`` with a ``TransferFailure`` reason (``transfer.status_codes``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar, cast

import grpc
import grpc.experimental
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc

from core.config import TransferConfig
from core.errors import TransferError
from core.kv_compat import KVCompat
from core.kv_handle import ExportDone, KVHandle, TransferFailure
from transfer.block_store import BlockStore
from transfer.checksums import ACCEPTED_CHECKSUMS, ChecksumAlgorithm
from transfer.chunk_wire import ChunkDecodeError, decode_chunk
from transfer.device_path import DeviceSource
from transfer.importer import ImportRunner
from transfer.paths import PathChooser, PullSource, source_stream
from transfer.proto._generated import kv_transfer_pb2 as pb
from transfer.pull import ChunkStream
from transfer.rpc import SERVICE_NAME, KVTransferClientMethods, message_options
from transfer.same_node import Locations
from transfer.security import call_metadata, channel_credentials, resolve_auth_token
from transfer.shards import KVShard
from transfer.status_codes import details_of, reason_for
from transfer.streams import StreamPlan
from transfer.task import TransferTask
from transfer.transfer_metrics import InMemoryTransferMetrics, TransferMetrics

logger = logging.getLogger(__name__)

_CHANNEL_OPTIONS: list[tuple[str, str | int]] = [
    # Reconnect quickly after an exporter restarts at the same address.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # The pulling thread reads its own stream: no channel spin thread to start per call and no
    # thread hand-off per chunk (lower latency, a little less CPU per byte). The stream still
    # supports cancel() from another thread, deadlines and errors as before.
    (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),
]


StreamItem = TypeVar("StreamItem")


class _GrpcStream(Generic[StreamItem]):
    """One Pull call as a :class:`~transfer.pull.ChunkStream` (its messages decoded as
    chunks) or as a same-node stream of :class:`~transfer.same_node.Locations`."""

    def __init__(
        self, call: grpc.Call, transfer_id: str, decode: Callable[[bytes], StreamItem]
    ) -> None:
        self._call = call
        self._transfer_id = transfer_id
        self._decode = decode

    def __iter__(self) -> Iterator[StreamItem]:
        try:
            for message in self._call:
                yield self._decode(message)
        except grpc.RpcError as e:
            raise TransferError(
                f"pull of {self._transfer_id} failed: {details_of(e)}", reason=reason_for(e)
            ) from e
        except (ChunkDecodeError, DecodeError) as e:
            raise TransferError(
                f"pull of {self._transfer_id}: undecodable chunk: {e}",
                reason=TransferFailure.BAD_CHUNK,
            ) from e

    def cancel(self) -> None:
        self._call.cancel()


def _decode_locations(message: bytes) -> Locations:
    """A same-node ``Chunk``: its block ids and the checksum of their bytes."""
    chunk = pb.Chunk.FromString(message)
    algorithm = int(chunk.checksum_algorithm)
    return Locations(
        chunk.offset_bytes,
        chunk.total_bytes,
        algorithm,
        chunk.crc32 if algorithm == ChecksumAlgorithm.CRC32 else chunk.checksum64,  # NONE: 0
        tuple(chunk.source_block_ids),
    )


class KVImportClient:
    """Pulls exports into one block store; one channel per peer, pulls on a thread pool."""

    def __init__(
        self,
        store: BlockStore,
        config: TransferConfig,
        *,
        metrics: TransferMetrics | None = None,
        accepted_checksums: Sequence[ChecksumAlgorithm] = ACCEPTED_CHECKSUMS,
        rank_stores: Sequence[BlockStore] = (),
        kv_compat: KVCompat | None = None,
    ) -> None:
        """``accepted_checksums``: what each Pull offers, best first (tests narrow it);
        ``rank_stores``: every rank's store on rank 0 of a tensor-parallel gang;
        ``kv_compat``: this importer's compatibility (exporters of another are refused)."""
        self.metrics = metrics or InMemoryTransferMetrics()
        self._config = config
        self._accepted_checksums = [cast(pb.ChecksumAlgorithm, int(a)) for a in accepted_checksums]
        self._kv_compat = "" if kv_compat is None else kv_compat.fingerprint()
        self._metadata = call_metadata(resolve_auth_token(config))
        self._credentials = channel_credentials(config)
        self._options: list[tuple[str, str | int]] = [
            *message_options(config),
            *_CHANNEL_OPTIONS,
        ]
        if config.tls_server_name:
            self._options.append(("grpc.ssl_target_name_override", config.tls_server_name))
        self._runner = ImportRunner(
            store,
            num_threads=config.import_threads,
            metrics=self.metrics,
            stall_s=config.pull_deadline_s,
            plan=StreamPlan.from_config(config),
            rank_stores=rank_stores,
            kv_compat=kv_compat,
        )
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[grpc.Channel, KVTransferClientMethods]] = {}
        self._paths = PathChooser(config.same_node, store, self.metrics)
        self._connecting: dict[str, grpc.Future] = {}
        self._closed = False

    def pull(
        self,
        handle: KVHandle,
        dst_block_ids: Sequence[int],
        wanted_indices: Sequence[int] | None = None,
    ) -> TransferTask:
        """Pull ``wanted_indices`` of ``handle`` (default: all) into ``dst_block_ids``.

        Returns at once; the task ends DONE or FAILED(reason). On failure the exporter is told
        to release the export. Raises ``TransferError(invalid_request)`` for bad arguments.
        """
        return self._runner.submit(handle, dst_block_ids, wanted_indices, self)

    def heartbeat(self, handle: KVHandle) -> int:
        """Extend the export's lease; returns the new deadline (ms since the Unix epoch)."""
        request = pb.HeartbeatRequest(transfer_id=handle.transfer_id)
        response = self._unary("heartbeat", handle, request)
        return int(response.lease_deadline_unix_ms)

    def release(self, handle: KVHandle, completed: bool = False) -> None:
        """Tell the exporter to free the export now (``completed``: every block this importer
        wanted arrived); ``TransferError`` if it cannot."""
        request = pb.ReleaseRequest(transfer_id=handle.transfer_id, completed=completed)
        self._unary("release", handle, request)

    def await_ready(
        self, handle: KVHandle, min_ready_blocks: int, wait_s: float
    ) -> tuple[int, ExportDone | None]:
        """A pipelined export's ready blocks and, once its prefill finished, what it ended with
        (the exporter answers once ``min_ready_blocks`` are ready or after ``wait_s``)."""
        request = pb.AwaitRequest(
            transfer_id=handle.transfer_id,
            min_ready_blocks=min_ready_blocks,
            wait_ms=int(wait_s * 1000),
        )
        response = self._unary("await_", handle, request, extra_s=wait_s)
        if not response.done:
            return int(response.num_ready_blocks), None
        done = ExportDone(int(response.first_token_id), tuple(response.prompt_chunk_ends))
        return int(response.num_ready_blocks), done

    def _unary(self, method: str, handle: KVHandle, request: object, extra_s: float = 0.0) -> Any:
        methods = self._methods(handle.address)
        try:
            return getattr(methods, method)(
                request, timeout=self._config.rpc_deadline_s + extra_s, metadata=self._metadata
            )
        except grpc.RpcError as e:
            raise TransferError(
                f"{method} of {handle.transfer_id} failed: {details_of(e)}", reason=reason_for(e)
            ) from e

    def open_stream(
        self,
        handle: KVHandle,
        wanted: list[int],
        keep_export: bool = False,
        source: PullSource | None = None,
        shard: KVShard | None = None,
    ) -> ChunkStream:
        """One Pull stream of ``wanted`` (see :class:`~transfer.pull.ExportPeer`): its
        bytes (of ``shard``'s heads only, when given), or on a same-node path (``source``)
        their locations, read from the exporter's shared host or device KV."""
        request = pb.PullRequest(
            transfer_id=handle.transfer_id,
            block_indices=wanted,
            layout_fingerprint=handle.layout_fingerprint,
            exporter_epoch=handle.exporter_epoch,
            accepted_checksums=self._accepted_checksums,
            keep_export=keep_export or source is not None,
            same_node=source is not None,
            device=isinstance(source, DeviceSource),
            kv_compat=self._kv_compat,
        )
        if shard is not None:
            request.shard_rank = shard.rank
            request.head_start = shard.head_start
            request.head_count = shard.head_count
        call = self._methods(handle.address).pull(
            request, timeout=self._config.pull_deadline_s, metadata=self._metadata
        )
        if source is None:
            return _GrpcStream(call, handle.transfer_id, decode_chunk)
        locations = _GrpcStream(call, handle.transfer_id, _decode_locations)
        return source_stream(locations, source, call.cancel)

    def choose_source(self, handle: KVHandle) -> PullSource | None:
        """Where a same-node pull of ``handle`` reads (None: over gRPC); counted."""
        return self._paths.choose(handle)

    def connect(self, address: str) -> None:
        """Open the channel to ``address`` and start connecting, without waiting.

        The first pull from a peer otherwise pays the TCP (and TLS) handshake, ~5 ms here; call
        this as soon as a peer is known. It sends one health check (``grpc.health.v1``), which
        makes the channel connect. A no-op while a previous one is in flight or once closed; a
        peer that is down costs nothing more, and a later pull fails or succeeds as usual.
        """
        if not self._may_connect(address):
            return
        try:
            channel, _ = self._entry(address)
        except TransferError:
            return  # closed meanwhile
        request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        check = health_pb2_grpc.HealthStub(channel).Check
        with self._lock:
            if self._may_connect_locked(address):
                self._connecting[address] = check.future(
                    request, timeout=self._config.rpc_deadline_s, metadata=self._metadata
                )

    def _may_connect(self, address: str) -> bool:
        with self._lock:
            return self._may_connect_locked(address)

    def _may_connect_locked(self, address: str) -> bool:
        previous = self._connecting.get(address)
        return not self._closed and (previous is None or previous.done())

    def _methods(self, address: str) -> KVTransferClientMethods:
        return self._entry(address)[1]

    def _entry(self, address: str) -> tuple[grpc.Channel, KVTransferClientMethods]:
        with self._lock:
            if self._closed:
                raise TransferError("import client is closed", reason=TransferFailure.CANCELLED)
            entry = self._channels.get(address)
            if entry is None:
                if self._credentials is None:
                    channel = grpc.insecure_channel(address, options=self._options)
                else:
                    channel = grpc.secure_channel(address, self._credentials, options=self._options)
                entry = (channel, KVTransferClientMethods(channel))
                self._channels[address] = entry
            return entry

    def num_channels(self) -> int:
        """Open channels (one per exporter address seen)."""
        with self._lock:
            return len(self._channels)

    def num_in_flight(self) -> int:
        """Pulls queued or running."""
        return self._runner.num_in_flight()

    def close(self) -> None:
        """Cancel in-flight pulls, stop the thread pool and close every channel. Idempotent."""
        self._runner.close()
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
            connecting, self._connecting = list(self._connecting.values()), {}
        for future in connecting:
            future.cancel()
        for channel, _ in channels:
            channel.close()

    def __enter__(self) -> KVImportClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
