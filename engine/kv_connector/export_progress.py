"""Pipelined exports, engine side: tell a prefill-only request's watcher as its KV completes.

A prefill worker that exports a prompt's KV before the prompt is computed registers an
:class:`ExportWatcher` with the request. After every engine step :meth:`ExportProgress.report`
hands each watcher the blocks its request completed since the last step (full blocks only; a
block is complete once every one of its tokens was computed, and a prefill-only request never
writes it again), staged where the transfer layer reads them; when the prefill finishes it hands
over the pinned blocks (the last, partial one included) with the first token. Just before a
watched request's blocks are freed — preempted, aborted, or ended by its first token — the
watcher hears ``on_lost`` first, on the engine thread, so no other thread reads a block after it
was freed (and perhaps reused). Every callback runs on the engine thread and must not block.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from engine.engine import LLMEngine
from engine.kv_connector.base import KVConnector
from engine.request import RequestStatus
from engine.scheduler.output import PinnedBlocks

logger = logging.getLogger(__name__)


class ExportWatcher(Protocol):
    """Follows one prefill-only request's KV as it completes (engine thread only)."""

    def on_ready(self, block_ids: list[int]) -> None:
        """These blocks (the next ones, in prompt order) are computed and staged."""
        ...

    def on_finished(self, pinned: PinnedBlocks) -> None:
        """The prefill finished: every block it keeps pinned, and its first token."""
        ...

    def on_lost(self) -> None:
        """The request's blocks are about to be freed: stop reading them now."""
        ...


class ConnectorWatcher:
    """The watcher of a request exported through a connector: forwards its progress there."""

    def __init__(self, connector: KVConnector, request_id: str) -> None:
        self._connector = connector
        self._request_id = request_id

    def on_ready(self, block_ids: list[int]) -> None:
        """Hand the completed blocks to the connector's export."""
        self._connector.export_blocks(self._request_id, block_ids)

    def on_finished(self, pinned: PinnedBlocks) -> None:
        """Finish the connector's export."""
        self._connector.export_finished(pinned)

    def on_lost(self) -> None:
        """End the export (a request that never held blocks is lost without passing the
        before-free listeners)."""
        self._connector.before_free(self._request_id)


@dataclass
class _Watch:
    watcher: ExportWatcher
    num_reported: int = 0


class ExportProgress:
    """The watched requests of one engine and how far each was reported (engine thread)."""

    def __init__(self, engine: LLMEngine) -> None:
        self._engine = engine
        self._watched: dict[str, _Watch] = {}
        engine.scheduler.kv.register_before_free(self._before_free)

    def watch(self, request_id: str, watcher: ExportWatcher) -> None:
        """Follow ``request_id`` (just added as a prefill-only request)."""
        self._watched[request_id] = _Watch(watcher)

    def report(self) -> None:
        """After a step: newly completed blocks of every watched request, or its end."""
        if not self._watched:
            return
        scheduler = self._engine.scheduler
        block_size = scheduler.block_size
        for request_id in list(self._watched):
            watch = self._watched[request_id]
            request = scheduler.get_request(request_id)
            if request is None:  # freed without passing before_free (never held blocks)
                self._drop(request_id).watcher.on_lost()
            elif request.status is RequestStatus.FINISHED_PREFILL:
                pinned = scheduler.get_pinned_blocks(request_id)
                self._drop(request_id)
                if pinned is not None:
                    self._stage(pinned.block_ids[watch.num_reported :])
                    self._call(request_id, functools.partial(watch.watcher.on_finished, pinned))
            else:
                num_full = request.num_computed_tokens // block_size
                if num_full > watch.num_reported:
                    new = scheduler.block_table(request_id)[watch.num_reported : num_full]
                    watch.num_reported = num_full
                    self._stage(new)
                    self._call(request_id, functools.partial(watch.watcher.on_ready, new))

    def _before_free(self, request_id: str) -> None:
        watch = self._watched.pop(request_id, None)
        if watch is not None:
            self._call(request_id, watch.watcher.on_lost)

    def _drop(self, request_id: str) -> _Watch:
        return self._watched.pop(request_id)

    def _stage(self, block_ids: list[int]) -> None:
        self._engine.parts.storage.stage_to_host(block_ids)

    @staticmethod
    def _call(request_id: str, callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:  # a watcher's failure is its own; the engine steps on
            logger.exception("request %s: export watcher raised", request_id)
