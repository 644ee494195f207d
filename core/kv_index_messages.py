"""Messages of the KV-index channel: replicas -> their index shard -> the routers.

A replica's pump sends :class:`CompactBatch` es (its engine's KV events as :class:`IndexOp` s,
over the shard's binary stream) and a :class:`ReplicaSnapshot` when it registers or must resync;
the shard answers each publish with a :class:`PublishReply`. The shard records every change in a
log of :data:`LogEntry` s (a :class:`ReplicaBatch`, a :class:`ReplicaSnapshot` or a
:class:`ReplicaRemoved`) and answers a router's poll with an :data:`UpdatesReply`: the log's
tail (:class:`EntriesReply`) or, for a router that is new or fell behind, an
:class:`IndexSnapshot` of the whole index (:class:`SnapshotReply`).

Frozen dataclasses of typed fields, like every message between processes: Ray actor calls carry
them as plain data through ``core.codec`` (a malformed one is refused with a
:class:`~core.errors.MessageError`), and the union members are told apart by their field names.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from core.codec import from_plain
from core.errors import MessageError
from core.hashing import BlockHash
from core.kv_events import MEDIA, KVMedium

OpKind = Literal["stored", "removed", "cleared"]
"""What an op did to the replica's cache: hashes stored or removed, or the device pool reset."""

LOWER_MEDIA: tuple[KVMedium, ...] = MEDIA[1:]
"""The tiers under the device pool, which a snapshot lists apart (``host``, ``disk``)."""


@dataclass(frozen=True)
class IndexOp:
    """One KV event in the index's compact form: its kind, hashes and medium (token ids dropped);
    ``cleared`` carries no hashes and concerns the device pool."""

    kind: OpKind
    hashes: list[BlockHash]
    medium: KVMedium = "device"


@dataclass(frozen=True)
class CompactBatch:
    """Replica -> its shard: one engine event batch's ops; ``replica_seq`` grows by one per batch
    (an empty ``ops`` still counts)."""

    replica_seq: int
    ops: tuple[IndexOp, ...] = ()


@dataclass(frozen=True)
class PublishReply:
    """Shard -> replica, per publish: ``resync`` asks for a snapshot (an unknown replica, a gap,
    or one still degraded)."""

    resync: bool


def _check_lower_tiers(tiers: dict[str, list[BlockHash]]) -> None:
    unknown = sorted(set(tiers) - set(LOWER_MEDIA))
    if unknown:
        raise MessageError(
            f"a lower-tier snapshot names medium {unknown[0]!r}; expected host, disk"
        )


@dataclass(frozen=True)
class ReplicaSnapshot:
    """Replica -> its shard, to register or resync: everything it caches, valid before batch
    ``seq`` (the next one the shard applies). Also the shard's log entry for it."""

    replica_id: str
    pool: str
    hashes: list[BlockHash]
    """On the device."""
    seq: int
    tiers: dict[str, list[BlockHash]] = field(default_factory=dict)
    """The lower tiers' hashes by medium (``host``, ``disk``; no other key is accepted)."""

    def __post_init__(self) -> None:
        _check_lower_tiers(self.tiers)


@dataclass(frozen=True)
class ReplicaBatch:
    """Log entry: a batch the shard applied (or that degraded its replica), with whose it was."""

    replica_id: str
    seq: int
    ops: tuple[IndexOp, ...]


@dataclass(frozen=True)
class ReplicaRemoved:
    """Log entry: the replica drained, died or fell silent, and left the index."""

    replica_id: str


LogEntry = ReplicaBatch | ReplicaSnapshot | ReplicaRemoved
"""One change in a shard's log; a follower replaying the log holds the same index."""


@dataclass(frozen=True)
class ExportedReplica:
    """One replica in an :class:`IndexSnapshot`: its pool, seq, health and cached hashes."""

    replica_id: str
    pool: str
    last_seq: int
    """The last applied ``replica_seq`` (-1 before any)."""
    degraded: bool
    hashes: list[BlockHash]
    """On the device."""
    tiers: dict[str, list[BlockHash]] = field(default_factory=dict)
    """The lower tiers' hashes by medium (``host``, ``disk``)."""

    def __post_init__(self) -> None:
        _check_lower_tiers(self.tiers)


@dataclass(frozen=True)
class IndexSnapshot:
    """A whole index, replica by replica (for a follower that is new or fell behind)."""

    replicas: tuple[ExportedReplica, ...] = ()


@dataclass(frozen=True)
class EntriesReply:
    """Shard -> router: the log entries after the router's cursor, up to ``cursor``."""

    epoch: str
    """The shard's incarnation (a restarted shard has a new one)."""
    cursor: int
    entries: tuple[LogEntry, ...] = ()


@dataclass(frozen=True)
class SnapshotReply:
    """Shard -> router: the whole index at ``cursor``, when the log cannot bring it up to date."""

    epoch: str
    cursor: int
    snapshot: IndexSnapshot


UpdatesReply = EntriesReply | SnapshotReply
"""What a router's poll of a shard answers."""


@dataclass(frozen=True)
class ShardStats:
    """A shard's index size and degraded replicas, plus its log's length."""

    num_replicas: int
    num_degraded_replicas: int
    num_entries: int
    num_hashes: int
    num_log_entries: int


def decode_updates_reply(data: Any) -> UpdatesReply:
    """An :data:`UpdatesReply` from its plain form (``core.codec.from_plain`` of the union)."""
    kind: Any = UpdatesReply
    return typing.cast(UpdatesReply, from_plain(kind, data))
