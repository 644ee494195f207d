"""One :class:`~engine.engine.LLMEngine` with a :class:`~engine.kv_connector.base.KVConnector`
called at its named points (one thread: colocated serving, tests, the offline path).

The connector's ``before_free`` is registered on the engine's KV manager; a prefill-only
request added with :meth:`ConnectedEngine.add_export` reports its blocks through
:class:`~engine.kv_connector.export_progress.ExportProgress` as they complete; an import added
with :meth:`ConnectedEngine.add_import` hands its reserved blocks to the connector. Each
:meth:`ConnectedEngine.step` starts the transfers, steps the engine, reports the progress and
settles what the connector says ended: ready imports join the batch (learning their first token
when the export carried it), failed ones recompute (or fail, when their first token is unknown),
freed exports are unpinned.
"""

from __future__ import annotations

from core.sampling import SamplingParams
from engine.engine import LLMEngine
from engine.kv_connector.base import (
    ImportEnded,
    ImportResult,
    KVConnector,
    KVConnectorFinished,
    KVImportSource,
)
from engine.kv_connector.export_progress import ExportProgress
from engine.outputs import RequestOutput
from engine.scheduler.output import ImportAllocation, PinnedBlocks


class _ConnectorWatcher:
    """An export watcher that forwards one request's progress to the connector."""

    def __init__(self, connector: KVConnector, request_id: str) -> None:
        self._connector = connector
        self._request_id = request_id

    def on_ready(self, block_ids: list[int]) -> None:
        self._connector.export_blocks(self._request_id, block_ids)

    def on_finished(self, pinned: PinnedBlocks) -> None:
        self._connector.export_finished(pinned)

    def on_lost(self) -> None:
        # a request that never held blocks is lost without passing the before-free listeners
        self._connector.before_free(self._request_id)


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
        self._progress.watch(request_id, _ConnectorWatcher(self.connector, request_id))

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
        """Apply what the connector reports ended; the outputs of imports that ended at once."""
        outputs: list[RequestOutput] = []
        for ended in finished.imports:
            output = self._settle_import(ended)
            if output is not None:
                outputs.append(output)
        for request_id in finished.freed_exports:
            self.engine.release(request_id)
        return outputs

    def _settle_import(self, ended: ImportEnded) -> RequestOutput | None:
        engine = self.engine
        request = engine.scheduler.get_request(ended.request_id)
        if request is None:
            return None  # aborted meanwhile
        knows_first = bool(request.output_token_ids)
        if ended.result is ImportResult.FAILED:
            # NOTE: without its first token a recompute would sample one the client never saw
            engine.mark_kv_failed(ended.request_id, recompute=knows_first)
            return None
        if not knows_first:
            if ended.first_token_id is None:
                engine.mark_kv_failed(ended.request_id, recompute=False)
                return None
            output = engine.accept_first_token(
                ended.request_id, ended.first_token_id, ended.prompt_chunk_ends
            )
            if output is not None:
                return output  # the first token ended it
        engine.mark_kv_ready(ended.request_id)
        return None
