"""One :class:`~engine.engine.LLMEngine` with a :class:`~engine.kv_connector.base.KVConnector`
called at its named points (one thread: colocated serving, tests, the offline path).

The connector's ``before_free`` is registered on the engine's KV manager; a prefill-only
request added with :meth:`ConnectedEngine.add_export` reports its blocks through
:class:`~engine.kv_connector.export_progress.ExportProgress` as they complete; an import added
with :meth:`ConnectedEngine.add_import` hands its reserved blocks to the connector. Each
:meth:`ConnectedEngine.step` starts the transfers, steps the engine, reports the progress and
settles what the connector says ended (:mod:`engine.kv_connector.settle`, shared with
:class:`~engine.async_engine.AsyncEngine`): ready imports join the batch (learning their first
token when the export carried it), failed ones recompute (or fail, when their first token is
unknown), freed exports are unpinned, held blocks are freed once nothing writes them.
"""

from __future__ import annotations

from core.sampling import SamplingParams
from engine.engine import LLMEngine
from engine.kv_connector.base import KVConnector, KVConnectorFinished, KVImportSource
from engine.kv_connector.export_progress import ConnectorWatcher, ExportProgress
from engine.kv_connector.settle import settle
from engine.outputs import RequestOutput
from engine.scheduler.output import ImportAllocation


class ConnectedEngine:
    """Steps ``engine`` and drives ``connector`` around each step (one thread only)."""

    def __init__(self, engine: LLMEngine, connector: KVConnector) -> None:
        self.engine = engine
        self.connector = connector
        self._progress = ExportProgress(engine)
        engine.scheduler.kv.register_before_free(connector.before_free)

    def add_export(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        """Add a prefill-only request whose KV the connector exports as it completes."""
        self.engine.add_request(request_id, prompt_token_ids, params, prefill_only=True)
        self._progress.watch(request_id, ConnectorWatcher(self.connector, request_id))

    def add_import(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        source: KVImportSource,
        first_token_id: int | None = None,
    ) -> ImportAllocation:
        """Reserve blocks for a prompt whose KV the connector brings from ``source``."""
        allocation = self.engine.add_import_request(
            request_id, prompt_token_ids, params, first_token_id
        )
        self.connector.import_blocks(allocation, source)
        return allocation

    def step(self) -> list[RequestOutput]:
        """Start transfers, step the engine, report export progress, settle what ended."""
        self.connector.start_transfers()
        outputs = self.engine.step() if self.engine.has_unfinished() else []
        self._progress.report()
        return outputs + self.settle(self.connector.take_finished())

    def settle(self, finished: KVConnectorFinished) -> list[RequestOutput]:
        """Apply what the connector reports ended (:func:`~engine.kv_connector.settle.settle`);
        the outputs of imports that ended at once."""
        return settle(self.engine, finished)
