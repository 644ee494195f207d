"""Pulls between tensor-parallel gangs: a stream of some KV heads of one rank's blocks.

A gang of ``N`` ranks splits every block's KV heads over its ranks (``core.kv_layout``: each rank
stores ``kv[num_blocks, L, 2, block_size, heads_of_rank, D]`` under the same block ids). Between
a prefill gang and a decode gang of different sizes a pull is cut into pieces
(:func:`core.tensor_parallel.plan_kv_pieces`): each piece a run of heads that one exporter rank
holds and one importer rank stores. A :class:`KVShard` names the exporter's side of a piece;
the stream then carries, per block, only those heads, packed as a block of a layout with that
many heads (:meth:`KVLayout.with_heads`), so every chunk is checksummed and verified as any
other and the bytes moved are exactly the importer's share.

The exporter reads a shard through :class:`HeadSliceReader` (each run of blocks gathered into
one packed buffer); the importer verifies chunks into a packed scratch store and
:class:`ShardWriter` scatters them into the destination rank's heads once the stream completed,
so a destination block never holds unverified bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from core.errors import TransferError
from core.kv_handle import TransferFailure
from core.kv_layout import KVLayout
from transfer.block_store import BlockStore, NumpyBlockStore
from transfer.chunks import ChunkWriter, runs


@dataclass(frozen=True)
class KVShard:
    """KV heads ``[head_start, head_start + head_count)`` of rank ``rank``'s blocks."""

    rank: int
    head_start: int
    head_count: int

    def key(self, index: int) -> tuple[int, int, int]:
        """How a lease tells this shard's stream of export block ``index`` from another's."""
        return (self.rank, self.head_start, index)


def head_slices(view: memoryview, layout: KVLayout, num_blocks: int) -> np.ndarray:
    """``num_blocks`` blocks of ``layout`` as ``uint8[n, L, 2, block_size, heads, row_bytes]``
    (aliasing ``view``), so heads slice on axis 4."""
    row_bytes = layout.row_elements * layout.dtype_bytes
    shape = (num_blocks, layout.num_layers, 2, layout.block_size, layout.num_kv_heads, row_bytes)
    return np.frombuffer(view, dtype=np.uint8).reshape(shape)


def check_shard(layout: KVLayout, num_ranks: int, shard: KVShard) -> None:
    """``TransferError(invalid_request)`` unless ``shard`` lies within the gang's heads."""
    first, count = shard.head_start, shard.head_count
    if not 0 <= shard.rank < num_ranks or count < 1 or first + count > layout.num_kv_heads:
        raise TransferError(
            f"shard of rank {shard.rank}, heads [{first}, {first + count}) is outside this "
            f"exporter's {num_ranks} rank(s) of {layout.num_kv_heads} KV heads each",
            reason=TransferFailure.INVALID_REQUEST,
        )


class HeadSliceReader:
    """A read-only :class:`BlockStore` of some heads of another store's blocks: a view is a
    packed copy (the exporter only reads it)."""

    def __init__(self, store: BlockStore, head_start: int, head_count: int) -> None:
        self._store = store
        self._source = store.layout
        self._start, self._count = head_start, head_count
        self._layout = store.layout.with_heads(head_count)

    @property
    def layout(self) -> KVLayout:
        """The packed slice's layout."""
        return self._layout

    @property
    def num_blocks(self) -> int:
        """The underlying store's blocks."""
        return self._store.num_blocks

    def blocks_view(self, first_block_id: int, num_blocks: int) -> memoryview:
        """The heads of ``num_blocks`` blocks from ``first_block_id``, packed block by block."""
        whole = head_slices(
            self._store.blocks_view(first_block_id, num_blocks), self._source, num_blocks
        )
        heads = whole[:, :, :, :, self._start : self._start + self._count]
        return np.ascontiguousarray(heads).reshape(-1).data


class ShardWriter(ChunkWriter):
    """A :class:`ChunkWriter` for one piece: verified chunks land in a packed scratch store,
    which :meth:`finish` scatters into each target (a store, and the first of ``head_count``
    heads there) at the destination blocks."""

    def __init__(
        self,
        targets: Sequence[tuple[BlockStore, int]],
        dst_block_ids: Sequence[int],
        head_count: int,
    ) -> None:
        packed = targets[0][0].layout.with_heads(head_count)
        self._scratch = NumpyBlockStore(packed, max(len(dst_block_ids), 1))
        super().__init__(self._scratch, range(len(dst_block_ids)))
        self._targets = tuple(targets)
        self._dst = tuple(dst_block_ids)
        self._count = head_count
        self._placed = False

    def finish(self) -> None:
        """Check every byte arrived, then write the heads into the destination blocks."""
        super().finish()
        packed = self._scratch.layout
        for index, length in runs(self._dst):
            source = head_slices(
                self._scratch.data[index : index + length].reshape(-1).data, packed, length
            )
            for store, start in self._targets:
                view = store.blocks_view(self._dst[index], length)
                target = head_slices(view, store.layout, length)
                target[:, :, :, :, start : start + self._count] = source
        self._placed = True

    def invalid_block_ids(self) -> tuple[int, ...]:
        """Every destination block until the piece was placed whole."""
        return () if self._placed else self._dst
