"""The export side's lease table: which blocks stay pinned for which transfer, and until when.

Every export is a :class:`Lease` that pins its blocks until the pull completes, the importer
releases it, or its deadline passes (heartbeats and pull progress push the deadline out). Freeing
calls the exporter's ``on_release(cause)`` exactly once, outside every lock. A reaper thread frees
expired leases; a bounded set of tombstones remembers recently freed ids so a late message gets a
precise NOT_FOUND reason and changes nothing.

A *pipelined* export is opened before its prompt is computed: its blocks become ready in prompt
order (:meth:`LeaseTable.add_ready`) and it finishes with the prefill's :class:`ExportDone`
(:meth:`LeaseTable.finish`); :meth:`LeaseTable.await_ready` lets an importer wait for either. A
pull is one stream over the whole export (v1: completing it frees the export) or one of several
streams over disjoint blocks that keep the export pinned until the importer releases it as
completed.

NOTE: chunk reads happen under ``Lease.lock`` after checking ``released``; reclaiming takes the
same lock, so a freed (and possibly reused) block is never read.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from core.errors import TransferError
from core.kv_handle import ExportDone, TransferFailure

logger = logging.getLogger(__name__)

_MAX_TOMBSTONES = 4096


class ReleaseCause(enum.StrEnum):
    """Why an export's blocks were freed."""

    COMPLETED = "completed"
    RELEASED = "released"
    EXPIRED = "expired"
    SHUTDOWN = "shutdown"


OnRelease = Callable[[ReleaseCause], None]


class Lease:
    """One export: its blocks, deadline and pull state.

    ``block_ids`` holds the ready blocks in prompt order: all of them for a complete export,
    a growing prefix of ``num_blocks`` for a pipelined one until it is ``finished``."""

    def __init__(
        self,
        transfer_id: str,
        block_ids: Sequence[int],
        on_release: OnRelease | None,
        *,
        num_blocks: int | None = None,
    ) -> None:
        self.transfer_id = transfer_id
        self.block_ids: list[int] = list(block_ids)
        self.num_blocks = len(self.block_ids) if num_blocks is None else num_blocks
        self.pipelined = num_blocks is not None
        self.finished = not self.pipelined
        self.done: ExportDone | None = None
        self.on_release = on_release
        self.deadline_s = 0.0  # seconds on the table's clock (time.monotonic)
        self.whole_pull = False  # a v1 stream over the whole export is running
        # indices (or a shard's keys of them) streams of a split pull are reading / completed
        self.pulling: set[int | tuple[int, int, int]] = set()
        self.pulled: set[int | tuple[int, int, int]] = set()
        self.released: ReleaseCause | None = None
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        """Notified when blocks become ready, the export finishes or it is freed."""

    def check_ready(self, indices: Sequence[int]) -> None:
        """Raise ``TransferError(not_ready)`` unless every index is a ready block (lock held)."""
        num_ready = len(self.block_ids)
        late = [i for i in indices if i >= num_ready]
        if late:
            raise TransferError(
                f"blocks {late[:8]} of {self.transfer_id} are not computed yet "
                f"({num_ready} of {self.num_blocks} ready)",
                reason=TransferFailure.NOT_READY,
            )


class LeaseTable:
    """Thread-safe table of live leases with a background reaper."""

    def __init__(
        self,
        lease_s: float,
        on_released: Callable[[ReleaseCause], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        start_reaper: bool = True,
    ) -> None:
        """``on_released(cause)`` counts frees (metrics); ``clock`` and ``start_reaper`` let
        tests drive expiry by hand through :meth:`reap_expired`."""
        self.lease_s = lease_s
        self._on_released = on_released
        self._clock = clock
        self._leases: dict[str, Lease] = {}
        self._tombstones: OrderedDict[str, ReleaseCause] = OrderedDict()
        self._cond = threading.Condition()
        self._closed = False
        self._reaper: threading.Thread | None = None
        if start_reaper:
            self._reaper = threading.Thread(
                target=self._reap_loop, name="pdserve-kv-reaper", daemon=True
            )
            self._reaper.start()

    def add(self, lease: Lease) -> None:
        """Start ``lease``'s clock and make it visible."""
        with self._cond:
            if self._closed:
                raise TransferError(
                    "exporter is shut down", reason=TransferFailure.EXPORTER_UNAVAILABLE
                )
            lease.deadline_s = self._clock() + self.lease_s
            self._leases[lease.transfer_id] = lease
            self._cond.notify_all()

    def get(self, transfer_id: str) -> Lease:
        """The live lease of ``transfer_id``; ``TransferError`` naming why it is gone otherwise."""
        with self._cond:
            return self._get_locked(transfer_id)

    def extend(self, transfer_id: str) -> float:
        """Heartbeat: push the deadline to now + lease_s; returns the remaining seconds."""
        with self._cond:
            lease = self._get_locked(transfer_id)
            now = self._clock()
            lease.deadline_s = max(lease.deadline_s, now + self.lease_s)
            return lease.deadline_s - now

    def begin_pull(
        self,
        transfer_id: str,
        indices: Sequence[int] = (),
        *,
        keep_export: bool = False,
        shard_key: ShardKey | None = None,
    ) -> Lease:
        """Mark ``indices`` of the lease as being pulled and push its deadline. Without
        ``keep_export`` the stream pulls the whole export and no other may run; with it, streams
        of one importer pull disjoint ready blocks side by side (``shard_key``: of one shard of
        the heads; streams of different shards may pull the same blocks)."""
        keys = _keys(indices, shard_key)
        with self._cond:
            lease = self._get_locked(transfer_id)
            with lease.lock:
                busy = lease.whole_pull or (not keep_export and bool(lease.pulling))
                overlap = lease.pulling.intersection(keys) | lease.pulled.intersection(keys)
                if busy or overlap:
                    raise TransferError(
                        f"transfer {transfer_id} is already being pulled"
                        + (f" (blocks {sorted(overlap)[:8]})" if overlap else ""),
                        reason=TransferFailure.ALREADY_PULLING,
                    )
                lease.check_ready(indices)
                if keep_export:
                    lease.pulling.update(keys)
                else:
                    lease.whole_pull = True
            lease.deadline_s = max(lease.deadline_s, self._clock() + self.lease_s)
            return lease

    def _get_locked(self, transfer_id: str) -> Lease:
        lease = self._leases.get(transfer_id)
        if lease is not None:
            return lease
        cause = self._tombstones.get(transfer_id)
        if cause == ReleaseCause.EXPIRED:
            raise TransferError(
                f"lease of {transfer_id} expired", reason=TransferFailure.LEASE_EXPIRED
            )
        detail = f"already {cause}" if cause else "never exported here"
        raise TransferError(
            f"unknown transfer {transfer_id} ({detail})", reason=TransferFailure.UNKNOWN_TRANSFER
        )

    def end_pull(
        self,
        lease: Lease,
        completed: bool,
        indices: Sequence[int] = (),
        *,
        keep_export: bool = False,
        shard_key: ShardKey | None = None,
    ) -> None:
        """A pull ended. A whole pull that completed frees the blocks; a stream of a split pull
        only records its blocks as pulled (the importer releases the export when it has all)."""
        keys = _keys(indices, shard_key)
        with self._cond, lease.lock:
            if keep_export:
                lease.pulling.difference_update(keys)
                if completed:
                    lease.pulled.update(keys)
            else:
                lease.whole_pull = False
        if completed and not keep_export:
            self.reclaim(lease.transfer_id, ReleaseCause.COMPLETED)

    def add_ready(self, transfer_id: str, block_ids: Sequence[int]) -> None:
        """A pipelined export's next ready blocks (in prompt order); pushes its deadline."""
        self._grow(transfer_id, block_ids, None)

    def finish(self, transfer_id: str, block_ids: Sequence[int], done: ExportDone) -> None:
        """A pipelined export's last ready blocks and what its prefill ended with."""
        self._grow(transfer_id, block_ids, done)

    def _grow(self, transfer_id: str, block_ids: Sequence[int], done: ExportDone | None) -> None:
        with self._cond:
            lease = self._get_locked(transfer_id)
            with lease.lock:
                if lease.finished:
                    raise TransferError(
                        f"kv export {transfer_id} is already complete",
                        reason=TransferFailure.INVALID_REQUEST,
                    )
                if len(lease.block_ids) + len(block_ids) > lease.num_blocks:
                    raise TransferError(
                        f"kv export {transfer_id} holds {lease.num_blocks} blocks; "
                        f"{len(lease.block_ids)} + {len(block_ids)} would overrun it",
                        reason=TransferFailure.INVALID_REQUEST,
                    )
                lease.block_ids.extend(block_ids)
                if done is not None:
                    if len(lease.block_ids) != lease.num_blocks:
                        raise TransferError(
                            f"kv export {transfer_id} finished with {len(lease.block_ids)} of "
                            f"{lease.num_blocks} blocks",
                            reason=TransferFailure.INVALID_REQUEST,
                        )
                    lease.finished, lease.done = True, done
                lease.changed.notify_all()
            lease.deadline_s = max(lease.deadline_s, self._clock() + self.lease_s)

    def await_ready(
        self, transfer_id: str, min_ready_blocks: int, wait_s: float
    ) -> tuple[int, ExportDone | None]:
        """Wait up to ``wait_s`` until ``min_ready_blocks`` blocks are ready or the export
        finished; ``(ready blocks, ExportDone once finished)``. ``TransferError`` naming why
        when the export is (or becomes) gone. A waiting importer counts as a heartbeat."""
        self.extend(transfer_id)
        lease = self.get(transfer_id)
        deadline_s = time.monotonic() + wait_s
        with lease.lock:
            while (
                lease.released is None
                and not lease.finished
                and len(lease.block_ids) < min_ready_blocks
            ):
                left_s = deadline_s - time.monotonic()
                if left_s <= 0:
                    break
                lease.changed.wait(left_s)
            if lease.released is None:
                return len(lease.block_ids), lease.done
        return 0, self._gone(transfer_id)

    def _gone(self, transfer_id: str) -> ExportDone | None:
        """Raise why ``transfer_id`` was freed (it was: see :meth:`_get_locked`)."""
        with self._cond:
            self._get_locked(transfer_id)
        return None  # pragma: no cover - _get_locked raised: the lease is freed

    def touch(self, lease: Lease) -> None:
        """Pull progress: push the deadline to at least now + lease_s."""
        with self._cond:
            lease.deadline_s = max(lease.deadline_s, self._clock() + self.lease_s)

    def reclaim(self, transfer_id: str, cause: ReleaseCause) -> bool:
        """Free one lease now; False if it was already gone (then nothing changes)."""
        with self._cond:
            lease = self._pop(transfer_id, cause)
        if lease is None:
            return False
        self._free(lease, cause)
        return True

    def _pop(self, transfer_id: str, cause: ReleaseCause) -> Lease | None:
        # Caller holds self._cond.
        lease = self._leases.pop(transfer_id, None)
        if lease is not None:
            self._tombstones[transfer_id] = cause
            while len(self._tombstones) > _MAX_TOMBSTONES:
                self._tombstones.popitem(last=False)
        return lease

    def _free(self, lease: Lease, cause: ReleaseCause) -> None:
        with lease.lock:  # waits for a chunk read in progress
            lease.released = cause
            lease.changed.notify_all()
        logger.debug("kv export %s freed (%s)", lease.transfer_id, cause)
        self._on_released(cause)
        if lease.on_release is not None:
            try:
                lease.on_release(cause)
            except Exception:
                logger.exception("on_release of kv export %s raised", lease.transfer_id)

    def num_live(self) -> int:
        """Leases not yet freed."""
        with self._cond:
            return len(self._leases)

    def close(self) -> None:
        """Stop the reaper and free every live lease (cause SHUTDOWN)."""
        with self._cond:
            self._closed = True
            live = list(self._leases)
            self._cond.notify_all()
        if self._reaper is not None:
            self._reaper.join()
        for transfer_id in live:
            self.reclaim(transfer_id, ReleaseCause.SHUTDOWN)

    def reap_expired(self) -> int:
        """Free every lease whose deadline has passed; returns how many."""
        with self._cond:
            now = self._clock()
            due = [t for t, lease in self._leases.items() if lease.deadline_s <= now]
            expired = [lease for t in due if (lease := self._pop(t, ReleaseCause.EXPIRED))]
        for lease in expired:
            logger.info("kv export %s lease expired; freeing its blocks", lease.transfer_id)
            self._free(lease, ReleaseCause.EXPIRED)
        return len(expired)

    def _reap_loop(self) -> None:
        while True:
            self.reap_expired()
            with self._cond:
                if self._closed:
                    return
                now = self._clock()
                next_s = min((lease.deadline_s for lease in self._leases.values()), default=now + 1)
                self._cond.wait(timeout=min(max(next_s - now, 0.001), 1.0))


ShardKey = Callable[[int], tuple[int, int, int]]
"""A shard's key of an export index (``transfer.shards.KVShard.key``)."""


def _keys(indices: Sequence[int], shard_key: ShardKey | None) -> list[int | tuple[int, int, int]]:
    if shard_key is None:
        return list(indices)
    return [shard_key(index) for index in indices]
