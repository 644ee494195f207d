"""KV-cache events: what an engine's prefix cache gained or lost, for the cluster-wide KV index.

An engine reports every block stored into its prefix cache (:class:`BlockStored`), every cached
block evicted from it (:class:`BlockRemoved`) and a full reset (:class:`AllBlocksCleared`).
Events travel in :class:`KVEventBatch` es whose ``replica_seq`` grows by exactly one per batch
and per engine, so a consumer that sees a gap knows it missed something and must resync (drop
the replica's entries and wait for the next ``AllBlocksCleared`` or rebuild from scratch).
Events inside a batch are in the order they happened.

Each stored/removed event names the **medium** (tier) it concerns: ``device`` (the engine's KV
pool), ``host`` (host-RAM tier) or ``disk`` (disk tier). A block moving down a tier is a
``BlockStored`` on the lower medium (written while the upper copy may still exist) and, when the
upper copy is evicted, a ``BlockRemoved`` on the upper one; a consumer keeps one entry per
(replica, medium) and treats a replica's best medium as the cheapest one holding the hash.

Everything here is plain ints, strings and lists so batches cross processes as plain data through
``core.codec`` (the event kinds are told apart by their fields) — never pickle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from core.hashing import BlockHash

KVMedium = Literal["device", "host", "disk"]
"""Where a cached block lives on its replica."""

MEDIA: tuple[KVMedium, ...] = ("device", "host", "disk")
"""Every medium, cheapest to use first."""


@dataclass(frozen=True)
class BlockStored:
    """Consecutive full blocks of one sequence became prefix-cache entries.

    ``block_hashes`` are chained (``core.hashing``): each one's parent is the previous one, and
    the first one's parent is ``parent_hash`` (``None`` when the first block starts the
    sequence). ``token_ids`` are the tokens of all those blocks, ``block_size`` per block.
    """

    block_hashes: list[BlockHash]
    parent_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    medium: KVMedium = "device"

    @property
    def num_tokens(self) -> int:
        """Tokens covered by this event (``len(block_hashes) * block_size``)."""
        return len(self.token_ids)


@dataclass(frozen=True)
class BlockRemoved:
    """These hashes left the prefix cache of ``medium`` (evicted for reuse, demoted or expired)."""

    block_hashes: list[BlockHash]
    medium: KVMedium = "device"


@dataclass(frozen=True)
class AllBlocksCleared:
    """The whole prefix cache was dropped; forget every hash of this engine."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class KVEventBatch:
    """Events of one engine, in order; ``replica_seq`` is 0, 1, 2, ... per engine."""

    replica_seq: int
    events: list[KVEvent]
    timestamp_s: float = 0.0
