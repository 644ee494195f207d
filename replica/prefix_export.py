"""A holder's side of a deliberate hot-prefix copy: export the blocks its prefix cache holds for a
list of block hashes, so another replica of the pool pulls them (``replica.prefix_pull``). A
leaving decode replica hands its running requests off the same way (:meth:`PrefixExporter.
hand_off`): its computed blocks are pinned and exported, then it is aborted, and the replica that
continues it pulls them.

:meth:`PrefixExporter.export` runs one command on the engine thread: pin the leading run of the
hashes the prefix cache holds (``LLMEngine.pin_prefix``, staged where the transfer layer reads
it) and export those blocks through the replica's ``KVTransport`` under a lease. The pin lasts
until the transport releases the export — pulled, released by the importer, expired or shut
down, whichever comes first — and is then let go on the engine thread; an export the transport
refuses is unpinned at once. Nothing is pinned for longer than one lease.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence

from core.errors import TransferError, UnavailableError
from core.hashing import BlockHash
from core.ids import new_request_id
from core.messages import PrefixExport
from engine.async_engine import AsyncEngine
from engine.engine import LLMEngine
from transfer import KVTransport
from transfer.leases import ReleaseCause

logger = logging.getLogger(__name__)


class PrefixExporter:
    """Exports cached prefixes of one engine by block hash, each pinned until released."""

    def __init__(self, engine: AsyncEngine, transport: KVTransport) -> None:
        self._engine = engine
        self._transport = transport
        self._lock = threading.Lock()
        self._live: set[str] = set()  # pin ids whose export the transport has not released

    @property
    def num_live_exports(self) -> int:
        """Exports not yet released (their blocks pinned)."""
        with self._lock:
            return len(self._live)

    async def export(self, block_hashes: Sequence[BlockHash]) -> PrefixExport | None:
        """Export the leading run of ``block_hashes`` the prefix cache holds; None when it
        holds not even the first. Raises ``TransferError`` when the transport refuses."""
        pin_id = new_request_id("prefix-export")
        return await self._engine.call(lambda engine: self._open(engine, pin_id, block_hashes))

    async def hand_off(self, request_id: str) -> tuple[bool, PrefixExport | None]:
        """Stop a decoding request of a leaving replica and export its computed blocks
        (pinned by ``LLMEngine.pin_request``, then the request aborted): ``(stopped,
        export)``. Not stopped when it was not decoding, or ended on its own meanwhile (its
        export is released); no export when no block was cached or the transport refused
        (the request then continues elsewhere by recompute)."""
        pin_id = new_request_id("handoff")

        def pin_and_export(engine: LLMEngine) -> tuple[bool, PrefixExport | None]:
            pinned = engine.pin_request(request_id, pin_id)
            if pinned is None:
                return False, None
            hashes, block_ids = pinned
            if not block_ids:
                return True, None
            try:
                return True, self._export_pinned(engine, pin_id, hashes, block_ids)
            except TransferError as e:
                logger.warning("request %s: its handoff export was refused: %s", request_id, e)
                return True, None

        stopping, export = await self._engine.call(pin_and_export)
        if not stopping:
            return False, None
        if not await self._engine.abort(request_id):  # it finished on its own first
            if export is not None:
                await asyncio.to_thread(self._transport.release, export.handle)
            return False, None
        return True, export

    def _open(
        self, engine: LLMEngine, pin_id: str, block_hashes: Sequence[BlockHash]
    ) -> PrefixExport | None:
        """On the engine thread: pin, then export."""
        block_ids = engine.pin_prefix(pin_id, block_hashes)
        if not block_ids:
            return None
        return self._export_pinned(engine, pin_id, block_hashes, block_ids)

    def _export_pinned(
        self,
        engine: LLMEngine,
        pin_id: str,
        block_hashes: Sequence[BlockHash],
        block_ids: list[int],
    ) -> PrefixExport:
        """On the engine thread: export blocks pinned under ``pin_id`` (unpinned at once when
        the transport refuses, raising its ``TransferError``)."""
        with self._lock:
            self._live.add(pin_id)
        try:
            handle = self._transport.export(
                block_ids, on_release=lambda cause: self._released(pin_id, cause)
            )
        except TransferError:
            self._forget(pin_id)
            engine.unpin_prefix(pin_id)
            raise
        logger.info(
            "exporting %d blocks of prefix %s as %s",
            len(block_ids),
            block_hashes[0],
            handle.transfer_id,
        )
        return PrefixExport(tuple(block_hashes[: len(block_ids)]), handle)

    def _released(self, pin_id: str, cause: ReleaseCause) -> None:
        """The transport let the export go (any thread): unpin on the engine thread."""
        logger.debug("prefix export %s released (%s)", pin_id, cause)

        def unpin(engine: LLMEngine) -> None:
            engine.unpin_prefix(pin_id)
            self._forget(pin_id)

        try:
            self._engine.submit(unpin)
        except UnavailableError:  # the engine shut down: its blocks went with it
            logger.debug("engine gone; prefix export %s needs no unpin", pin_id)
            self._forget(pin_id)

    def _forget(self, pin_id: str) -> None:
        with self._lock:
            self._live.discard(pin_id)
