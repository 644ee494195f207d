"""KV storage: the block-major tensor one worker's attention layers read and write.

``kv[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]`` (see ``core.kv_layout``).
Bookkeeping (which block belongs to whom) lives in the block pool; this module only owns memory.
Every block is one contiguous byte span, so :meth:`KVStorage.block_view` hands the transfer layer
a writable ``memoryview`` of it — the storage satisfies the transfer layer's block-store protocol
structurally, without the engine importing ``transfer``.

KV on a GPU is staged through a host mirror of the same shape (pinned memory): the prefill role
calls :meth:`KVStorage.stage_to_host` on the blocks it exports, the decode role
:meth:`KVStorage.stage_to_device` on the blocks it pulled, and byte views always point at host
memory. Both calls only *start* their copies, on a side stream (see :mod:`engine.kv.staging`):
:meth:`KVStorage.block_view` waits for a block's copy to the host on the reader's thread, and
the model runner calls :meth:`KVStorage.fence_uploads` before each step so the compute stream
(not the host) waits for imports still in flight. On CPU the mirror is the KV tensor itself and
both calls do nothing; a forced mirror on CPU (tests) copies at once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import torch

from core.errors import ConfigError, KVCacheError
from core.kv_layout import KVLayout
from core.shared_memory import SharedSegment, open_segment_writable
from engine.kv.cuda_ipc import PeerKV, open_peer_kv, share_kv
from engine.kv.staging import BlockCopier, StagingTracker

logger = logging.getLogger(__name__)

#: KV budget on CPU when neither ``kv_cache_memory_bytes`` is set nor a device reports memory.
DEFAULT_CPU_KV_BYTES = 512 * 1024 * 1024

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int8": torch.int8,
    "float8_e4m3fn": torch.float8_e4m3fn,
}


def num_blocks_for_budget(layout: KVLayout, memory_bytes: int) -> int:
    """How many whole blocks fit in ``memory_bytes``; at least two or a clear error."""
    num_blocks = memory_bytes // layout.block_bytes
    if num_blocks < 2:
        raise KVCacheError(
            f"KV budget of {memory_bytes} bytes holds {num_blocks} blocks of "
            f"{layout.block_bytes} bytes (block_size={layout.block_size}); need at least 2",
            param="kv_cache_memory_bytes",
        )
    return int(num_blocks)


def kv_budget_bytes(
    device: torch.device, memory_bytes: int | None, memory_fraction: float, weights_bytes: int
) -> int:
    """The KV budget: explicit bytes, else a fraction of free CUDA memory, else the CPU default."""
    if memory_bytes is not None:
        return memory_bytes
    if device.type == "cuda":
        free_bytes, total_bytes = torch.cuda.mem_get_info(device)
        budget = int(total_bytes * memory_fraction) - (total_bytes - free_bytes)
        if budget <= 0:
            raise KVCacheError(
                f"no GPU memory left for KV: {free_bytes} free of {total_bytes} bytes after "
                f"{weights_bytes} bytes of weights at kv_cache_memory_fraction={memory_fraction}",
                param="kv_cache_memory_fraction",
            )
        return budget
    return DEFAULT_CPU_KV_BYTES


class KVStorage:
    """The KV tensor of one worker plus typed accessors; owns no bookkeeping."""

    def __init__(
        self,
        layout: KVLayout,
        num_blocks: int,
        device: torch.device,
        *,
        host_staging: bool | None = None,
        shared: bool = False,
        attach: str | None = None,
    ) -> None:
        """``host_staging`` (default: when ``device`` is not the CPU) keeps a host mirror for the
        transfer layer's byte views. ``shared`` keeps those host bytes in named shared memory
        (:attr:`shared_region`) that same-node peers map; without room for it in ``/dev/shm``
        the storage stays private (logged). ``attach``: instead, map the shared host bytes of
        another process's storage of this layout (a tensor-parallel follower's, on a CPU
        ``device``): byte views for the transfer layer, nothing to compute with."""
        self.layout = layout
        self.num_blocks = num_blocks
        self.device = device
        shape = (  # [N, L, 2, bs, Hkv, D]
            num_blocks,
            layout.num_layers,
            2,
            layout.block_size,
            layout.num_kv_heads,
            layout.row_elements,  # head_dim, plus the scale's bytes when 8-bit
        )
        dtype = TORCH_DTYPES[layout.dtype]
        staged = device.type != "cpu" if host_staging is None else host_staging
        nbytes = num_blocks * layout.block_bytes
        self._shared = _shared_buffer(nbytes) if shared and attach is None else None
        self._pinned = False  # a shared host mirror registered with CUDA (unregistered at close)
        self._attached = None if attach is None else open_segment_writable(attach)
        if self._attached is not None:
            if staged or len(self._attached) != nbytes:
                raise KVCacheError(
                    f"KV segment {attach} holds {len(self._attached)} bytes, the layout "
                    f"{nbytes} (or a staged storage was asked to attach)"
                )
            self.kv = _as_tensor(memoryview(self._attached), dtype, shape)
        elif self._shared is not None and not staged:
            self.kv = _as_tensor(self._shared.buf, dtype, shape)
        else:
            self.kv = torch.zeros(shape, dtype=dtype, device=device)
        self.host = self.kv
        if staged and self._shared is not None:
            self.host = _as_tensor(self._shared.buf, dtype, shape)
            self._pinned = _pin(self.host)
        elif staged:
            pin = torch.cuda.is_available()
            self.host = torch.zeros(self.kv.shape, dtype=self.kv.dtype, pin_memory=pin)
        self._bytes = self.host.view(torch.uint8).view(num_blocks, layout.block_bytes)
        self._copier = BlockCopier(self.kv, self.host) if staged else None
        self.staging = StagingTracker()
        self._device_region: str | None = None  # shared on first use (CUDA only)
        self.peers: PeerStaging | None = None
        """On rank 0 of a tensor-parallel gang: stages the other ranks' blocks as this storage
        stages its own (their host mirrors are what the transfer layer reads and writes)."""
        logger.info(
            "KV storage: %d blocks x %d tokens, %.1f MiB on %s",
            num_blocks,
            layout.block_size,
            self.kv.numel() * self.kv.element_size() / 2**20,
            device,
        )

    @property
    def shared_region(self) -> str | None:
        """The name of the shared-memory segment holding the host bytes (None: private)."""
        return None if self._shared is None else self._shared.name

    @property
    def device_region(self) -> str | None:
        """The CUDA IPC region of the device KV (:mod:`engine.kv.cuda_ipc`), which same-node
        peers copy blocks out of; None on a CPU or when the allocation cannot be shared."""
        if self._device_region is None and self.device.type == "cuda":
            self._device_region = share_kv(self.block_bytes_view()) or ""
        return self._device_region or None

    def wait_computed(self, block_ids: Sequence[int]) -> None:
        """Block until the device bytes of exported blocks are final (the compute that wrote
        them has finished); what a same-node peer waits for before copying them."""
        for block_id in block_ids:
            self.staging.wait_source(block_id)

    def open_device_peer(self, region: str) -> PeerKV:
        """Map a same-node peer's KV (its :attr:`device_region`) for copies into this one;
        raises ``ValueError`` / ``RuntimeError`` as :func:`engine.kv.cuda_ipc.open_peer_kv`."""
        return open_peer_kv(region, self.block_bytes_view())

    def close(self) -> None:
        """Remove the shared segment's name (mappings, ours and peers', stay valid)."""
        if self._pinned:
            torch.cuda.cudart().cudaHostUnregister(self.host.data_ptr())
            self._pinned = False
        if self._shared is not None:
            self._shared.unlink()

    def layer(self, layer_idx: int) -> torch.Tensor:
        """Layer ``layer_idx``'s strided view ``[N, 2, bs, Hkv, D]``."""
        return self.kv[:, layer_idx]

    @property
    def staged(self) -> bool:
        """True when byte views point at a host mirror rather than the KV tensor itself."""
        return self.host is not self.kv

    def stage_to_host(self, block_ids: list[int]) -> None:
        """Start copying blocks KV -> host mirror for the transfer layer (no-op on CPU); their
        byte views wait for the copy, so this returns without waiting."""
        if self._copier is not None and block_ids:
            self._check_ids(block_ids)
            self.staging.exported(block_ids, self._copier.to_host(block_ids))
            if self.peers is not None:
                self.peers.stage_to_host(block_ids)

    def stage_to_device(self, block_ids: list[int]) -> None:
        """Start copying blocks host mirror -> KV after the transfer layer wrote them (no-op on
        CPU); the next step's compute waits for the copy on the device."""
        if self._copier is not None and block_ids:
            self._check_ids(block_ids)
            self.staging.imported(self._copier.to_device(block_ids))
            if self.peers is not None:
                self.peers.stage_to_device(block_ids)

    def fence_uploads(self) -> None:
        """Order the compute stream after every :meth:`stage_to_device` copy still in flight;
        call on the engine thread before a step (the runner does)."""
        self.staging.fence_uploads()

    def blocks_view(self, first_block_id: int, num_blocks: int) -> memoryview:
        """A writable byte view of ``num_blocks`` consecutive blocks (all layers, K and V) in
        host memory; waits for copies of them to the host that are still in flight."""
        end = first_block_id + num_blocks
        if num_blocks < 1 or not 0 <= first_block_id < end <= self.num_blocks:
            raise KVCacheError(
                f"blocks [{first_block_id}, {end}) out of range [0, {self.num_blocks})"
            )
        for block_id in range(first_block_id, end):
            self.staging.wait_host(block_id)
        return memoryview(self._bytes[first_block_id:end].reshape(-1).numpy().data)

    def block_view(self, block_id: int) -> memoryview:
        """A writable byte view of one block in host memory (see :meth:`blocks_view`)."""
        return self.blocks_view(block_id, 1)

    def block_bytes_view(self) -> torch.Tensor:
        """``[num_blocks, block_bytes]`` uint8 view of the KV tensor itself (on its device), for
        the KV tiers' copies."""
        return self.kv.view(self.num_blocks, -1).view(torch.uint8)

    def _check_ids(self, block_ids: list[int]) -> None:
        bad = [b for b in block_ids if not 0 <= b < self.num_blocks]
        if bad:
            raise KVCacheError(f"block ids {bad[:8]} out of range [0, {self.num_blocks})")

    def copy_blocks(self, src_block_ids: list[int], dst_block_ids: list[int]) -> None:
        """Copy whole blocks inside this storage (prefix reuse across forks, defragmentation)."""
        src = torch.tensor(src_block_ids, dtype=torch.long, device=self.device)
        dst = torch.tensor(dst_block_ids, dtype=torch.long, device=self.device)
        self.kv.index_copy_(0, dst, self.kv.index_select(0, src))


def _shared_buffer(nbytes: int) -> SharedSegment | None:
    try:
        return SharedSegment(nbytes)
    except ConfigError as e:
        logger.warning("KV stays in private memory (no same-node transfers): %s", e.message)
        return None


def _pin(host: torch.Tensor) -> bool:
    """Page-lock a shared host mirror for fast device copies (as ``pin_memory`` does for a
    private one); False without CUDA or when the driver refuses (then copies are pageable)."""
    if not torch.cuda.is_available():
        return False
    nbytes = host.numel() * host.element_size()
    error = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), nbytes, 0)
    if int(error) != 0:
        logger.warning("shared KV host mirror not page-locked (cudaError %d)", int(error))
        return False
    return True


def _as_tensor(buf: memoryview, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The whole segment ``buf`` as a tensor of ``shape``."""
    flat = torch.frombuffer(buf, dtype=torch.uint8, count=buf.nbytes)
    return flat.view(dtype).view(shape)


class PeerStaging(Protocol):
    """Staging the same blocks in the other ranks of a tensor-parallel gang (rank 0 calls it
    on its engine thread, as it stages its own)."""

    def stage_to_host(self, block_ids: list[int]) -> None:
        """Copy the blocks to every other rank's host mirror; returns once they are there."""
        ...

    def stage_to_device(self, block_ids: list[int]) -> None:
        """Copy the blocks from every other rank's host mirror before its next step."""
        ...
