"""Collects the KV events of one engine and hands them out in numbered batches.

The block pool and the KV cache manager :meth:`~KVEventPublisher.record` events as they happen;
the scheduler calls :meth:`~KVEventPublisher.flush` at the end of every public operation that
can store or evict blocks, which delivers one :class:`~core.kv_events.KVEventBatch` (if any
event happened) to the callback. ``replica_seq`` counts delivered batches from 0, so a consumer
detects a lost batch by a gap. Without a callback nothing is buffered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from core.kv_events import KVEvent, KVEventBatch

logger = logging.getLogger(__name__)

KVEventCallback = Callable[[KVEventBatch], None]


class KVEventPublisher:
    """Orders and numbers one engine's KV events; delivers them through ``callback``."""

    def __init__(self, callback: KVEventCallback | None = None) -> None:
        self._callback = callback
        self._pending: list[KVEvent] = []
        self._next_seq = 0

    @property
    def enabled(self) -> bool:
        """True when a callback is set (events are recorded at all)."""
        return self._callback is not None

    @property
    def next_seq(self) -> int:
        """The ``replica_seq`` the next delivered batch will carry."""
        return self._next_seq

    def record(self, event: KVEvent) -> None:
        """Queue ``event`` behind every event recorded before it."""
        if self._callback is not None:
            self._pending.append(event)

    def flush(self) -> KVEventBatch | None:
        """Deliver the queued events as one batch; returns it (``None`` when nothing queued)."""
        if self._callback is None or not self._pending:
            return None
        batch = KVEventBatch(
            replica_seq=self._next_seq, events=self._pending, timestamp_s=time.time()
        )
        self._pending = []
        self._next_seq += 1
        self._callback(batch)
        logger.debug("KV event batch %d: %d events", batch.replica_seq, len(batch.events))
        return batch
