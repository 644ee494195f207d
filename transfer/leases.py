"""The export side's lease table: which blocks stay pinned for which transfer, and until when.

Every export is a :class:`Lease` that pins its blocks until the pull completes, the importer
releases it, or its deadline passes (heartbeats and pull progress push the deadline out). Freeing
calls the exporter's ``on_release(cause)`` exactly once, outside every lock. A reaper thread frees
expired leases; a bounded set of tombstones remembers recently freed ids so a late message gets a
precise NOT_FOUND reason and changes nothing.

NOTE: chunk reads happen under ``Lease.lock`` after checking ``released``; reclaiming takes the
same lock, so a freed (and possibly reused) block is never read.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from core.errors import TransferError
from core.kv_handle import TransferFailure

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
    """One export: its blocks, layout fingerprint, deadline and pull state."""

    def __init__(
        self, transfer_id: str, block_ids: tuple[int, ...], on_release: OnRelease | None
    ) -> None:
        self.transfer_id = transfer_id
        self.block_ids = block_ids
        self.on_release = on_release
        self.deadline_s = 0.0  # seconds on the table's clock (time.monotonic)
        self.pulling = False
        self.released: ReleaseCause | None = None
        self.lock = threading.Lock()


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

    def begin_pull(self, transfer_id: str) -> Lease:
        """Mark the lease as being pulled (only one pull at a time) and push its deadline."""
        with self._cond:
            lease = self._get_locked(transfer_id)
            if lease.pulling:
                raise TransferError(
                    f"transfer {transfer_id} is already being pulled",
                    reason=TransferFailure.ALREADY_PULLING,
                )
            lease.pulling = True
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

    def end_pull(self, lease: Lease, completed: bool) -> None:
        """A pull ended: free the blocks if it completed, else keep them under the lease."""
        with self._cond:
            lease.pulling = False
        if completed:
            self.reclaim(lease.transfer_id, ReleaseCause.COMPLETED)

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
