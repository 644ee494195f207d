"""The KV connector contract: where a request's KV leaves one engine and arrives at another.

One :class:`KVConnector` per engine is called at named points from two sides:

- the **scheduler side** (the engine thread, tensor-free) says which blocks to export as a
  prefill-only request computes them (:meth:`~KVConnector.export_blocks`,
  :meth:`~KVConnector.export_finished`), which reserved blocks of a decode import must be
  written from outside (:meth:`~KVConnector.import_blocks`), and when a request's blocks are
  about to be freed (:meth:`~KVConnector.before_free`, registered on the KV manager; a pull it
  cannot stop at once keeps them held until it stopped, never blocking the engine thread);
- the **worker side** starts the copies the scheduler side asked for
  (:meth:`~KVConnector.start_transfers`), waits for them (:meth:`~KVConnector.wait`) and hands
  back what ended (:meth:`~KVConnector.take_finished`), which the engine settles
  (:mod:`engine.kv_connector.settle`): ``mark_kv_ready`` / ``accept_first_token`` /
  ``mark_kv_failed``, unpinned exports and freed held blocks. A thread-driven engine registers
  a wake-up (:meth:`~KVConnector.set_wake`) so it learns of an end while it waits for commands.

Implementations are named for the mechanism: :class:`~engine.kv_connector.inproc.InProcKVConnector`
(two engines in one process: colocated serving and tests) here, the transfer layer's pulls
(gRPC or same-node) in ``replica/kv_connector/``. The engine never learns which one it has.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from core.kv_handle import TransferFailure
from engine.kv.kv_cache_manager import BlockRelease
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
    host_block_ids: tuple[int, ...] = ()
    """Blocks the copy wrote into the host mirror: uploaded to the device before the request
    joins the batch (empty when the copy wrote the device KV itself)."""
    failure: TransferFailure | None = None
    """Why a FAILED copy failed (the reason an ingress migrates on)."""
    message: str = ""
    """A FAILED copy's detail, for logs and the client's error."""


@dataclass(frozen=True)
class KVConnectorFinished:
    """What ended since the last :meth:`KVConnector.take_finished`, in the order it ended."""

    imports: tuple[ImportEnded, ...] = ()
    """Each import whose copy ended."""
    freed_exports: tuple[str, ...] = field(default_factory=tuple)
    """Request ids whose exported blocks nothing reads any more: the engine may unpin them."""
    stopped_writes: tuple[str, ...] = ()
    """Request ids whose held blocks (``before_free`` answered HELD) nothing writes any more:
    the engine frees them."""

    @property
    def is_empty(self) -> bool:
        """True when nothing ended."""
        return not self.imports and not self.freed_exports and not self.stopped_writes


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

    def before_free(self, request_id: str) -> BlockRelease:
        """The request's blocks are about to be freed, or it ended without any (any reason):
        stop reading them before this returns; a copy still writing them is cancelled and the
        answer is HELD (never wait for it here): :meth:`take_finished` names the request in
        ``stopped_writes`` once it stopped. Idempotent."""
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

    def set_wake(self, wake: Callable[[], None]) -> None:
        """Call ``wake()`` (from any thread, must not block) whenever something ended that
        :meth:`take_finished` will report."""
        ...
