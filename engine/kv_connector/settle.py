"""What a connector reports ended, applied to its engine (on the engine's own thread).

:func:`settle` is the one place a :class:`~engine.kv_connector.base.KVConnectorFinished` turns
into engine state, for :class:`~engine.kv_connector.connected_engine.ConnectedEngine` and
:class:`~engine.async_engine.AsyncEngine` alike: a ready import has its host-mirror blocks
uploaded to the device, learns its first token when the export carried it and joins the batch;
a failed one recomputes its prompt (when its first token is known and the caller allows it) or
ends; a freed export is unpinned; held blocks nothing writes any more go back to the pool.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from core.kv_handle import TransferFailure
from engine.engine import LLMEngine
from engine.kv_connector.base import ImportEnded, ImportResult, KVConnectorFinished
from engine.outputs import RequestOutput

logger = logging.getLogger(__name__)


def _always(request_id: str) -> bool:
    del request_id
    return True


def settle(
    engine: LLMEngine,
    finished: KVConnectorFinished,
    *,
    may_recompute: Callable[[str], bool] = _always,
) -> list[RequestOutput]:
    """Apply ``finished`` to ``engine``; the outputs of imports that ended at once (their first
    token ended them). ``may_recompute(request_id)``: whether a failed import with a known
    first token recomputes its prompt here (else it ends)."""
    for request_id in finished.stopped_writes:
        engine.scheduler.kv.release_held(request_id)
    outputs: list[RequestOutput] = []
    for ended in finished.imports:
        output = settle_import(engine, ended, may_recompute(ended.request_id))
        if output is not None:
            outputs.append(output)
    for request_id in finished.freed_exports:
        engine.release(request_id)
    return outputs


def settle_import(
    engine: LLMEngine, ended: ImportEnded, may_recompute: bool = True
) -> RequestOutput | None:
    """Apply one import's end; its final output when its first token ended it."""
    request = engine.scheduler.get_request(ended.request_id)
    if request is None:
        return None  # aborted meanwhile
    knows_first = bool(request.output_token_ids)
    if ended.result is ImportResult.READY and ended.host_block_ids:
        ended = _upload(engine, ended)
    if ended.result is ImportResult.FAILED:
        # NOTE: without its first token a recompute would sample one the client never saw
        engine.mark_kv_failed(ended.request_id, recompute=knows_first and may_recompute)
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


def _upload(engine: LLMEngine, ended: ImportEnded) -> ImportEnded:
    """Stage the pulled host-mirror blocks to the device; a failure fails the import."""
    try:
        engine.parts.storage.stage_to_device(list(ended.host_block_ids))
    except Exception as e:
        logger.exception("request %s: staging its pulled KV to the device failed", ended.request_id)
        return dataclasses.replace(
            ended, result=ImportResult.FAILED, failure=TransferFailure.INTERNAL, message=repr(e)
        )
    return ended
