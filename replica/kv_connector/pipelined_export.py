"""One prefill's pipelined export: pulled from while its prompt is still being computed.

The prefill worker opens the export before the prompt runs (its handle goes to the ingress at
once, and from there to a decode worker that starts pulling), and the engine's progress reports
grow it: :class:`PipelinedExport` is the request's
:class:`~engine.kv_connector.export_progress.ExportWatcher`, adding each chunk's completed
blocks and finishing the export with the first token and the prompt's chunk ends. Its blocks
are pinned by the engine until the export is freed — pulled, released by the importer, expired,
or abandoned when the request fails — and a request that loses its blocks (preempted, aborted)
releases the export first, so no pull reads a freed block. Every way out frees both: the
export (``release``) and the pinned blocks
(``AsyncEngine.release_soon``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from core.errors import TransferError
from core.kv_handle import ExportDone, KVHandle
from engine.async_engine import AsyncEngine
from engine.scheduler.output import PinnedBlocks
from transfer import KVTransport
from transfer.leases import ReleaseCause

logger = logging.getLogger(__name__)


class PipelinedExport:
    """The export of one prefill-only request, grown as its chunks complete."""

    def __init__(
        self,
        transport: KVTransport,
        engine: AsyncEngine,
        request_id: str,
        num_blocks: int,
        on_freed: Callable[[str, ReleaseCause], None],
    ) -> None:
        """Open the export; ``on_freed(request_id, cause)`` runs once when it is freed."""
        self.request_id = request_id
        self._transport = transport
        self._engine = engine
        self._on_freed = on_freed
        self._lock = threading.Lock()
        self._num_added = 0
        self._freed = False
        self.done: ExportDone | None = None
        """What the prefill ended with, once the export is finished."""
        self.handle: KVHandle = transport.open_export(num_blocks, on_release=self._on_release)

    # -- the engine thread's reports (ExportWatcher) --------------------------------------------

    def on_ready(self, block_ids: list[int]) -> None:
        """A chunk completed these blocks: pullable now."""
        try:
            self._transport.add_ready(self.handle, block_ids)
            self._num_added += len(block_ids)
        except TransferError as e:  # the importer released it or it expired: nothing to grow
            logger.info(
                "request %s: export %s no longer grows: %s",
                self.request_id,
                self.handle.transfer_id,
                e,
            )

    def on_finished(self, pinned: PinnedBlocks) -> None:
        """The prefill ended: the rest of the blocks and the first token."""
        done = ExportDone(pinned.first_token_id, pinned.prompt_chunk_ends)
        try:
            self._transport.finish_export(self.handle, pinned.block_ids[self._num_added :], done)
            self.done = done
        except TransferError as e:  # freed meanwhile: its release found nothing pinned yet
            logger.info(
                "request %s: export %s ended before its prefill: %s",
                self.request_id,
                self.handle.transfer_id,
                e,
            )
            self._engine.release_soon(self.request_id)

    def on_lost(self) -> None:
        """The request's blocks are about to be freed: end the export before they are."""
        self.abandon()

    # -- any thread -----------------------------------------------------------------------------

    def abandon(self) -> None:
        """Free the export now unless it already is (the request failed or went away)."""
        with self._lock:
            if self._freed:
                return
        try:
            self._transport.release(self.handle)
        except TransferError as e:
            logger.debug(
                "request %s: releasing export %s: %s", self.request_id, self.handle.transfer_id, e
            )

    def _on_release(self, cause: ReleaseCause) -> None:
        with self._lock:
            self._freed = True
        self._engine.release_soon(self.request_id)  # unpins, if the prefill finished
        self._on_freed(self.request_id, cause)
