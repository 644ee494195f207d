"""From engine KV events to the index's compact ops, and the media as bits of the index's masks.

An engine's :class:`~core.kv_events.KVEventBatch` carries token ids the index never needs;
:func:`compact_events` keeps each event's kind, hashes and **medium** (``device``, ``host`` or
``disk``) as an :class:`~core.kv_index_messages.IndexOp`. With a ``stride`` above 1
(``routing.kv_index_stride``) it keeps only the **sampled** hashes (:func:`is_sampled`: divisible
by the stride), so a replica publishes one block in ``stride`` on average; ``index`` says how a
lookup reads them. The ops travel in ``core.kv_index_messages``' typed messages.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from core.hashing import BlockHash
from core.kv_events import MEDIA, AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from core.kv_index_messages import IndexOp, OpKind

OP_STORED: Final = "stored"
OP_REMOVED: Final = "removed"
OP_CLEARED: Final = "cleared"
MEDIUM_BITS: Mapping[str, int] = {medium: 1 << i for i, medium in enumerate(MEDIA)}
"""Medium -> its bit in a replica's per-hash media mask."""
DEVICE_BIT = MEDIUM_BITS["device"]
HOST_BIT = MEDIUM_BITS["host"]
LOWER_BITS = MEDIUM_BITS["host"] | MEDIUM_BITS["disk"]


TierSnapshot = Mapping[str, Sequence[BlockHash]]
"""A replica's lower tiers at a resync: ``{"host": [...], "disk": [...]}``."""


def is_sampled(block_hash: BlockHash, stride: int) -> bool:
    """True when the index keeps ``block_hash`` at this stride (every hash at stride 1)."""
    return block_hash % stride == 0


def compact_events(events: Iterable[KVEvent], stride: int = 1) -> list[IndexOp]:
    """The index's view of engine events: kinds, sampled hashes and media (token ids dropped;
    an event left without hashes is dropped)."""
    ops: list[IndexOp] = []
    for event in events:
        if isinstance(event, BlockStored | BlockRemoved):
            kind: OpKind = OP_STORED if isinstance(event, BlockStored) else OP_REMOVED
            hashes = list(event.block_hashes)
            if stride > 1:
                hashes = [h for h in hashes if h % stride == 0]
            if hashes:
                ops.append(IndexOp(kind, hashes, event.medium))
        elif isinstance(event, AllBlocksCleared):
            ops.append(IndexOp(OP_CLEARED, []))
    return ops
