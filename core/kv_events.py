"""KV-cache events: what an engine's prefix cache gained or lost, for the cluster-wide KV index.

An engine reports every block stored into its prefix cache (:class:`BlockStored`), every cached
block evicted from it (:class:`BlockRemoved`) and a full reset (:class:`AllBlocksCleared`).
Events travel in :class:`KVEventBatch` es whose ``replica_seq`` grows by exactly one per batch
and per engine, so a consumer that sees a gap knows it missed something and must resync (drop
the replica's entries and wait for the next ``AllBlocksCleared`` or rebuild from scratch).
Events inside a batch are in the order they happened.

Everything here is plain ints, strings and lists so batches cross processes as JSON or msgpack
via :meth:`KVEventBatch.to_dict` / :meth:`KVEventBatch.from_dict` — never pickle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.hashing import BlockHash


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

    @property
    def num_tokens(self) -> int:
        """Tokens covered by this event (``len(block_hashes) * block_size``)."""
        return len(self.token_ids)


@dataclass(frozen=True)
class BlockRemoved:
    """These hashes left the prefix cache (their blocks were evicted for reuse)."""

    block_hashes: list[BlockHash]


@dataclass(frozen=True)
class AllBlocksCleared:
    """The whole prefix cache was dropped; forget every hash of this engine."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared

_KIND_OF: dict[type, str] = {
    BlockStored: "stored",
    BlockRemoved: "removed",
    AllBlocksCleared: "cleared",
}


@dataclass(frozen=True)
class KVEventBatch:
    """Events of one engine, in order; ``replica_seq`` is 0, 1, 2, ... per engine."""

    replica_seq: int
    events: list[KVEvent]
    timestamp_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (only ints, floats, strings, lists and ``None``)."""
        return {
            "replica_seq": self.replica_seq,
            "timestamp_s": self.timestamp_s,
            "events": [_event_to_dict(event) for event in self.events],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KVEventBatch:
        """Inverse of :meth:`to_dict`; raises ``ValueError`` on an unknown event kind."""
        return cls(
            replica_seq=int(data["replica_seq"]),
            timestamp_s=float(data.get("timestamp_s", 0.0)),
            events=[_event_from_dict(item) for item in data["events"]],
        )


def _event_to_dict(event: KVEvent) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": _KIND_OF[type(event)]}
    if isinstance(event, BlockStored):
        body.update(
            block_hashes=list(event.block_hashes),
            parent_hash=event.parent_hash,
            token_ids=list(event.token_ids),
            block_size=event.block_size,
        )
    elif isinstance(event, BlockRemoved):
        body["block_hashes"] = list(event.block_hashes)
    return body


def _event_from_dict(data: dict[str, Any]) -> KVEvent:
    kind = data.get("kind")
    if kind == "stored":
        parent = data["parent_hash"]
        return BlockStored(
            block_hashes=[int(h) for h in data["block_hashes"]],
            parent_hash=None if parent is None else int(parent),
            token_ids=[int(t) for t in data["token_ids"]],
            block_size=int(data["block_size"]),
        )
    if kind == "removed":
        return BlockRemoved(block_hashes=[int(h) for h in data["block_hashes"]])
    if kind == "cleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown KV event kind {kind!r}")
