"""Which path one pull takes: device to device, through shared host memory, or over gRPC.

Per pull, from ``transfer.same_node`` and the handle: ``off`` always takes gRPC. Otherwise an
exporter on another node (by the node identity in the handle), or one naming no region, is
pulled over gRPC. On the same node, ``auto`` first maps the exporter's device KV
(``transfer.device_path``, CUDA IPC) when the handle names one and this importer's store can
copy from it, then its shared-memory host KV (``transfer.same_node``); ``host`` only the latter.
Every choice is counted by path, and each step down by its reason: ``off``, ``no_region``,
``other_node``, ``unmapped`` (the shared region could not be mapped: gRPC), ``ipc_unavailable``
(the device region could not be mapped: host memory or gRPC).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from core.kv_handle import KVHandle
from transfer.device_path import DEVICE_PATH, DevicePeers, DeviceSource, DeviceStream
from transfer.same_node import (
    GRPC_PATH,
    SAME_NODE_PATH,
    Locations,
    SameNodeStream,
    SharedRegion,
    SharedRegions,
    local_node_id,
)
from transfer.transfer_metrics import TransferMetrics

logger = logging.getLogger(__name__)

PullSource = SharedRegion | DeviceSource
"""Where a same-node pull reads its blocks (None: the wire)."""


def source_stream(
    locations: Iterable[Locations], source: PullSource, cancel: Callable[[], None]
) -> SameNodeStream | DeviceStream:
    """The stream of a same-node pull from ``source`` over the exporter's ``locations``."""
    if isinstance(source, DeviceSource):
        return DeviceStream(locations, cancel)
    return SameNodeStream(locations, source, cancel)


class PathChooser:
    """One importer's choice of path per pull, with the mappings it keeps."""

    def __init__(self, mode: str, store: object, metrics: TransferMetrics) -> None:
        """``mode``: ``transfer.same_node`` (``auto``, ``host`` or ``off``); ``store``: where
        pulls land (it may copy from a peer's device KV: ``transfer.device_path.DeviceKV``)."""
        self.mode = mode
        self._regions = SharedRegions()
        self._peers = DevicePeers(store)
        self._metrics = metrics

    def choose(self, handle: KVHandle) -> PullSource | None:
        """The same-node source of a pull of ``handle``, else None (gRPC); counted."""
        reasons: list[str] = []
        source = self._source(handle, reasons)
        path = (
            GRPC_PATH
            if source is None
            else DEVICE_PATH
            if isinstance(source, DeviceSource)
            else SAME_NODE_PATH
        )
        self._metrics.pull_path(path, reasons)
        return source

    def _source(self, handle: KVHandle, reasons: list[str]) -> PullSource | None:
        if self.mode == "off":
            reasons.append("off")
            return None
        device = handle.device_region if self.mode == "auto" else ""
        if not handle.shared_region and not device:
            reasons.append("no_region")
            return None
        if handle.node_id != local_node_id():
            reasons.append("other_node")
            return None
        if device:
            peer = self._peers.get(device)
            if peer is not None:
                return DeviceSource(device, peer)
            reasons.append("ipc_unavailable")
        if not handle.shared_region:
            return None
        try:
            return self._regions.get(handle.shared_region, handle.block_bytes)
        except (OSError, ValueError) as e:
            logger.info(
                "shared KV region %s not mapped (%s): pulling over gRPC", handle.shared_region, e
            )
            reasons.append("unmapped")
            return None
