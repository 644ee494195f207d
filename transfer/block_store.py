"""The block-store contract the transfer layer reads from and writes into.

The engine's KV storage (``kv[num_blocks, L, 2, block_size, H, D]``, block-major and contiguous)
satisfies :class:`BlockStore` structurally: every block is one contiguous byte span of
``layout.block_bytes``. :class:`NumpyBlockStore` is a plain-memory store for tests, benchmarks
and the in-process transport.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from core.errors import TransferError
from core.kv_handle import TransferFailure
from core.kv_layout import KVLayout
from core.shared_memory import SharedSegment


@runtime_checkable
class BlockStore(Protocol):
    """Paged KV storage addressed by block id."""

    @property
    def layout(self) -> KVLayout:
        """The layout of every block in this store."""
        ...

    @property
    def num_blocks(self) -> int:
        """Number of blocks; valid ids are ``range(num_blocks)``."""
        ...

    def blocks_view(self, first_block_id: int, num_blocks: int) -> memoryview:
        """A writable, C-contiguous, 1-D unsigned-byte view of ``num_blocks`` consecutive blocks
        from ``first_block_id`` (a run of ids moves as one piece).

        The view is ``num_blocks * layout.block_bytes`` long and aliases the storage: writing
        into it writes the blocks.
        """
        ...


def check_block_ids(store: BlockStore, block_ids: Sequence[int], what: str) -> None:
    """Raise ``TransferError(invalid_request)`` unless every id is in range and unique."""
    num_blocks = store.num_blocks
    bad = [b for b in block_ids if not 0 <= b < num_blocks]
    if bad:
        raise TransferError(
            f"{what} block ids out of range [0, {num_blocks}): {bad[:8]}",
            reason=TransferFailure.INVALID_REQUEST,
        )
    if len(set(block_ids)) != len(block_ids):
        raise TransferError(
            f"{what} block ids repeat: {list(block_ids)[:16]}",
            reason=TransferFailure.INVALID_REQUEST,
        )


class NumpyBlockStore:
    """A :class:`BlockStore` over one ``uint8[num_blocks, block_bytes]`` numpy array (in named
    shared memory with ``shared=True``, for same-node pulls: :attr:`shared_region`)."""

    def __init__(self, layout: KVLayout, num_blocks: int, *, shared: bool = False) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self._layout = layout
        self._num_blocks = num_blocks
        shape = (num_blocks, layout.block_bytes)  # [N, block_bytes]
        self._segment = SharedSegment(num_blocks * layout.block_bytes) if shared else None
        if self._segment is None:
            self.data = np.zeros(shape, dtype=np.uint8)
        else:
            self.data = np.frombuffer(self._segment.buf, dtype=np.uint8).reshape(shape)

    @property
    def shared_region(self) -> str | None:
        """The shared-memory segment holding the blocks (None: private memory)."""
        return None if self._segment is None else self._segment.name

    def close(self) -> None:
        """Remove the shared segment's name, if any."""
        if self._segment is not None:
            self._segment.unlink()

    @property
    def layout(self) -> KVLayout:
        """The layout of every block in this store."""
        return self._layout

    @property
    def num_blocks(self) -> int:
        """Number of blocks."""
        return self._num_blocks

    def blocks_view(self, first_block_id: int, num_blocks: int) -> memoryview:
        """A writable byte view of ``num_blocks`` blocks from ``first_block_id``."""
        end = first_block_id + num_blocks
        if num_blocks < 1 or not 0 <= first_block_id < end <= self._num_blocks:
            raise IndexError(
                f"blocks [{first_block_id}, {end}) out of range [0, {self._num_blocks})"
            )
        return self.data[first_block_id:end].reshape(-1).data

    def block_view(self, block_id: int) -> memoryview:
        """A writable byte view of block ``block_id``."""
        return self.blocks_view(block_id, 1)

    def fill_random(self, seed: int) -> None:
        """Fill every block with reproducible random bytes (test and benchmark data)."""
        rng = np.random.default_rng(seed)
        self.data[:] = rng.integers(0, 256, size=self.data.shape, dtype=np.uint8)
