"""The gRPC KV data plane: export paged KV blocks under leases, pull them elsewhere.

The only package that imports grpc. Roles program against :class:`KVTransport`;
:class:`GrpcKVTransport` is the real one, :class:`InProcKVTransport` the in-process one for tests.
"""

from transfer.block_store import BlockStore, NumpyBlockStore
from transfer.client import KVImportClient
from transfer.faults import FaultInjection
from transfer.inproc import InProcKVHub, InProcKVTransport
from transfer.leases import ReleaseCause
from transfer.server import KVExportServer
from transfer.task import TransferTask
from transfer.transfer_metrics import (
    InMemoryTransferMetrics,
    TransferMetrics,
    TransferMetricsSnapshot,
    TransferSide,
)
from transfer.transport import GrpcKVTransport, KVTransport

__all__ = [
    "BlockStore",
    "FaultInjection",
    "GrpcKVTransport",
    "InMemoryTransferMetrics",
    "InProcKVHub",
    "InProcKVTransport",
    "KVExportServer",
    "KVImportClient",
    "KVTransport",
    "NumpyBlockStore",
    "ReleaseCause",
    "TransferMetrics",
    "TransferMetricsSnapshot",
    "TransferSide",
    "TransferTask",
]
