"""The import side over gRPC: pull exported blocks into a decode worker's block store.

:class:`KVImportClient` keeps one channel per exporter address, shared by every transfer to that
peer, and runs pulls on the :class:`~transfer.importer.ImportRunner` thread pool. Every call has
a deadline (``pull_deadline_s`` for a whole stream, ``rpc_deadline_s`` for Heartbeat and
Release), carries the auth token and uses mTLS when configured. gRPC failures become
``TransferError`` with a ``TransferFailure`` reason (``transfer.status_codes``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import grpc

from core.config import TransferConfig
from core.errors import TransferError
from core.kv_handle import KVHandle, TransferFailure
from transfer.block_store import BlockStore
from transfer.codec import ChunkDecodeError, ChunkView, decode_chunk
from transfer.importer import ImportRunner
from transfer.metrics import InMemoryTransferMetrics, TransferMetrics
from transfer.proto._generated import kv_transfer_pb2 as pb
from transfer.rpc import KVTransferClientMethods, message_options
from transfer.security import call_metadata, channel_credentials, resolve_auth_token
from transfer.status_codes import details_of, reason_for
from transfer.task import TransferTask

logger = logging.getLogger(__name__)

# Reconnect quickly after an exporter restarts at the same address.
_RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


class _GrpcChunkStream:
    """One Pull call as a :class:`~transfer.importer.ChunkStream`."""

    def __init__(self, call: grpc.Call, transfer_id: str) -> None:
        self._call = call
        self._transfer_id = transfer_id

    def __iter__(self) -> Iterator[ChunkView]:
        try:
            for message in self._call:
                yield decode_chunk(message)
        except grpc.RpcError as e:
            raise TransferError(
                f"pull of {self._transfer_id} failed: {details_of(e)}", reason=reason_for(e)
            ) from e
        except ChunkDecodeError as e:
            raise TransferError(
                f"pull of {self._transfer_id}: undecodable chunk: {e}",
                reason=TransferFailure.BAD_CHUNK,
            ) from e

    def cancel(self) -> None:
        self._call.cancel()


class KVImportClient:
    """Pulls exports into one block store; one channel per peer, pulls on a thread pool."""

    def __init__(
        self,
        store: BlockStore,
        config: TransferConfig,
        *,
        metrics: TransferMetrics | None = None,
    ) -> None:
        self.metrics = metrics or InMemoryTransferMetrics()
        self._config = config
        self._metadata = call_metadata(resolve_auth_token(config))
        self._credentials = channel_credentials(config)
        self._options: list[tuple[str, str | int]] = [
            *message_options(config),
            *_RECONNECT_OPTIONS,
        ]
        if config.tls_server_name:
            self._options.append(("grpc.ssl_target_name_override", config.tls_server_name))
        self._runner = ImportRunner(store, num_threads=config.import_threads, metrics=self.metrics)
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[grpc.Channel, KVTransferClientMethods]] = {}
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
        return self._runner.submit(
            handle, dst_block_ids, wanted_indices, self._open_stream, self.release
        )

    def heartbeat(self, handle: KVHandle) -> int:
        """Extend the export's lease; returns the new deadline (ms since the Unix epoch)."""
        request = pb.HeartbeatRequest(transfer_id=handle.transfer_id)
        response = self._unary("heartbeat", handle, request)
        return int(response.lease_deadline_unix_ms)

    def release(self, handle: KVHandle) -> None:
        """Tell the exporter to free the export now; ``TransferError`` if it cannot."""
        self._unary("release", handle, pb.ReleaseRequest(transfer_id=handle.transfer_id))

    def _unary(self, method: str, handle: KVHandle, request: object) -> Any:
        methods = self._methods(handle.address)
        try:
            return getattr(methods, method)(
                request, timeout=self._config.rpc_deadline_s, metadata=self._metadata
            )
        except grpc.RpcError as e:
            raise TransferError(
                f"{method} of {handle.transfer_id} failed: {details_of(e)}", reason=reason_for(e)
            ) from e

    def _open_stream(self, handle: KVHandle, wanted: list[int]) -> _GrpcChunkStream:
        request = pb.PullRequest(
            transfer_id=handle.transfer_id,
            block_indices=wanted,
            layout_fingerprint=handle.layout_fingerprint,
            exporter_epoch=handle.exporter_epoch,
        )
        call = self._methods(handle.address).pull(
            request, timeout=self._config.pull_deadline_s, metadata=self._metadata
        )
        return _GrpcChunkStream(call, handle.transfer_id)

    def _methods(self, address: str) -> KVTransferClientMethods:
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
            return entry[1]

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
        for channel, _ in channels:
            channel.close()

    def __enter__(self) -> KVImportClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
