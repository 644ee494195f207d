"""Replicating the KV index: the authoritative server and the routers' followers.

:class:`KVIndexServer` is the state machine inside the index actor. Workers call
:meth:`~KVIndexServer.publish` with compact event batches, :meth:`~KVIndexServer.resync` with
snapshots and :meth:`~KVIndexServer.remove_replica` when they drain; a replica silent for
``replica_ttl_s`` (crashed without draining) is removed. Every operation that changed the index
is appended to a bounded log; because :class:`~cluster.routing.kv_index.index.KVIndex` is
deterministic, a :class:`KVIndexFollower` replaying the same log holds the same index.

Routers poll :meth:`~KVIndexServer.updates` with ``(epoch, cursor)`` and get the new log
entries, or a full export when they are new, fell behind the trimmed log, or the server
restarted (a new ``epoch``). Every message is a typed one of ``core.kv_index_messages`` (the
actor turns them into plain data through ``core.codec``). The server's methods hold one lock:
inside the actor, replicas' KV event streams publish from a thread of their own beside the
actor's calls.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from cluster.routing.kv_index.compaction import TierSnapshot
from cluster.routing.kv_index.index import ApplyStatus, KVIndex
from cluster.routing.kv_index.shard_assignment import shard_of
from core.codec import to_plain
from core.kv_index_messages import (
    CompactBatch,
    EntriesReply,
    ExportedReplica,
    IndexSnapshot,
    LogEntry,
    PublishReply,
    ReplicaBatch,
    ReplicaRemoved,
    ReplicaSnapshot,
    ShardStats,
    SnapshotReply,
    UpdatesReply,
)

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _locked(
    method: Callable[Concatenate[KVIndexServer, _P], _R],
) -> Callable[Concatenate[KVIndexServer, _P], _R]:
    """Run a :class:`KVIndexServer` method under its lock (re-entrant: methods call each
    other)."""

    @functools.wraps(method)
    def locked(self: KVIndexServer, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


_CHANGED = (ApplyStatus.APPLIED, ApplyStatus.GAP)


class KVIndexServer:
    """The authoritative index plus its change log (see the module docstring)."""

    def __init__(
        self,
        *,
        replica_ttl_s: float = 30.0,
        max_log_entries: int = 4096,
        max_log_hashes: int = 1 << 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.epoch = uuid.uuid4().hex
        self.index = KVIndex()
        self.replica_ttl_s = replica_ttl_s
        self._max_log_entries = max_log_entries
        self._max_log_hashes = max_log_hashes
        self._clock = clock
        self._log: deque[_Logged] = deque()
        self._first_cursor = 0  # cursor of self._log[0]
        self._num_log_hashes = 0
        self._last_seen_s: dict[str, float] = {}
        self._lock = threading.RLock()  # the shard actor's stream thread publishes beside calls
        self._next_expiry_check_s = float("-inf")

    @property
    def cursor(self) -> int:
        """The cursor after the newest log entry."""
        return self._first_cursor + len(self._log)

    @_locked
    def publish(self, replica_id: str, batches: Sequence[CompactBatch]) -> PublishReply:
        """Apply a replica's batches in order (an empty list is a heartbeat); the reply's
        ``resync`` asks the worker for a snapshot (unknown replica, a gap, or still degraded)."""
        self._expire_silent()
        self._last_seen_s[replica_id] = self._clock()
        for batch in batches:
            seq, ops = batch.replica_seq, batch.ops
            status = self.index.apply_ops(replica_id, seq, ops)
            if status in _CHANGED:
                self._append(ReplicaBatch(replica_id, seq, ops), sum(len(op.hashes) for op in ops))
            if status in (ApplyStatus.GAP, ApplyStatus.NEEDS_RESYNC):
                break
        return PublishReply(resync=self.index.needs_resync(replica_id))

    @_locked
    def resync(
        self,
        replica_id: str,
        pool: str,
        hashes: Sequence[int],
        seq: int,
        tiers: TierSnapshot | None = None,
    ) -> None:
        """Install a snapshot of a replica's cache, device ``hashes`` and lower ``tiers``
        (also how a replica registers)."""
        lower = {medium: list(h) for medium, h in (tiers or {}).items()}
        snapshot = ReplicaSnapshot(replica_id, pool, list(hashes), seq, lower)
        self._last_seen_s[replica_id] = self._clock()
        self.index.resync(replica_id, snapshot.hashes, seq, pool=pool, tiers=lower)
        num_lower = sum(len(h) for h in lower.values())
        self._append(snapshot, len(snapshot.hashes) + num_lower)
        logger.info(
            "KV index: replica %s (%s) resynced, %d device and %d host/disk blocks",
            replica_id,
            pool,
            len(hashes),
            num_lower,
        )

    @_locked
    def remove_replica(self, replica_id: str) -> bool:
        """Forget a replica (drained or died); False when it was unknown."""
        self._last_seen_s.pop(replica_id, None)
        if not self.index.remove_replica(replica_id):
            return False
        self._append(ReplicaRemoved(replica_id), 0)
        logger.info("KV index: replica %s removed", replica_id)
        return True

    @_locked
    def updates(self, epoch: str | None, cursor: int) -> UpdatesReply:
        """Log entries after ``cursor``, or a snapshot when that is not possible."""
        self._expire_silent()
        if epoch != self.epoch or not self._first_cursor <= cursor <= self.cursor:
            return SnapshotReply(self.epoch, self.cursor, export_index(self.index))
        start = cursor - self._first_cursor
        entries = tuple(logged.entry for logged in itertools.islice(self._log, start, None))
        return EntriesReply(self.epoch, self.cursor, entries)

    @_locked
    def updates_plain(self, epoch: str | None, cursor: int) -> Any:
        """:meth:`updates` as plain data (``core.codec``), for the actor to answer with.

        NOTE: every router polls the same tail of the log, so each entry is encoded once, on
        the first poll that returns it, and kept beside it (the hashes lists share their ints).
        """
        reply = self.updates(epoch, cursor)
        if isinstance(reply, SnapshotReply):
            return to_plain(reply)
        start = cursor - self._first_cursor
        entries = [logged.plain() for logged in itertools.islice(self._log, start, None)]
        return {**to_plain(EntriesReply(reply.epoch, reply.cursor)), "entries": entries}

    @_locked
    def stats(self) -> ShardStats:
        """Index size and degraded replicas, plus the log length."""
        stats = self.index.stats()
        return ShardStats(
            num_replicas=stats.num_replicas,
            num_degraded_replicas=stats.num_degraded_replicas,
            num_entries=stats.num_entries,
            num_hashes=stats.num_hashes,
            num_log_entries=len(self._log),
        )

    def _expire_silent(self) -> None:
        """Remove replicas silent for ``replica_ttl_s``; looks at most once a second (or a
        tenth of the TTL): a thousand replicas must not cost every publish a scan."""
        now_s = self._clock()
        if now_s < self._next_expiry_check_s:
            return
        self._next_expiry_check_s = now_s + min(1.0, self.replica_ttl_s / 10)
        deadline_s = now_s - self.replica_ttl_s
        for replica_id, seen_s in list(self._last_seen_s.items()):
            if seen_s < deadline_s:
                logger.warning("KV index: replica %s silent for too long", replica_id)
                self.remove_replica(replica_id)

    def _append(self, entry: LogEntry, num_hashes: int) -> None:
        self._log.append(_Logged(num_hashes, entry))
        self._num_log_hashes += num_hashes
        while len(self._log) > 1 and (
            len(self._log) > self._max_log_entries or self._num_log_hashes > self._max_log_hashes
        ):
            self._num_log_hashes -= self._log.popleft().num_hashes
            self._first_cursor += 1


class _Logged:
    """One log entry, its size in hashes, and its plain form once a poll has asked for it."""

    __slots__ = ("_plain", "entry", "num_hashes")

    def __init__(self, num_hashes: int, entry: LogEntry) -> None:
        self.num_hashes = num_hashes
        self.entry = entry
        self._plain: Any = None

    def plain(self) -> Any:
        """The entry through ``core.codec.to_plain``, encoded on the first call."""
        if self._plain is None:
            self._plain = to_plain(self.entry)
        return self._plain


class KVIndexFollower:
    """A router's copy of the index, kept current by :meth:`apply_update`: of one server, or
    of ``num_shards`` shard servers merged into one index (their replicas never overlap, see
    ``shards``), each followed at its own ``(epoch, cursor)``."""

    def __init__(self, num_shards: int = 1, stride: int = 1) -> None:
        self.index = KVIndex(stride=stride)
        self.num_shards = num_shards
        self.epochs: list[str | None] = [None] * num_shards
        self.cursors = [0] * num_shards

    @property
    def epoch(self) -> str | None:
        """The first shard's epoch (the only one when unsharded)."""
        return self.epochs[0]

    @property
    def cursor(self) -> int:
        """The first shard's cursor (the only one when unsharded)."""
        return self.cursors[0]

    def apply_update(self, update: UpdatesReply, shard: int = 0) -> bool:
        """Apply one :meth:`KVIndexServer.updates` reply of ``shard``'s server; True when it
        showed the server restarted (a new epoch after a known one)."""
        previous = self.epochs[shard]
        if isinstance(update, SnapshotReply):
            for replica_id in self._replicas_of(shard):
                self.index.remove_replica(replica_id)
            load_index(update.snapshot, into=self.index)
        else:
            for entry in update.entries:
                self._replay(entry)
        self.epochs[shard] = update.epoch
        self.cursors[shard] = update.cursor
        return previous is not None and previous != update.epoch

    def forget_shard(self, shard: int) -> int:
        """``shard`` is unreachable: stop trusting its replicas (their hits count as none until
        its next snapshot, which the next successful poll asks for). Returns how many."""
        replica_ids = self._replicas_of(shard)
        for replica_id in replica_ids:
            self.index.mark_degraded(replica_id)
        self.epochs[shard] = None
        return len(replica_ids)

    def _replicas_of(self, shard: int) -> list[str]:
        return [r for r in self.index.replica_ids() if shard_of(r, self.num_shards) == shard]

    def _replay(self, entry: LogEntry) -> None:
        if isinstance(entry, ReplicaBatch):
            self.index.apply_ops(entry.replica_id, entry.seq, entry.ops)
        elif isinstance(entry, ReplicaSnapshot):
            self.index.resync(
                entry.replica_id, entry.hashes, entry.seq, pool=entry.pool, tiers=entry.tiers
            )
        else:
            self.index.remove_replica(entry.replica_id)


def export_index(index: KVIndex) -> IndexSnapshot:
    """A snapshot of a whole index (for followers that fell behind)."""
    replicas = []
    for replica_id in index.replica_ids():
        pool, last_seq = index.pool_of(replica_id), index.last_seq(replica_id)
        assert pool is not None and last_seq is not None  # NOTE: listed replicas are known
        replicas.append(
            ExportedReplica(
                replica_id=replica_id,
                pool=pool,
                last_seq=last_seq,
                degraded=index.is_degraded(replica_id),
                hashes=sorted(index.cached_hashes(replica_id)),
                tiers={m: sorted(index.cached_hashes(replica_id, m)) for m in ("host", "disk")},
            )
        )
    return IndexSnapshot(tuple(replicas))


def load_index(snapshot: IndexSnapshot, into: KVIndex | None = None) -> KVIndex:
    """Rebuild an index from :func:`export_index` (adding its replicas to ``into`` if given)."""
    index = KVIndex() if into is None else into
    for item in snapshot.replicas:
        index.resync(
            item.replica_id, item.hashes, item.last_seq + 1, pool=item.pool, tiers=item.tiers
        )
        if item.degraded:
            index.mark_degraded(item.replica_id)
    return index
