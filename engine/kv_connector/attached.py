"""The KV connectors attached to one engine that runs on its own thread
(:class:`~engine.async_engine.AsyncEngine`), and that thread's record of the imports it hands
them.

:class:`AttachedConnectors` registers each connector's ``before_free`` on the KV manager and its
wake-up, starts their transfers before a step and settles what they report ended after it
(:func:`~engine.kv_connector.settle.settle`), telling each import's caller how its copy ended
(a future per import: the end, None when the request was aborted first). At shutdown
:meth:`AttachedConnectors.close` fails the callers still waiting and waits, bounded, for
cancelled pulls to stop writing so their held blocks go back to the pool. Every method but the
wake-up runs on the engine thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from core.errors import UnavailableError
from engine.engine import LLMEngine
from engine.kv_connector.base import ImportEnded, KVConnector
from engine.kv_connector.settle import settle
from engine.outputs import RequestOutput

logger = logging.getLogger(__name__)

_CLOSE_WAIT_S = 5.0  # at shutdown, how long cancelled pulls may take to stop writing


@dataclass
class _Import:
    ended: Future[ImportEnded | None]
    recompute_on_failure: bool


class AttachedConnectors:
    """The connectors of ``engine``; ``wake()`` (any thread) asks its thread to settle."""

    def __init__(self, engine: LLMEngine, wake: Callable[[], None]) -> None:
        self._engine = engine
        self._wake = wake
        self._connectors: tuple[KVConnector, ...] = ()
        self._imports: dict[str, _Import] = {}
        self._ended = threading.Event()  # set on every wake-up (the bounded close waits on it)

    def attach(self, connector: KVConnector) -> None:
        """Drive ``connector`` from now on."""
        self._engine.scheduler.kv.register_before_free(connector.before_free)
        connector.set_wake(self._on_wake)
        self._connectors = (*self._connectors, connector)

    def check(self, connector: KVConnector) -> None:
        """Raise ``ValueError`` unless ``connector`` is attached (a request through another
        would wait forever)."""
        if connector not in self._connectors:
            raise ValueError("this KV connector is not attached to the engine (attach_connector)")

    def add_import(
        self, request_id: str, ended: Future[ImportEnded | None], recompute_on_failure: bool
    ) -> None:
        """Follow an import just handed to a connector: ``ended`` gets how it ends."""
        self._imports[request_id] = _Import(ended, recompute_on_failure)

    def start_transfers(self) -> None:
        """Before a step (and after commands): start what the connectors were asked for."""
        for connector in self._connectors:
            connector.start_transfers()

    def settle(self) -> list[RequestOutput] | None:
        """Apply what every connector reports ended, telling each import's caller; the outputs
        of imports ended at once, or None when nothing ended."""
        outputs: list[RequestOutput] | None = None
        for connector in self._connectors:
            finished = connector.take_finished()
            if finished.is_empty:
                continue
            settled = settle(self._engine, finished, may_recompute=self._may_recompute)
            outputs = (outputs or []) + settled
            for ended in finished.imports:
                self.end_import(ended.request_id, ended)
        return outputs

    def end_import(self, request_id: str, ended: ImportEnded | None) -> None:
        """Tell the import's caller how it ended (None: aborted); a no-op for other requests."""
        record = self._imports.pop(request_id, None)
        if record is not None and not record.ended.done():
            record.ended.set_result(ended)

    def close(self, reason: str) -> None:
        """At shutdown, after every request was aborted: fail the callers still waiting, then
        settle until every cancelled pull stopped writing its held blocks (bounded; a pull still
        writing after that keeps its blocks)."""
        for record in self._imports.values():
            if not record.ended.done():
                record.ended.set_exception(UnavailableError(reason))
        self._imports.clear()
        kv = self._engine.scheduler.kv
        deadline_s = time.monotonic() + _CLOSE_WAIT_S
        while self._connectors:
            self._ended.clear()  # NOTE: before taking, so an end after the take sets it again
            for connector in self._connectors:
                settle(self._engine, connector.take_finished(), may_recompute=lambda _: False)
            left_s = deadline_s - time.monotonic()
            if not kv.num_held_blocks or left_s <= 0:
                break
            self._ended.wait(left_s)
        if kv.num_held_blocks:
            logger.warning("%d KV blocks still written by cancelled pulls", kv.num_held_blocks)

    def _may_recompute(self, request_id: str) -> bool:
        record = self._imports.get(request_id)
        return record is None or record.recompute_on_failure

    def _on_wake(self) -> None:
        self._ended.set()
        self._wake()
