"""KV between processes on one node without the host: CUDA IPC of a worker's device KV tensor.

A prefill worker shares its whole device KV tensor once (:func:`share_kv`): the driver's IPC
handle of the allocation holding it, written as a short JSON string (:class:`IpcRegion`) that
travels on every :class:`~core.kv_handle.KVHandle` as ``device_region``. A decode worker on the
same node maps that allocation into its own CUDA context (:func:`open_peer_kv`) and copies the
blocks it pulls straight from the prefill's KV into its own (:class:`PeerKV`): on one GPU a
device-to-device copy, on two GPUs of a node a peer copy where the driver allows it. No byte
crosses the host, a socket or a checksum: the gRPC stream beside it carries the block ids, the
lease and the layout check, and tells the importer when the blocks are computed.

The handle and mapping come from PyTorch's own CUDA IPC (``UntypedStorage._share_cuda_`` and
``_new_shared_cuda``, what ``torch.multiprocessing`` uses for CUDA tensors), never pickled: the
fields are written as hex and integers. NOTE: the exporter's KV tensor lives as long as its
process, so the reference counting PyTorch attaches to a shared allocation never frees it early;
a mapping outlives nothing it points into as long as pulls stop when their exporter's stream
does (the lease and the stream guard that, as on the other paths).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

logger = logging.getLogger(__name__)

_VERSION = 1


@dataclass(frozen=True)
class IpcRegion:
    """What a peer needs to map a worker's KV tensor: PyTorch's IPC tuple plus the shape."""

    gpu_uuid: str
    """The exporter's GPU (a peer on another GPU copies peer to peer)."""
    handle: str
    """The allocation's ``cudaIpcMemHandle_t``, hex."""
    storage_bytes: int
    storage_offset_bytes: int
    """Where the tensor's storage starts inside the allocation."""
    tensor_offset_bytes: int
    """Where the tensor starts inside its storage."""
    ref_counter: str
    """PyTorch's shared reference counter (file name, hex) and the slot in it."""
    ref_counter_offset: int
    event: str
    """An IPC event handle (hex; empty: none) marking the work queued when shared."""
    event_sync_required: bool
    num_blocks: int
    block_bytes: int
    version: int = _VERSION

    def encode(self) -> str:
        """The region as one JSON string (what ``KVHandle.device_region`` carries)."""
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> IpcRegion:
        """Parse :meth:`encode`'s output; ``ValueError`` for anything else."""
        try:
            fields = json.loads(text)
            region = cls(**fields)
        except (TypeError, ValueError) as e:
            raise ValueError(f"not a CUDA IPC KV region: {text[:80]!r} ({e})") from e
        if region.version != _VERSION:
            raise ValueError(f"CUDA IPC KV region version {region.version}, not {_VERSION}")
        return region


def gpu_uuid(device: torch.device) -> str:
    """The GPU's UUID, as the driver reports it."""
    return str(torch.cuda.get_device_properties(device).uuid)


def share_kv(kv_bytes: torch.Tensor) -> str | None:
    """The IPC region of ``kv_bytes`` (``[num_blocks, block_bytes]`` uint8 on a GPU), or None
    when the allocation cannot be shared (not CUDA, or an allocator without IPC support, such as
    expandable segments): peers then take the host path."""
    if kv_bytes.device.type != "cuda":
        return None
    try:
        (
            _device,
            handle,
            storage_bytes,
            storage_offset_bytes,
            ref_counter,
            ref_counter_offset,
            event,
            event_sync_required,
        ) = kv_bytes.untyped_storage()._share_cuda_()
    except RuntimeError as e:
        logger.warning("KV not shareable over CUDA IPC (same-node pulls use host memory): %s", e)
        return None
    num_blocks, block_bytes = kv_bytes.shape
    return IpcRegion(
        gpu_uuid=gpu_uuid(kv_bytes.device),
        handle=bytes(handle).hex(),
        storage_bytes=int(storage_bytes),
        storage_offset_bytes=int(storage_offset_bytes),
        tensor_offset_bytes=int(kv_bytes.storage_offset()),
        ref_counter=bytes(ref_counter).hex(),
        ref_counter_offset=int(ref_counter_offset),
        event=bytes(event or b"").hex(),
        event_sync_required=bool(event_sync_required),
        num_blocks=int(num_blocks),
        block_bytes=int(block_bytes),
    ).encode()


class PeerKV:
    """Another process's KV tensor mapped into this one; copies its blocks into ``dst``."""

    def __init__(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """``src``, ``dst``: ``[num_blocks, block_bytes]`` uint8 views on this process's device
        (``src`` the mapping, ``dst`` this worker's KV)."""
        self.src = src
        self.dst = dst
        self.device = dst.device
        self._stream = torch.cuda.Stream(self.device)

    def copy_blocks(self, src_block_ids: Sequence[int], dst_block_ids: Sequence[int]) -> None:
        """Start copying blocks ``src_block_ids`` of the peer into ``dst_block_ids`` here, on a
        side stream; :meth:`fence` waits for every copy started so far."""
        with torch.cuda.stream(self._stream):
            src = torch.tensor(list(src_block_ids), dtype=torch.long, device=self.device)
            dst = torch.tensor(list(dst_block_ids), dtype=torch.long, device=self.device)
            # NOTE: the copy waits for the compute queued so far (the ids above did not): a
            # destination block may have been freed by a request whose last step still reads it.
            self._stream.wait_stream(torch.cuda.default_stream(self.device))
            self.dst.index_copy_(0, dst, self.src.index_select(0, src))  # [n, block_bytes]

    def fence(self) -> None:
        """Block until every copy started so far has finished."""
        self._stream.synchronize()


def open_peer_kv(region_text: str, dst_bytes: torch.Tensor) -> PeerKV:
    """Map the KV region a peer shared into this process, for copies into ``dst_bytes`` (this
    worker's ``[num_blocks, block_bytes]`` KV). Raises ``ValueError`` for a region of another
    block size or a bad descriptor, ``RuntimeError`` when the driver refuses the mapping (the
    exporter is gone, no peer access between the GPUs, or the same process)."""
    region = IpcRegion.decode(region_text)
    if dst_bytes.device.type != "cuda":
        raise ValueError("CUDA IPC needs a CUDA KV on the importing side")
    if region.block_bytes != dst_bytes.shape[1]:
        raise ValueError(f"peer KV blocks of {region.block_bytes} bytes, ours {dst_bytes.shape[1]}")
    device = dst_bytes.device
    with torch.cuda.device(device):
        storage = torch.UntypedStorage._new_shared_cuda(
            device.index,
            bytes.fromhex(region.handle),
            region.storage_bytes,
            region.storage_offset_bytes,
            bytes.fromhex(region.ref_counter),
            region.ref_counter_offset,
            bytes.fromhex(region.event),
            region.event_sync_required,
        )
    src = torch.empty(0, dtype=torch.uint8, device=device)
    shape = (region.num_blocks, region.block_bytes)
    src.set_(storage, region.tensor_offset_bytes, shape, (region.block_bytes, 1))
    logger.info(
        "mapped a peer's KV over CUDA IPC: %d blocks of %d bytes on GPU %s (ours %s)",
        region.num_blocks,
        region.block_bytes,
        region.gpu_uuid,
        gpu_uuid(device),
    )
    return PeerKV(src, dst_bytes)
