"""The KV index's compact event form: what crosses from a replica to the index actor.

An engine's :class:`~core.kv_events.KVEventBatch` carries token ids the index never needs;
:func:`compact_events` keeps each event's kind, hashes and **medium** (``device``, ``host`` or
``disk``) as an :class:`IndexOp`. With a ``stride`` above 1 (``routing.kv_index_stride``) it
keeps only the **sampled** hashes (:func:`is_sampled`: divisible by the stride), so a replica
publishes one block in ``stride`` on average; ``index`` says how a lookup reads them. Ops
travel as JSON-shaped lists ``[kind, hashes, medium]``; :func:`parse_op` reads them back (a
two-element op from an older publisher means ``device``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from core.hashing import BlockHash
from core.kv_events import MEDIA, AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

OP_STORED, OP_REMOVED, OP_CLEARED = "stored", "removed", "cleared"
MEDIUM_BITS: Mapping[str, int] = {medium: 1 << i for i, medium in enumerate(MEDIA)}
"""Medium -> its bit in a replica's per-hash media mask."""
DEVICE_BIT = MEDIUM_BITS["device"]
HOST_BIT = MEDIUM_BITS["host"]
LOWER_BITS = MEDIUM_BITS["host"] | MEDIUM_BITS["disk"]
_LOWER_MEDIA = frozenset(MEDIA[1:])


class IndexOp(NamedTuple):
    """One compact event; ``cleared`` carries no hashes and concerns the device pool."""

    kind: str
    hashes: list[BlockHash]
    medium: str = "device"


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
            kind = OP_STORED if isinstance(event, BlockStored) else OP_REMOVED
            hashes = list(event.block_hashes)
            if stride > 1:
                hashes = [h for h in hashes if h % stride == 0]
            if hashes:
                ops.append(IndexOp(kind, hashes, event.medium))
        elif isinstance(event, AllBlocksCleared):
            ops.append(IndexOp(OP_CLEARED, []))
    return ops


def parse_op(raw: Sequence[Any]) -> IndexOp:
    """An op from its JSON shape; unknown kinds and media are refused with a ValueError."""
    kind, hashes = str(raw[0]), list(map(int, raw[1]))
    medium = str(raw[2]) if len(raw) > 2 else "device"
    if kind not in (OP_STORED, OP_REMOVED, OP_CLEARED):
        raise ValueError(f"unknown KV index op kind {kind!r}")
    if medium not in MEDIUM_BITS:
        raise ValueError(f"unknown KV medium {medium!r}; expected one of {list(MEDIUM_BITS)}")
    return IndexOp(kind, hashes, medium)


def parse_tiers(raw: Mapping[str, Sequence[Any]] | None) -> dict[str, list[BlockHash]]:
    """A lower-tier snapshot from its JSON shape (only ``host`` and ``disk`` are accepted)."""
    tiers: dict[str, list[BlockHash]] = {}
    for medium, hashes in (raw or {}).items():
        if medium not in _LOWER_MEDIA:
            raise ValueError(f"a lower-tier snapshot names medium {medium!r}; expected host, disk")
        tiers[medium] = [int(h) for h in hashes]
    return tiers
