"""The KV index's compact event form: what crosses from a replica to the index actor.

An engine's :class:`~core.kv_events.KVEventBatch` carries token ids the index never needs;
:func:`compact_events` keeps each event's kind, hashes and **medium** (``device``, ``host`` or
``disk``) as an :class:`IndexOp`. Ops travel as JSON-shaped lists ``[kind, hashes, medium]``;
:func:`parse_op` reads them back (a two-element op from an older publisher means ``device``).
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
LOWER_BITS = MEDIUM_BITS["host"] | MEDIUM_BITS["disk"]
_LOWER_MEDIA = frozenset(MEDIA[1:])


class IndexOp(NamedTuple):
    """One compact event; ``cleared`` carries no hashes and concerns the device pool."""

    kind: str
    hashes: list[BlockHash]
    medium: str = "device"


TierSnapshot = Mapping[str, Sequence[BlockHash]]
"""A replica's lower tiers at a resync: ``{"host": [...], "disk": [...]}``."""


def compact_events(events: Iterable[KVEvent]) -> list[IndexOp]:
    """The index's view of engine events: kinds, hashes and media (token ids dropped)."""
    ops: list[IndexOp] = []
    for event in events:
        if isinstance(event, BlockStored):
            ops.append(IndexOp(OP_STORED, list(event.block_hashes), event.medium))
        elif isinstance(event, BlockRemoved):
            ops.append(IndexOp(OP_REMOVED, list(event.block_hashes), event.medium))
        elif isinstance(event, AllBlocksCleared):
            ops.append(IndexOp(OP_CLEARED, []))
    return ops


def parse_op(raw: Sequence[Any]) -> IndexOp:
    """An op from its JSON shape; unknown kinds and media are refused with a ValueError."""
    kind, hashes = str(raw[0]), [int(h) for h in raw[1]]
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
