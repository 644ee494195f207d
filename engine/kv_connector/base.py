"""The KV connector contract: where a request's KV leaves one engine and arrives at another.

One :class:`KVConnector` per engine is called at named points from two sides:

- the **scheduler side** (the engine thread, tensor-free) says which blocks to export as a
  prefill-only request computes them (:meth:`~KVConnector.export_blocks`,
  :meth:`~KVConnector.export_finished`), which reserved blocks of a decode import must be
  written from outside (:meth:`~KVConnector.import_blocks`), and when a request's blocks are
  about to be freed (:meth:`~KVConnector.before_free`, registered on the KV manager);
- the **worker side** starts the copies the scheduler side asked for
  (:meth:`~KVConnector.start_transfers`), waits for them (:meth:`~KVConnector.wait`) and hands
  back what ended (:meth:`~KVConnector.take_finished`), which the engine turns into
  ``mark_kv_ready`` / ``mark_kv_failed`` and unpins.

Implementations are named for the mechanism: :class:`~engine.kv_connector.inproc.InProcKVConnector`
(two engines in one process: colocated serving and tests) here, the transfer layer's pulls
(gRPC or same-node) in ``replica/kv_connector/``. The engine never learns which one it has.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from engine.scheduler.output import ImportAllocation, PinnedBlocks


class ImportResult(enum.Enum):
    """How one import's copy ended."""

    READY = "ready"
    """Every missing block was written: the request may decode."""
    FAILED = "failed"
    """The source went away or a copy failed: recompute the prompt or end the request."""


@dataclass(frozen=True)
class KVImportSource:
    """Where an import's missing blocks come from: an export's id on the exporting side."""

    export_id: str


@dataclass(frozen=True)
class ImportEnded:
    """One import whose copy ended."""

    request_id: str
    result: ImportResult
    first_token_id: int | None = None
    """The prefill's first token when the export carried it (a pipelined import learns it so)."""
    prompt_chunk_ends: tuple[int, ...] = ()
    """Where the prefill's chunks ended, for an identical recompute."""


@dataclass(frozen=True)
class KVConnectorFinished:
    """What ended since the last :meth:`KVConnector.take_finished`, in the order it ended."""

    imports: tuple[ImportEnded, ...] = ()
    """Each import whose copy ended."""
    freed_exports: tuple[str, ...] = field(default_factory=tuple)
    """Request ids whose exported blocks nothing reads any more: the engine may unpin them."""

    @property
    def is_empty(self) -> bool:
        """True when nothing ended."""
        return not self.imports and not self.freed_exports


class KVConnector(Protocol):
    """Moves KV blocks between engines; called by the scheduler side and the worker side."""

    # -- scheduler side (engine thread, never blocks, never touches tensors) ------------------

    def export_blocks(self, request_id: str, block_ids: list[int]) -> None:
        """These blocks of a prefill-only request (the next ones, in prompt order) are computed
        and staged: readers may copy them from now on."""
        ...

    def export_finished(self, pinned: PinnedBlocks) -> None:
        """The prefill ended: every block it keeps pinned (the partial last one included) and
        its first token; the blocks stay pinned until the export is freed."""
        ...

    def import_blocks(self, allocation: ImportAllocation, source: KVImportSource) -> None:
        """These reserved blocks (``allocation.missing_block_indices``) must be written from
        ``source``; the request waits for KV until :meth:`take_finished` reports the import."""
        ...

    def before_free(self, request_id: str) -> None:
        """The request's blocks are about to be freed, or it ended without any (any reason):
        stop reading or writing them before this returns. Idempotent."""
        ...

    # -- worker side -----------------------------------------------------------------------------

    def start_transfers(self) -> None:
        """Start the loads and saves the scheduler side asked for whose sources are ready."""
        ...

    def wait(self, timeout_s: float) -> bool:
        """Block until some transfer ended or ``timeout_s`` passed; True if one ended."""
        ...

    def take_finished(self) -> KVConnectorFinished:
        """The imports and exports that ended since the last call (each reported once)."""
        ...
