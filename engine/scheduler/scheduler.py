"""The continuous-batching scheduler: which tokens of which requests run in the next step.

Tensor-free (vLLM v1 style): :meth:`Scheduler.schedule` returns a :class:`SchedulerOutput`, the
runner computes it, and :meth:`Scheduler.update_from_output` takes the sampled token ids back.
The scheduler owns every request — which of :class:`~engine.scheduler.queue.RequestQueues`'
collections it sits in, and its blocks — from ``add_request`` to its end, and hands the parts of
the work to collaborators sharing them: :class:`~engine.scheduler.step_planner.StepPlanner`
plans each step, :class:`~engine.scheduler.tier_loading.TierLoading` looks up and loads back
the KV tiers under the device pool (a do-nothing one when there are none),
:mod:`~engine.scheduler.step_results` applies computed steps (at once, or in two halves for
overlapped steps), and :class:`~engine.scheduler.kv_imports.KVImports` takes the decode side's
imports. A prefill-only
request ends pinned (``FINISHED_PREFILL``), keeping its blocks until :meth:`Scheduler.release`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from core.config import EngineConfig
from core.errors import (
    InvalidRequestError,
    KVCacheError,
    PromptTooLongError,
    SamplingParamsError,
)
from core.stats import KVTierStats
from engine.kv.event_publisher import KVEventCallback, KVEventPublisher
from engine.kv.kv_cache_manager import KVCacheManager
from engine.request import FinishReason, Request, RequestStatus
from engine.scheduler.kv_import_loads import ImportOutcome
from engine.scheduler.kv_imports import KVImports
from engine.scheduler.output import (
    ImportAllocation,
    PinnedBlocks,
    RequestUpdate,
    SchedulerOutput,
    SchedulerStats,
)
from engine.scheduler.queue import RequestQueues
from engine.scheduler.step_planner import StepPlanner
from engine.scheduler.step_results import OverlappedStepResults, PlainStepResults
from engine.scheduler.stop_tokens import check_stop
from engine.scheduler.tier_loading import tier_loading

if TYPE_CHECKING:
    import torch

    from engine.kv.tiers.store import KVTiers

logger = logging.getLogger(__name__)


class Scheduler:
    """Decides each engine step and owns every request's KV blocks.

    ``num_blocks`` counts the storage's blocks including the null block 0. ``max_model_len``
    (prompt + output tokens) is capped to what the pool can hold for one request, so a request
    running alone always fits. ``kv_event_callback`` receives numbered ``KVEventBatch`` es.

    ``async_scheduling`` (overlapped steps): :meth:`schedule` counts a plan as computed at
    once and each sampling request as holding one token still on the device (a placeholder), so
    the next plan can be made before this one's tokens are known; :meth:`update_from_output`
    then only fills the placeholders in. Without it a plan takes effect in the update.
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
        async_scheduling: bool = False,
    ) -> None:
        self.block_size = config.block_size
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_num_seqs = config.max_num_seqs
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
        """The engine's lower KV tiers (``None`` without), for inspection only; a gang adds its
        ranks through :meth:`reach_tp_ranks`."""
        self._tier_loading = tier_loading(tiers, self.kv, self.events)
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
        self._imports = KVImports(
            self.kv,
            self._queues,
            self._tier_loading,
            self.events,
            max_model_len=self.max_model_len,
            fail=lambda request: self._finish(request, RequestStatus.FINISHED_ERROR),
        )
        self._planner = StepPlanner(
            config, self.kv, self._queues, self._tier_loading, max_model_len=self.max_model_len
        )
        self.async_scheduling = async_scheduling
        results = OverlappedStepResults if async_scheduling else PlainStepResults
        self._results = results(
            self.kv,
            self._queues,
            max_model_len=self.max_model_len,
            sliding_window=sliding_window,  # every layer slides: decode frees blocks left behind
            finish=self._finish,
        )
        self._finished_ids: list[str] = []
        self._step_id = 0

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
        """Settle the loads that ended, then plan the next step
        (:class:`~engine.scheduler.step_planner.StepPlanner`)."""
        self._settle_tiers()
        scheduled, preempted = self._planner.plan()
        output = SchedulerOutput(
            step_id=self._step_id,
            scheduled=scheduled,
            finished_request_ids=self._finished_ids,
            preempted_request_ids=preempted,
        )
        self._step_id += 1
        self._finished_ids = []
        self._results.planned(scheduled)
        self.events.flush()
        return output

    # -- lower KV tiers -----------------------------------------------------------------------

    def reach_tp_ranks(self, rows: Sequence[torch.Tensor]) -> None:
        """Rank 0 of a tensor-parallel gang: the other ranks' KV block rows, in rank order, so
        the lower tiers save and load every rank's share of a block; nothing without tiers.
        Raises :class:`ConfigError` when the rows do not complete the gang alike."""
        if self.tiers is not None:
            self.tiers.device_blocks.add_ranks(rows)

    def _settle_tiers(self) -> None:
        """Apply the tiers' idle TTLs and settle finished loads (start of every step)."""
        num_expired = 0 if self.device_ttl_s is None else self.kv.pool.expire(self.device_ttl_s)
        self._tier_loading.expire(num_expired)
        for load in self._tier_loading.poll():
            self._settle_load(load.request_id, load.num_loaded)

    def _settle_load(self, request_id: str, num_loaded: int) -> None:
        queues = self._queues
        cancelled = queues.cancelled_loads.pop(request_id, None)
        if cancelled is not None:
            self.kv.free(request_id)
            queues.forget(cancelled)
            return
        if self._imports.has_load(request_id):
            self._imports.load_done(request_id, num_loaded)
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
        self._tier_loading.close()

    def wait_for_loads(self, timeout_s: float) -> None:
        """With nothing to step but loads in flight: wait for one to finish (bounded)."""
        if not self._queues.waiting and not self._queues.running:
            self._tier_loading.wait(timeout_s)

    # -- applying a step ---------------------------------------------------------------------

    def update_from_output(
        self,
        output: SchedulerOutput,
        sampled_token_ids: Mapping[str, int],
        num_accepted_drafts: Mapping[str, int] | None = None,
    ) -> list[RequestUpdate]:
        """Apply a computed step (:mod:`~engine.scheduler.step_results`): progress, full
        blocks cached, sampled tokens recorded, token-level stops. Requests aborted or finished
        since ``schedule`` are skipped. Returns one update per request that got a token.
        ``num_accepted_drafts``: for each verify row, how many of its drafts were accepted
        (missing: none); its update carries those drafts, then its sampled token."""
        updates = self._results.apply(output, sampled_token_ids, num_accepted_drafts or {})
        self.events.flush()
        return updates

    def set_draft_tokens(self, request_id: str, draft_token_ids: Sequence[int]) -> bool:
        """Speculative decoding: tokens guessed to follow a running request's tokens, for the
        next plan to verify (it may verify fewer: budget, ``max_tokens``, ``max_model_len``).
        False, and nothing kept, unless the request is running and decoding on plain steps."""
        request = self._queues.get(request_id)
        if (
            request is None
            or request.status is not RequestStatus.RUNNING
            or request.num_uncomputed_tokens != 1
            or request.num_output_placeholders
            or request.prefill_only
        ):
            return False
        request.draft_token_ids[:] = draft_token_ids
        return True

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
            self._imports.is_writing(request.request_id)
        )
        self._imports.forget(request.request_id)
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

    def add_import_request(self, request: Request, first_token_id: int | None) -> ImportAllocation:
        """Reserve blocks for a prompt whose KV will be written from outside, reusing locally
        cached prefix blocks (device hits, and blocks copied back from a host or disk tier);
        ``first_token_id`` was sampled by the prefill (None: a pipelined import learns it with
        the KV, :meth:`set_first_token`). The request waits (``WAITING_FOR_KV``) until
        :meth:`mark_kv_ready` or :meth:`mark_kv_failed` (and its tier load, if any, ended).
        Raises ``KVCacheError`` when the pool lacks the blocks now, ``InvalidRequestError`` when
        the first token already ends the request."""
        self._check_prompt_len(request)
        return self._imports.add(request, first_token_id)

    def set_first_token(self, request_id: str, token_id: int) -> RequestUpdate | None:
        """A pipelined import's first token, learnt with its KV. None while the request goes
        on; its final update when the token already ends it (then it is ended and freed)."""
        request = self._queues.importing.get(request_id)
        if request is None or request.output_token_ids:
            raise InvalidRequestError(
                f"request {request_id} is not an import waiting for its first token",
                param="first_token_id",
            )
        request.append_output_token(token_id)
        decision = check_stop(request, self.max_model_len)
        if decision is None:
            return None
        request.stop_reason = decision.stop_reason
        self._finish(request, decision.status)
        self.events.flush()
        return RequestUpdate.of(request, [])

    def mark_kv_ready(self, request_id: str) -> bool:
        """The imported KV is in place: cache its full blocks and queue the request at the head
        of the waiting queue as if its prompt was computed (once its tier load, if any, ended).
        False if it is not importing."""
        return self._imports.pull_done(request_id, ImportOutcome.READY)

    def mark_kv_failed(self, request_id: str, recompute: bool) -> bool:
        """The import failed: free its blocks, then either recompute the prompt locally (same
        output; the first token is kept) or end it with ``FinishReason.ERROR``. False if it is
        not importing."""
        outcome = ImportOutcome.RECOMPUTE if recompute else ImportOutcome.FAIL
        return self._imports.pull_done(request_id, outcome)

    # -- inspection ---------------------------------------------------------------------------

    def has_unfinished(self) -> bool:
        """True while any request waits, runs or waits for imported KV (pins do not count)."""
        return self._queues.has_unfinished()

    @property
    def num_running(self) -> int:
        """Requests running now."""
        return len(self._queues.running)

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
            num_preemptions_total=self._planner.num_preemptions_total,
            num_pending_prompt_tokens=sum(
                max(r.num_prompt_tokens - r.num_computed_tokens, 0)
                for r in (*self._queues.waiting, *self._queues.running)
            ),
            num_loading_kv=(
                len(self._queues.loading)
                + len(self._queues.cancelled_loads)
                + self._imports.num_writing()
            ),
            kv_tiers=self.tier_stats(),
            spec_decode=self._results.spec_decode.snapshot(),
        )

    def tier_stats(self) -> tuple[KVTierStats, ...]:
        """Every tier of this engine, device first: occupancy and counters."""
        pool = self.kv.pool
        return self._tier_loading.stats(
            pool.num_used_blocks + pool.num_evictable_blocks, pool.num_usable_blocks
        )

    def reset_prefix_cache(self) -> None:
        """Forget every cached block hash (e.g. after new weights); emits ``AllBlocksCleared``."""
        self.kv.reset_prefix_cache()
        self.events.flush()

    def check_integrity(self) -> None:
        """Raise ``KVCacheError`` unless the pool, the tables and the queues agree."""
        self.kv.check_integrity()
        self._tier_loading.check_integrity()
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
