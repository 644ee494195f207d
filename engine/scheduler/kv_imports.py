"""Decode-side imports: requests whose prompt KV is written into this engine from outside.

:meth:`KVImports.add` reserves blocks for the whole prompt — reusing device prefix hits and
starting a tier load of the blocks right after them that sit on host or disk — and parks the
request in ``importing``. The pull's end (:meth:`KVImports.pull_done`) and the tier load's end
(:meth:`KVImports.load_done`) come in either order (:class:`ImportLoads`); once both have, the
request goes to the head of the waiting queue, its prompt computed or to be recomputed, or —
when the pull failed for good — back to the scheduler, which ends it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from core.errors import InvalidRequestError, KVCacheError, PdserveError
from engine.kv.event_publisher import KVEventPublisher
from engine.kv.kv_cache_manager import ComputedBlocks, KVCacheManager
from engine.request import Request, RequestStatus
from engine.scheduler.kv_import_loads import ImportLoads, ImportOutcome
from engine.scheduler.output import ImportAllocation
from engine.scheduler.queue import RequestQueues
from engine.scheduler.stop_tokens import check_stop
from engine.scheduler.tier_loading import TierLoading

logger = logging.getLogger(__name__)


class KVImports:
    """The scheduler's importing requests, from reservation to the waiting queue.

    Shares the scheduler's queues, KV manager, tier loading and event publisher; ``fail`` is
    how the scheduler ends a request whose import failed for good.
    """

    def __init__(
        self,
        kv: KVCacheManager,
        queues: RequestQueues,
        tiers: TierLoading,
        events: KVEventPublisher,
        *,
        max_model_len: int,
        fail: Callable[[Request], None],
    ) -> None:
        self._kv = kv
        self._queues = queues
        self._tiers = tiers
        self._max_model_len = max_model_len
        self._events = events
        self._fail = fail
        self._loads = ImportLoads()

    def add(self, request: Request, first_token_id: int | None) -> ImportAllocation:
        """Reserve blocks for ``request``'s prompt and park it until its KV is in place (see
        ``Scheduler.add_import_request``); ``first_token_id`` None: it comes with the KV."""
        if first_token_id is None:
            computed = self._reserve(request)
        else:
            request.append_output_token(first_token_id)
            try:
                computed = self._reserve(request)
            except PdserveError:
                del request.output_token_ids[-1], request.all_token_ids[-1]  # leave it as given
                raise
        num_lower = self._load_prefix(request, len(computed.block_ids))
        request.num_cached_tokens = computed.num_tokens + num_lower * self._kv.block_size
        request.status = RequestStatus.WAITING_FOR_KV
        self._queues.importing[request.request_id] = request
        self._events.flush()
        return ImportAllocation(
            request_id=request.request_id,
            block_ids=self._kv.block_ids(request.request_id),
            num_local_blocks=len(computed.block_ids) + num_lower,
        )

    def _reserve(self, request: Request) -> ComputedBlocks:
        if request.output_token_ids and check_stop(request, self._max_model_len) is not None:
            raise InvalidRequestError(
                f"request {request.request_id}: its first token already ends it; nothing to decode",
                param="first_token_id",
            )
        kv = self._kv
        computed = kv.get_computed_blocks(request, request.num_prompt_tokens)
        self._queues.register(request)
        if not kv.allocate_slots(
            request, request.num_prompt_tokens - computed.num_tokens, computed
        ):
            self._queues.forget(request)
            raise KVCacheError(
                f"request {request.request_id}: no room to import "
                f"{request.num_prompt_tokens} prompt tokens "
                f"({kv.num_free_blocks} free blocks of {kv.block_size} tokens)"
            )
        return computed

    def _load_prefix(self, request: Request, first: int) -> int:
        """Start copying the blocks after the device hit back from a lower tier; returns how
        many (the pull skips them)."""
        kv = self._kv
        if not kv.enable_prefix_caching:
            return 0
        hashes = kv.block_hashes(request, request.num_prompt_tokens // kv.block_size)
        num_lower = self._tiers.find(hashes[first:])
        if num_lower:
            table = kv.block_ids(request.request_id)
            self._tiers.start_load(
                request.request_id, hashes[first : first + num_lower], table[first:][:num_lower]
            )
            self._loads.start(request.request_id, num_lower)
        return num_lower

    # -- the two ends ---------------------------------------------------------------------------

    def pull_done(self, request_id: str, outcome: ImportOutcome) -> bool:
        """The pull into an importing request ended with ``outcome``; the request moves on at
        once unless its tier load still writes. False if ``request_id`` is not importing."""
        request = self._queues.importing.get(request_id)
        if request is None:
            return False
        if outcome is not ImportOutcome.FAIL and not request.output_token_ids:
            # NOTE: its first token never arrived: ready KV could not be decoded from, and a
            # recompute would sample (and stream) a first token the client already has
            raise InvalidRequestError(
                f"request {request_id}: an import whose first token is unknown can only fail",
                param="first_token_id",
            )
        if request_id in self._loads:
            settled = self._loads.pull_done(request_id, outcome)
            if settled is None:
                return True  # the tier load still writes; it settles the import when it ends
            outcome = settled
        self._settle(request_id, outcome)
        return True

    def load_done(self, request_id: str, num_loaded: int) -> None:
        """The tier load into an import's leading blocks ended with ``num_loaded`` blocks."""
        outcome = self._loads.load_done(request_id, num_loaded)
        if outcome is not None:
            self._settle(request_id, outcome)

    def _settle(self, request_id: str, outcome: ImportOutcome) -> None:
        request = self._queues.importing[request_id]
        if outcome is ImportOutcome.FAIL:
            self._fail(request)  # the scheduler detaches and frees it
            return
        del self._queues.importing[request_id]
        if outcome is ImportOutcome.READY:
            request.num_computed_tokens = request.num_prompt_tokens
            self._kv.cache_full_blocks(request)
        else:
            self._kv.free(request_id)
            logger.info("request %s: KV import failed, recomputing locally", request_id)
        request.status = RequestStatus.WAITING
        self._queues.waiting.appendleft(request)
        self._events.flush()

    # -- tier loads in flight -------------------------------------------------------------------

    def has_load(self, request_id: str) -> bool:
        """True while the import has a tier load whose outcome is not settled."""
        return request_id in self._loads

    def is_writing(self, request_id: str) -> bool:
        """True while a tier load still copies into the import's blocks."""
        return self._loads.is_writing(request_id)

    def num_writing(self) -> int:
        """Imports whose tier load has not ended."""
        return self._loads.num_writing()

    def forget(self, request_id: str) -> None:
        """The request ended another way (aborted): drop its load's bookkeeping."""
        self._loads.forget(request_id)
