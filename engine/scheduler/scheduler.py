"""The continuous-batching scheduler: which tokens of which requests run in the next step.

Tensor-free (vLLM v1 style): :meth:`Scheduler.schedule` returns a :class:`SchedulerOutput`, the
runner computes it, and :meth:`Scheduler.update_from_output` takes the sampled token ids back.
A step's plan, in order:

1. **Running** requests in arrival order. A decode costs one token; a partly computed prompt
   gets ``min(remaining, budget - decodes still to come)`` tokens, so decodes of running
   requests are never starved by a long prefill (chunked prefill). With
   ``long_prefill_token_threshold`` a prompt's chunk is capped at it (admission too), which
   leaves the rest of the budget to other prompts.
2. If that needs a block the pool lacks, the **latest-arrived** running request is preempted
   (blocks freed, ``num_computed_tokens`` reset, back to the head of the waiting queue) —
   repeatedly, down to the request itself. Earlier requests therefore always progress.
3. If nothing was preempted, **waiting** requests are admitted first come first served while
   ``max_num_seqs`` and the token budget allow and the pool has the blocks for their next chunk
   (after reusing cached prefix blocks); the first one that does not fit stops admission.

The disaggregation hooks (prefill-only pins and KV imports) live here too because they move
requests between the same queues under the same invariants (a request is in exactly one queue;
its blocks are freed exactly once): splitting them out would spread those invariants over
several files, so this module is past 400 lines for that reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from core.config import EngineConfig
from core.errors import (
    InvalidRequestError,
    KVCacheError,
    PdserveError,
    PromptTooLongError,
    SamplingParamsError,
)
from core.stats import KVTierStats
from engine.kv.event_publisher import KVEventCallback, KVEventPublisher
from engine.kv.kv_cache_manager import NO_HIT, ComputedBlocks, KVCacheManager
from engine.kv.tiers.counters import TierCounters
from engine.request import FinishReason, Request, RequestStatus
from engine.scheduler.chunk_plan import record_chunk, recorded_hit, recorded_span
from engine.scheduler.import_loads import ImportLoads, ImportOutcome
from engine.scheduler.output import (
    ImportAllocation,
    PinnedBlocks,
    RequestUpdate,
    ScheduledRequest,
    SchedulerOutput,
    SchedulerStats,
)
from engine.scheduler.queue import RequestQueues
from engine.scheduler.stop import check_stop

if TYPE_CHECKING:
    from engine.kv.tiers.store import KVTiers

logger = logging.getLogger(__name__)


class Scheduler:
    """Decides each engine step and owns every request's KV blocks.

    ``num_blocks`` counts the storage's blocks including the null block 0. ``max_model_len``
    (prompt + output tokens) is capped to what the pool can hold for one request, so a request
    running alone always fits. ``kv_event_callback`` receives numbered ``KVEventBatch`` es.
    """

    def __init__(
        self,
        config: EngineConfig,
        num_blocks: int,
        *,
        max_model_len: int,
        kv_event_callback: KVEventCallback | None = None,
        tiers: KVTiers | None = None,
        clock: Callable[[], float] = time.monotonic,
        sliding_window: int | None = None,
    ) -> None:
        self.block_size = config.block_size
        # every layer slides over this many positions: decode frees blocks left behind
        self.sliding_window = sliding_window
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_num_seqs = config.max_num_seqs
        self.max_prefill_chunk = (
            config.long_prefill_token_threshold or config.max_num_batched_tokens
        )
        self.events = KVEventPublisher(kv_event_callback)
        self.kv = KVCacheManager(
            num_blocks,
            config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
            hash_seed=config.hash_seed,
            publisher=self.events,
            clock=clock,
        )
        self.device_ttl_s = config.kv_tiers.device_ttl_s
        self.max_keep_alive_s = config.kv_tiers.max_keep_alive_s
        self.tiers = tiers
        if tiers is not None:
            tiers.attach(self.events)
            self.kv.pool.on_evict = tiers.moves.on_device_evicted
            self.kv.on_cached = tiers.moves.on_device_cached
        # NOTE: the last token of a sequence never needs KV, so a lone request of
        # capacity + 1 tokens fits the whole pool.
        capacity_tokens = self.kv.pool.num_usable_blocks * config.block_size + 1
        if capacity_tokens < max_model_len:
            logger.warning(
                "max_model_len %d exceeds what the KV cache holds for one request (%d tokens); "
                "capping it",
                max_model_len,
                capacity_tokens,
            )
        self.max_model_len = min(max_model_len, capacity_tokens)
        self._len_limit_note = "" if max_model_len <= capacity_tokens else ", capped by KV cache"
        self._queues = RequestQueues()
        self._import_loads = ImportLoads()
        self._finished_ids: list[str] = []
        self._step_id = 0
        self._num_preemptions_total = 0
        self._overshoot = False
        """True once a recorded chunk took more than the step's room (one per step)."""

    # -- admission ----------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a new request; raises ``PromptTooLongError`` unless one token fits after the
        prompt, ``InvalidRequestError`` on a duplicate id."""
        self._check_prompt_len(request)
        self._queues.register(request)
        request.status = RequestStatus.WAITING
        self._queues.waiting.append(request)
        logger.debug(
            "request %s queued (%d prompt tokens)", request.request_id, request.num_prompt_tokens
        )

    def _check_prompt_len(self, request: Request) -> None:
        keep_s = request.sampling_params.kv_keep_alive_s
        if keep_s is not None and keep_s > self.max_keep_alive_s:
            raise SamplingParamsError(
                f"request {request.request_id}: kv_keep_alive_s={keep_s:g} exceeds this "
                f"server's engine.kv_tiers.max_keep_alive_s={self.max_keep_alive_s:g}",
                param="kv_keep_alive_s",
            )
        if request.num_prompt_tokens >= self.max_model_len:
            raise PromptTooLongError(
                f"request {request.request_id}: prompt of {request.num_prompt_tokens} tokens "
                f"leaves no room to generate within max_model_len={self.max_model_len} "
                f"(the prompt must be shorter than max_model_len{self._len_limit_note})",
                param="prompt",
            )

    # -- one step -----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Plan the next step (see the module docstring)."""
        self._overshoot = False
        self._tier_housekeeping()
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []
        budget = self._schedule_running(self.max_num_batched_tokens, scheduled, preempted)
        if not preempted:
            self._schedule_waiting(budget, scheduled)
        output = SchedulerOutput(
            step_id=self._step_id,
            scheduled=scheduled,
            finished_request_ids=self._finished_ids,
            preempted_request_ids=preempted,
        )
        self._step_id += 1
        self._finished_ids = []
        self.events.flush()
        return output

    def _schedule_running(
        self, budget: int, scheduled: list[ScheduledRequest], preempted: list[str]
    ) -> int:
        running = self._queues.running
        decodes_left = sum(1 for r in running if r.num_uncomputed_tokens == 1)
        index = 0
        while index < len(running) and (budget > 0 or self._overshoot):
            request = running[index]
            remaining = request.num_uncomputed_tokens
            if remaining == 1:
                decodes_left -= 1
                num_new = 1
            else:
                num_new = min(remaining, budget - decodes_left, self.max_prefill_chunk)
                num_new = self._follow_recorded_chunk(request, num_new, budget - decodes_left)
            if num_new <= 0:
                index += 1
                continue
            num_preempted = len(preempted)
            if not self._allocate_or_preempt(request, num_new, preempted):
                break  # the request preempted itself; it was the last one running
            if len(preempted) > num_preempted:  # victims may have been counted decodes
                decodes_left = sum(1 for r in running[index + 1 :] if r.num_uncomputed_tokens == 1)
            scheduled.append(self._plan(request, num_new))
            budget -= num_new
            index += 1
        return budget

    def _allocate_or_preempt(self, request: Request, num_new: int, preempted: list[str]) -> bool:
        while not self.kv.allocate_slots(request, num_new):
            victim = self._queues.pop_latest_running()
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.kv.free(request.request_id)
        request.num_computed_tokens = 0
        request.prompt_chunk_ends.clear()
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self._num_preemptions_total += 1
        self._queues.waiting.appendleft(request)
        logger.info(
            "request %s preempted (%d tokens to recompute)", request.request_id, request.num_tokens
        )

    def _schedule_waiting(self, budget: int, scheduled: list[ScheduledRequest]) -> None:
        queues = self._queues
        while (
            queues.waiting
            and budget > 0
            and len(queues.running) + len(queues.loading) < self.max_num_seqs
        ):
            request = queues.waiting[0]
            computed: ComputedBlocks = NO_HIT
            # NOTE: a request asking for prompt logprobs computes every prompt position
            wants_all = request.sampling_params.prompt_logprobs is not None
            if request.num_computed_tokens == 0 and not wants_all:  # look for a cached prefix
                computed = self.kv.get_computed_blocks(request, request.num_tokens - 1)
                num_lower = self._lower_tier_hit(request, computed)
                computed = recorded_hit(request, computed, self.block_size)
                if num_lower:
                    if not self._start_load(request, computed, num_lower):
                        break
                    continue
            remaining = request.num_uncomputed_tokens - computed.num_tokens
            num_new = min(remaining, budget, self.max_prefill_chunk)
            num_new = self._follow_recorded_chunk(request, num_new, budget, computed.num_tokens)
            if num_new <= 0:
                break
            if not self.kv.allocate_slots(request, num_new, computed):
                break
            queues.waiting.popleft()
            self._adopt_hit(request, computed)
            request.status = RequestStatus.RUNNING
            queues.add_running(request)
            scheduled.append(self._plan(request, num_new))
            budget -= num_new

    def _adopt_hit(self, request: Request, computed: ComputedBlocks) -> None:
        request.num_computed_tokens += computed.num_tokens
        if request.num_cached_tokens is None:
            request.num_cached_tokens = computed.num_tokens
        if self.tiers is not None and computed.block_ids:
            self.tiers.moves.on_device_hit(request.block_hashes[: len(computed.block_ids)])

    # -- lower KV tiers -----------------------------------------------------------------------

    def _lower_tier_hit(self, request: Request, computed: ComputedBlocks) -> int:
        """Blocks after the device hit found in host/disk tiers (whole recorded chunks only)."""
        if self.tiers is None or not self.kv.enable_prefix_caching or request.follow_chunk_ends:
            return 0
        start = len(computed.block_ids)
        hashes = self.kv.block_hashes(request, (request.num_tokens - 1) // self.block_size)
        return self.tiers.find(hashes[start:])

    def _start_load(self, request: Request, computed: ComputedBlocks, num_lower: int) -> bool:
        """Hold blocks for the device hit plus ``num_lower`` blocks and start copying them back;
        the request waits in ``loading`` (the batch keeps stepping). False: no room now."""
        assert self.tiers is not None
        if not self.kv.allocate_slots(request, num_lower * self.block_size, computed):
            return False
        self._queues.waiting.popleft()
        self._adopt_hit(request, computed)
        first = len(computed.block_ids)
        table = self.kv.block_ids(request.request_id)
        self.tiers.start_load(
            request.request_id,
            request.block_hashes[first : first + num_lower],
            table[first : first + num_lower],
        )
        request.status = RequestStatus.LOADING_KV
        self._queues.loading[request.request_id] = request
        return True

    def _tier_housekeeping(self) -> None:
        """Settle finished loads and apply the tiers' idle TTLs (start of every step)."""
        if self.device_ttl_s is not None:
            expired = self.kv.pool.expire(self.device_ttl_s)
            if self.tiers is not None:
                for _ in range(expired):
                    self.tiers.moves.count_device_expiry()
        if self.tiers is None:
            return
        self.tiers.moves.expire()
        for load in self.tiers.poll():
            self._settle_load(load.request_id, load.num_loaded)

    def _settle_load(self, request_id: str, num_loaded: int) -> None:
        queues = self._queues
        cancelled = queues.cancelled_loads.pop(request_id, None)
        if cancelled is not None:
            self.kv.free(request_id)
            queues.forget(cancelled)
            return
        if request_id in self._import_loads:
            outcome = self._import_loads.load_done(request_id, num_loaded)
            if outcome is not None:
                self._end_import(request_id, outcome)
            return
        request = queues.loading.pop(request_id)
        request.num_computed_tokens += num_loaded * self.block_size
        request.num_cached_tokens = request.num_computed_tokens
        if request.num_computed_tokens == 0:
            self.kv.free(request_id)  # nothing usable came back: start clean
        self.kv.cache_full_blocks(request)
        request.status = RequestStatus.WAITING
        queues.waiting.appendleft(request)

    def close(self) -> None:
        """Stop the KV tiers' I/O (after pending writes and the loads in flight)."""
        if self.tiers is not None:
            self.tiers.close()

    def wait_for_loads(self, timeout_s: float) -> None:
        """With nothing to step but loads in flight: wait for one to finish (bounded)."""
        if self.tiers is not None and not self._queues.waiting and not self._queues.running:
            self.tiers.wait(timeout_s)

    def _follow_recorded_chunk(
        self, request: Request, num_new: int, room: int, num_hit: int = 0
    ) -> int:
        """``num_new`` for a request following recorded chunk ends: exactly the tokens up to
        the next recorded end. A chunk that does not fit ``room`` takes the step's one overshoot
        (at most ``max_num_batched_tokens`` more tokens in that step) or waits a step."""
        span = recorded_span(request, request.num_computed_tokens + num_hit)
        if span is None or span > self.max_num_batched_tokens:
            return num_new
        if span <= room:
            return span
        if self._overshoot:
            return 0
        self._overshoot = True
        return span

    def _plan(self, request: Request, num_new: int) -> ScheduledRequest:
        start = request.num_computed_tokens
        return ScheduledRequest(
            request_id=request.request_id,
            token_ids=request.all_token_ids[start : start + num_new],
            start_position=start,
            block_ids=self.kv.block_ids(request.request_id),
            samples_token=start + num_new == request.num_tokens,
            sampling_params=request.sampling_params,
            num_output_tokens=request.num_output_tokens,
        )

    def update_from_output(
        self, output: SchedulerOutput, sampled_token_ids: Mapping[str, int]
    ) -> list[RequestUpdate]:
        """Apply a computed step: advance progress, cache full blocks, append sampled tokens
        and apply token-level stops. Requests aborted or finished since ``schedule`` are
        skipped. Returns one update per request that got a token."""
        updates: list[RequestUpdate] = []
        for item in output.scheduled:
            request = self._queues.get(item.request_id)
            if (
                request is None
                or request.status is not RequestStatus.RUNNING
                or request.num_computed_tokens != item.start_position
            ):
                continue
            if item.start_position < request.num_prompt_tokens:
                record_chunk(request, item.start_position, item.end_position)
            request.num_computed_tokens = item.end_position
            self.kv.cache_full_blocks(request)
            if self.sliding_window is not None and not request.prefill_only:
                self._release_behind_window(request, self.sliding_window)
            if item.samples_token:
                updates.append(self._append_token(request, _sampled(sampled_token_ids, item)))
        self.events.flush()
        return updates

    def _release_behind_window(self, request: Request, window: int) -> None:
        """Free the blocks no later query of ``request`` reads: the next token (at position
        ``num_computed_tokens``) sees keys from ``num_computed_tokens - window + 1`` on. Only
        once its prompt is computed: a prefill keeps (and exports) its whole prompt."""
        if request.num_computed_tokens < request.num_prompt_tokens:
            return
        first_needed = request.num_computed_tokens - window + 1
        if first_needed >= self.block_size:
            self.kv.release_leading(request.request_id, first_needed // self.block_size)

    def _append_token(self, request: Request, token_id: int) -> RequestUpdate:
        request.append_output_token(token_id)
        decision = check_stop(request, self.max_model_len)
        if decision is not None:
            request.stop_reason = decision.stop_reason
            self._finish(request, decision.status)
        elif request.prefill_only:
            self._finish(request, RequestStatus.FINISHED_PREFILL)
        return _update_of(request, [token_id])

    # -- ending requests ----------------------------------------------------------------------

    def finish(
        self, request_id: str, reason: FinishReason, stop_reason: int | str | None = None
    ) -> bool:
        """End a request for a reason decided outside (a stop string, a client going away);
        frees its blocks, pinned ones included. False when it is unknown or already ended."""
        request = self._queues.get(request_id)
        if request is None or (
            request.is_finished and request.status is not RequestStatus.FINISHED_PREFILL
        ):
            return False
        request.stop_reason = stop_reason
        self._finish(request, RequestStatus.finished_with(reason))
        return True

    def abort(self, request_id: str) -> bool:
        """Abort a waiting, running, importing, loading or pinned request; frees its blocks at
        once (a loading request's once the copy into them has finished)."""
        return self.finish(request_id, FinishReason.ABORT)

    def _finish(self, request: Request, status: RequestStatus) -> None:
        was_finished = request.is_finished
        was_loading = request.status is RequestStatus.LOADING_KV or (
            self._import_loads.is_writing(request.request_id)
        )
        self._import_loads.forget(request.request_id)
        self._queues.detach(request)
        request.status = status
        if was_loading:  # a copy is still writing its blocks: free them once it is done
            self._queues.cancelled_loads[request.request_id] = request
        elif status is RequestStatus.FINISHED_PREFILL:
            self._queues.pinned[request.request_id] = request
        else:
            self.kv.free(request.request_id, keep_s=request.sampling_params.kv_keep_alive_s or 0.0)
            self._queues.forget(request)
        if not was_finished:
            self._finished_ids.append(request.request_id)
        logger.debug("request %s ended: %s", request.request_id, status.value)

    # -- disaggregation: prefill-only pins ----------------------------------------------------

    def get_pinned_blocks(self, request_id: str) -> PinnedBlocks | None:
        """The pinned KV of a finished prefill-only request (``None`` if not pinned)."""
        request = self._queues.pinned.get(request_id)
        if request is None:
            return None
        num_tokens = request.num_computed_tokens
        return PinnedBlocks(
            request_id=request_id,
            block_ids=self.kv.block_ids(request_id),
            block_hashes=self.kv.block_hashes(request, num_tokens // self.block_size),
            num_tokens=num_tokens,
            first_token_id=request.output_token_ids[0],
            prompt_chunk_ends=tuple(request.prompt_chunk_ends),
        )

    def release(self, request_id: str) -> bool:
        """Free a pinned request's blocks. Idempotent: False (and nothing done) when the id is
        not pinned — unknown, already released, or not a finished prefill-only request."""
        request = self._queues.pinned.pop(request_id, None)
        if request is None:
            return False
        self.kv.free(request_id, keep_s=request.sampling_params.kv_keep_alive_s or 0.0)
        self._queues.forget(request)
        return True

    # -- disaggregation: imports --------------------------------------------------------------

    def add_import_request(self, request: Request, first_token_id: int) -> ImportAllocation:
        """Reserve blocks for a prompt whose KV will be written from outside, reusing locally
        cached prefix blocks (device hits, and blocks copied back from a host or disk tier);
        ``first_token_id`` was sampled by the prefill. The request waits (``WAITING_FOR_KV``)
        until :meth:`mark_kv_ready` or :meth:`mark_kv_failed` (and its tier load, if any,
        ended). Raises ``KVCacheError`` when the pool lacks the blocks now,
        ``InvalidRequestError`` when the first token already ends the request."""
        self._check_prompt_len(request)
        request.append_output_token(first_token_id)
        try:
            computed = self._reserve_import(request)
        except PdserveError:
            del request.output_token_ids[-1], request.all_token_ids[-1]  # leave it as given
            raise
        num_lower = self._load_import_prefix(request, len(computed.block_ids))
        request.num_cached_tokens = computed.num_tokens + num_lower * self.block_size
        request.status = RequestStatus.WAITING_FOR_KV
        self._queues.importing[request.request_id] = request
        self.events.flush()
        return ImportAllocation(
            request_id=request.request_id,
            block_ids=self.kv.block_ids(request.request_id),
            num_local_blocks=len(computed.block_ids) + num_lower,
        )

    def _reserve_import(self, request: Request) -> ComputedBlocks:
        if check_stop(request, self.max_model_len) is not None:
            raise InvalidRequestError(
                f"request {request.request_id}: its first token already ends it; nothing to decode",
                param="first_token_id",
            )
        computed = self.kv.get_computed_blocks(request, request.num_prompt_tokens)
        self._queues.register(request)
        if not self.kv.allocate_slots(
            request, request.num_prompt_tokens - computed.num_tokens, computed
        ):
            self._queues.forget(request)
            raise KVCacheError(
                f"request {request.request_id}: no room to import "
                f"{request.num_prompt_tokens} prompt tokens "
                f"({self.kv.num_free_blocks} free blocks of {self.block_size} tokens)"
            )
        return computed

    def _load_import_prefix(self, request: Request, first: int) -> int:
        """Start copying the import's blocks after its device hit back from a lower tier;
        returns how many (the pull skips them)."""
        if self.tiers is None or not self.kv.enable_prefix_caching:
            return 0
        hashes = self.kv.block_hashes(request, request.num_prompt_tokens // self.block_size)
        num_lower = self.tiers.find(hashes[first:])
        if num_lower:
            table = self.kv.block_ids(request.request_id)
            self.tiers.start_load(
                request.request_id, hashes[first : first + num_lower], table[first:][:num_lower]
            )
            self._import_loads.start(request.request_id, num_lower)
        return num_lower

    def mark_kv_ready(self, request_id: str) -> bool:
        """The imported KV is in place: cache its full blocks and queue the request at the head
        of the waiting queue as if its prompt was computed (once its tier load, if any, ended).
        False if it is not importing."""
        if request_id not in self._queues.importing:
            return False
        self._pull_done(request_id, ImportOutcome.READY)
        return True

    def mark_kv_failed(self, request_id: str, recompute: bool) -> bool:
        """The import failed: free its blocks, then either recompute the prompt locally (same
        output; the first token is kept) or end it with ``FinishReason.ERROR``. False if it is
        not importing."""
        if request_id not in self._queues.importing:
            return False
        self._pull_done(request_id, ImportOutcome.RECOMPUTE if recompute else ImportOutcome.FAIL)
        return True

    def _pull_done(self, request_id: str, outcome: ImportOutcome) -> None:
        if request_id in self._import_loads:
            settled = self._import_loads.pull_done(request_id, outcome)
            if settled is None:
                return  # the tier load still writes; it settles the import when it ends
            outcome = settled
        self._end_import(request_id, outcome)

    def _end_import(self, request_id: str, outcome: ImportOutcome) -> None:
        request = self._queues.importing[request_id]
        if outcome is ImportOutcome.FAIL:
            self._finish(request, RequestStatus.FINISHED_ERROR)  # detaches and frees it
            return
        del self._queues.importing[request_id]
        if outcome is ImportOutcome.READY:
            request.num_computed_tokens = request.num_prompt_tokens
            self.kv.cache_full_blocks(request)
        else:
            self.kv.free(request_id)
            logger.info("request %s: KV import failed, recomputing locally", request_id)
        request.status = RequestStatus.WAITING
        self._queues.waiting.appendleft(request)
        self.events.flush()

    # -- inspection ---------------------------------------------------------------------------

    def has_unfinished(self) -> bool:
        """True while any request waits, runs or waits for imported KV (pins do not count)."""
        return self._queues.has_unfinished()

    def get_request(self, request_id: str) -> Request | None:
        """A tracked request (pinned ones included), for reading only."""
        return self._queues.get(request_id)

    def block_table(self, request_id: str) -> list[int]:
        """A copy of the request's block ids (empty when it holds none)."""
        return self.kv.block_ids(request_id)

    def stats(self) -> SchedulerStats:
        """Queue lengths and KV usage now."""
        pool = self.kv.pool
        return SchedulerStats(
            num_running=len(self._queues.running),
            num_waiting=len(self._queues.waiting),
            num_waiting_for_kv=len(self._queues.importing),
            num_pinned=len(self._queues.pinned),
            num_free_blocks=pool.num_free_blocks,
            num_used_blocks=pool.num_used_blocks,
            num_cached_blocks=pool.num_cached_blocks,
            kv_usage=pool.usage,
            num_preemptions_total=self._num_preemptions_total,
            num_pending_prompt_tokens=sum(
                max(r.num_prompt_tokens - r.num_computed_tokens, 0)
                for r in (*self._queues.waiting, *self._queues.running)
            ),
            num_loading_kv=(
                len(self._queues.loading)
                + len(self._queues.cancelled_loads)
                + self._import_loads.num_writing()
            ),
            kv_tiers=self.tier_stats(),
        )

    def tier_stats(self) -> tuple[KVTierStats, ...]:
        """Every tier of this engine, device first: occupancy and counters."""
        pool = self.kv.pool
        device = (
            self.tiers.counters["device"] if self.tiers is not None else TierCounters()
        ).stats("device", pool.num_used_blocks + pool.num_evictable_blocks, pool.num_usable_blocks)
        return (device, *(self.tiers.stats() if self.tiers is not None else ()))

    def reset_prefix_cache(self) -> None:
        """Forget every cached block hash (e.g. after new weights); emits ``AllBlocksCleared``."""
        self.kv.reset_prefix_cache()
        self.events.flush()

    def check_integrity(self) -> None:
        """Raise ``KVCacheError`` unless the pool, the tables and the queues agree."""
        self.kv.check_integrity()
        if self.tiers is not None:
            self.tiers.check_integrity()
        problems = self._queues.check_consistent()
        tables = self.kv.block_tables()
        for request_id, table in tables.items():
            request = self._queues.get(request_id)
            if request is None:
                problems.append(f"blocks {table} held by unknown request {request_id}")
            elif len(table) * self.block_size < request.num_computed_tokens:
                problems.append(f"request {request_id}'s table is shorter than its KV")
        for request in [
            *self._queues.running,
            *self._queues.pinned.values(),
            *self._queues.loading.values(),
        ]:
            if request.request_id not in tables:
                problems.append(f"request {request.request_id} holds no blocks")
        if problems:
            raise KVCacheError("scheduler integrity: " + "; ".join(problems))


def _sampled(sampled_token_ids: Mapping[str, int], item: ScheduledRequest) -> int:
    if item.request_id not in sampled_token_ids:
        raise ValueError(f"no sampled token for request {item.request_id}, which samples")
    return sampled_token_ids[item.request_id]


def _update_of(request: Request, new_token_ids: list[int]) -> RequestUpdate:
    return RequestUpdate(
        request_id=request.request_id,
        new_token_ids=new_token_ids,
        status=request.status,
        finish_reason=request.finish_reason,
        stop_reason=request.stop_reason,
        num_cached_tokens=request.num_cached_tokens or 0,
    )
