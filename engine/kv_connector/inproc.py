"""An in-process :class:`~engine.kv_connector.base.KVConnector`: engines in one process.

Colocated serving and tests: every engine has its own :class:`InProcKVConnector`, all sharing
one :class:`InProcKVHub` (the exports, by request id). An exporting engine's scheduler side
records which of its blocks each prefill exposes; an importing engine's records which reserved
blocks each import needs, and its :meth:`InProcKVConnector.start_transfers` copies block bytes
from the exporter's storage into its own (host views, then a device upload where the storage
mirrors a GPU) once the export finished. An export is freed once an import copied it, or when
its blocks are about to be freed on the exporting side (an import waiting on it then fails).
Nothing runs on another thread: ``wait`` only reports whether something already ended.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from engine.kv.kv_cache_manager import BlockRelease
from engine.kv_connector.base import (
    ImportEnded,
    ImportResult,
    KVConnectorFinished,
    KVImportSource,
)
from engine.scheduler.output import ImportAllocation, PinnedBlocks

logger = logging.getLogger(__name__)


class BlockBytes(Protocol):
    """The part of a KV storage the in-process copy needs (``engine.kv.storage.KVStorage``)."""

    def block_view(self, block_id: int) -> memoryview:
        """A writable byte view of one block in host memory."""
        ...

    def stage_to_device(self, block_ids: list[int]) -> None:
        """Upload blocks written through their host views to the device (no-op on CPU)."""
        ...


@dataclass
class _Export:
    owner: InProcKVConnector
    block_ids: list[int] = field(default_factory=list)
    first_token_id: int | None = None
    prompt_chunk_ends: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Import:
    request_id: str
    export_id: str
    src_indices: list[int]
    dst_block_ids: list[int]


class InProcKVHub:
    """The exports of every engine in this process, by exporting request id."""

    def __init__(self) -> None:
        self.exports: dict[str, _Export] = {}

    def free(self, export_id: str) -> None:
        """Drop an export and tell its owner (whose engine may unpin the blocks)."""
        export = self.exports.pop(export_id, None)
        if export is not None:
            export.owner.export_freed(export_id)


class InProcKVConnector:
    """One engine's connector: its storage, its imports, and its exports in the shared hub."""

    def __init__(self, hub: InProcKVHub, storage: BlockBytes) -> None:
        self.storage = storage
        self._hub = hub
        self._imports: dict[str, _Import] = {}  # by importing request id
        self._ended_imports: list[ImportEnded] = []
        self._freed_exports: list[str] = []
        self._wake: Callable[[], None] = _nothing

    # -- scheduler side ---------------------------------------------------------------------------

    def export_blocks(self, request_id: str, block_ids: list[int]) -> None:
        """Record these computed blocks as readable (see ``KVConnector``)."""
        self._export(request_id).block_ids.extend(block_ids)

    def export_finished(self, pinned: PinnedBlocks) -> None:
        """Record the prefill's whole pinned table and its first token."""
        export = self._export(pinned.request_id)
        export.block_ids = list(pinned.block_ids)
        export.first_token_id = pinned.first_token_id
        export.prompt_chunk_ends = pinned.prompt_chunk_ends

    def import_blocks(self, allocation: ImportAllocation, source: KVImportSource) -> None:
        """Queue the copy of the allocation's missing blocks from ``source``'s export."""
        missing = allocation.missing_block_indices
        self._imports[allocation.request_id] = _Import(
            allocation.request_id,
            source.export_id,
            missing,
            [allocation.block_ids[i] for i in missing],
        )

    def before_free(self, request_id: str) -> BlockRelease:
        """Drop the request's import (copies run inside :meth:`start_transfers`, so nothing
        writes its blocks now) or free its export."""
        if self._imports.pop(request_id, None) is not None:
            return BlockRelease.NOW
        export = self._hub.exports.get(request_id)
        if export is not None and export.owner is self:
            self._hub.free(request_id)
        return BlockRelease.NOW

    # -- worker side ------------------------------------------------------------------------------

    def start_transfers(self) -> None:
        """Copy every import whose export finished and free that export; fail the imports
        whose export is gone."""
        for job in list(self._imports.values()):
            export = self._hub.exports.get(job.export_id)
            if export is None:
                self._end(ImportEnded(job.request_id, ImportResult.FAILED))
                logger.info("request %s: export %s is gone", job.request_id, job.export_id)
            elif export.first_token_id is not None:
                source = export.owner.storage
                for index, dst in zip(job.src_indices, job.dst_block_ids, strict=True):
                    self.storage.block_view(dst)[:] = source.block_view(export.block_ids[index])
                self.storage.stage_to_device(job.dst_block_ids)
                self._end(
                    ImportEnded(
                        job.request_id,
                        ImportResult.READY,
                        export.first_token_id,
                        export.prompt_chunk_ends,
                    )
                )
                self._hub.free(job.export_id)

    def wait(self, timeout_s: float) -> bool:
        """Copies run inside :meth:`start_transfers`: True if some already ended."""
        del timeout_s  # nothing runs in the background to wait for
        return bool(self._ended_imports or self._freed_exports)

    def take_finished(self) -> KVConnectorFinished:
        """The imports that ended and the exports freed since the last call."""
        finished = KVConnectorFinished(tuple(self._ended_imports), tuple(self._freed_exports))
        self._ended_imports.clear()
        self._freed_exports.clear()
        return finished

    def set_wake(self, wake: Callable[[], None]) -> None:
        """Call ``wake()`` whenever an import ends or an export is freed."""
        self._wake = wake

    # -- the hub's and tests' side ----------------------------------------------------------------

    def export_freed(self, export_id: str) -> None:
        """The hub dropped one of this engine's exports."""
        self._freed_exports.append(export_id)
        self._wake()

    def exported_block_ids(self, request_id: str) -> list[int]:
        """The blocks of this engine's export not freed yet, in prompt order (empty if none)."""
        export = self._hub.exports.get(request_id)
        return [] if export is None or export.owner is not self else list(export.block_ids)

    def _export(self, request_id: str) -> _Export:
        return self._hub.exports.setdefault(request_id, _Export(self))

    def _end(self, ended: ImportEnded) -> None:
        del self._imports[ended.request_id]
        self._ended_imports.append(ended)
        self._wake()


def _nothing() -> None:
    """No one to wake."""
