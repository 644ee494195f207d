"""The worker-side end of the KV index: from engine callbacks to index updates.

:class:`KVEventRelay` is the engine's ``kv_event_callback``. It runs on the engine thread, so it
only does O(events) bookkeeping under a lock: it keeps a mirror of the replica's cached hashes
(from the same events, so a snapshot is always at hand without touching engine internals)
and queues compact batches. :class:`KVEventPump` runs on its own thread and moves what the
relay queued to an :class:`IndexSink` (the index actor, or a ``KVIndexServer`` in tests):
a registration snapshot first, then batches, a heartbeat every ``heartbeat_s``, and a fresh
snapshot whenever the sink asks for one (a gap) or a call failed. Nothing here blocks the
engine or any event loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cluster.routing.kv_index.compaction import (
    OP_CLEARED,
    OP_REMOVED,
    OP_STORED,
    TierSnapshot,
    compact_events,
)
from core.hashing import BlockHash
from core.kv_events import MEDIA, KVEventBatch
from core.kv_index_messages import CompactBatch, PublishReply

logger = logging.getLogger(__name__)


class IndexSink(Protocol):
    """Where a replica's KV index updates go (the index actor's methods, synchronously)."""

    def publish(self, replica_id: str, batches: Sequence[CompactBatch]) -> PublishReply:
        """Apply compact batches in order; an empty list is a heartbeat. The reply's ``resync``
        asks for a snapshot."""
        ...

    def resync(
        self,
        replica_id: str,
        pool: str,
        hashes: Sequence[int],
        seq: int,
        tiers: TierSnapshot | None = None,
    ) -> None:
        """Replace (or register) the replica's entries by a snapshot valid before ``seq``:
        ``hashes`` on the device, ``tiers`` in its host and disk tiers."""
        ...

    def remove_replica(self, replica_id: str) -> bool:
        """Forget the replica (it drains)."""
        ...


@dataclass(frozen=True)
class Outgoing:
    """What the pump sends next: a snapshot (when ``snapshot_hashes`` is set) then batches."""

    snapshot_hashes: list[BlockHash] | None
    snapshot_seq: int
    batches: list[CompactBatch]
    snapshot_tiers: dict[str, list[BlockHash]] = field(default_factory=dict)
    """Lower tiers in the snapshot (``host``, ``disk``): hashes each holds."""


class KVEventRelay:
    """Engine callback: mirrors the cached hashes per medium and queues compact batches
    (thread-safe)."""

    def __init__(self, *, max_pending_batches: int = 4096, stride: int = 1) -> None:
        """``stride``: publish only the sampled hashes (``routing.kv_index_stride``)."""
        self.max_pending_batches = max_pending_batches
        self.stride = stride
        self._lock = threading.Lock()
        self._cached: dict[str, set[BlockHash]] = {m: set() for m in MEDIA}
        self._next_seq = 0
        self._pending: list[CompactBatch] = []
        self._needs_snapshot = True  # the first message registers the replica
        self.wakeup = threading.Event()

    def __call__(self, batch: KVEventBatch) -> None:
        """The engine's ``kv_event_callback`` (engine thread)."""
        ops = compact_events(batch.events, self.stride)
        with self._lock:
            if batch.replica_seq != self._next_seq:
                logger.warning(
                    "KV events: expected seq %d, got %d", self._next_seq, batch.replica_seq
                )
            self._next_seq = batch.replica_seq + 1
            for op in ops:
                if op.kind == OP_STORED:
                    self._cached[op.medium].update(op.hashes)
                elif op.kind == OP_REMOVED:
                    self._cached[op.medium].difference_update(op.hashes)
                elif op.kind == OP_CLEARED:
                    self._cached["device"].clear()
            if not self._needs_snapshot:
                self._pending.append(CompactBatch(batch.replica_seq, tuple(ops)))
                if len(self._pending) > self.max_pending_batches:
                    self._request_snapshot_locked()
        self.wakeup.set()

    def request_snapshot(self) -> None:
        """Send a full snapshot next (the sink saw a gap, or a send failed)."""
        with self._lock:
            self._request_snapshot_locked()
        self.wakeup.set()

    def take(self) -> Outgoing:
        """Everything to send now; a snapshot replaces the batches it already covers."""
        with self._lock:
            self.wakeup.clear()
            snapshot: list[BlockHash] | None = None
            tiers: dict[str, list[BlockHash]] = {}
            if self._needs_snapshot:
                snapshot = list(self._cached["device"])
                tiers = {m: list(self._cached[m]) for m in MEDIA[1:] if self._cached[m]}
            outgoing = Outgoing(snapshot, self._next_seq, self._pending, tiers)
            self._pending = []
            self._needs_snapshot = False
            return outgoing

    def _request_snapshot_locked(self) -> None:
        self._needs_snapshot = True
        self._pending = []


class KVEventPump:
    """Moves a relay's output to a sink; :meth:`pump_once` is one exchange (used by tests),
    :meth:`start` runs exchanges on a daemon thread until :meth:`close`."""

    def __init__(
        self,
        relay: KVEventRelay,
        sink: IndexSink,
        replica_id: str,
        pool: str,
        *,
        flush_interval_s: float = 0.01,
        heartbeat_s: float = 2.0,
    ) -> None:
        self.relay = relay
        self.sink = sink
        self.replica_id = replica_id
        self.pool = pool
        self.flush_interval_s = flush_interval_s
        self.heartbeat_s = heartbeat_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def pump_once(self) -> bool:
        """Send what is queued (or a heartbeat); returns False when the sink failed."""
        outgoing = self.relay.take()
        try:
            if outgoing.snapshot_hashes is not None:
                self.sink.resync(
                    self.replica_id,
                    self.pool,
                    outgoing.snapshot_hashes,
                    outgoing.snapshot_seq,
                    outgoing.snapshot_tiers,
                )
            reply = self.sink.publish(self.replica_id, outgoing.batches)
        except Exception as e:  # the sink is remote: any failure means "resend a snapshot"
            logger.warning("KV index unreachable from replica %s: %s", self.replica_id, e)
            self.relay.request_snapshot()
            return False
        if reply.resync:
            self.relay.request_snapshot()
        return True

    def start(self) -> None:
        """Run :meth:`pump_once` on a daemon thread: after new events (coalesced for
        ``flush_interval_s``) or every ``heartbeat_s``."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name=f"kv-events-{self.replica_id}", daemon=True
        )
        self._thread.start()

    def close(self, *, deregister: bool = True, timeout_s: float = 5.0) -> None:
        """Stop the thread; with ``deregister`` tell the index this replica drains."""
        self._stop.set()
        self.relay.wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if deregister:
            try:
                self.sink.remove_replica(self.replica_id)
            except Exception as e:  # best effort: the index also expires silent replicas
                logger.warning("could not deregister replica %s: %s", self.replica_id, e)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.relay.wakeup.wait(self.heartbeat_s) and not self._stop.is_set():
                self._stop.wait(self.flush_interval_s)  # coalesce a burst into one call
            if self._stop.is_set():
                return
            if not self.pump_once():
                self._stop.wait(min(self.heartbeat_s, 1.0))  # back off while unreachable
