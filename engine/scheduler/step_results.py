"""How a computed step reaches its requests: all at once (plain steps) or in two halves
(overlapped steps, ``engine.async_scheduling``).

Plain: a plan takes effect when its sampled ids come back — progress advances, new tokens are
appended. Overlapped: the next plan is made before this one's ids are known, so the plan counts
as computed the moment it is made and each sampling request holds a placeholder token
(:attr:`~engine.request.Request.num_output_placeholders`); the ids fill the placeholders later.
Either way the update then offers the blocks now full of known tokens to the prefix cache,
frees the blocks a sliding window left behind, and applies the token-level stops.

A verify row (speculative decoding, plain steps only) yields the drafts the engine accepted
plus its own token, each checked against the stops in turn as if it came from its own step;
the request's progress rewinds to the accepted tokens, so the KV the rejected drafts left in
its blocks is overwritten by the next steps (those blocks stay its own, reused) and their ids
never reach a block hash, the prefix cache or a KV event.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from engine.kv.kv_cache_manager import KVCacheManager
from engine.request import Request, RequestStatus
from engine.scheduler.chunk_plan import record_chunk
from engine.scheduler.output import RequestUpdate, ScheduledRequest, SchedulerOutput
from engine.scheduler.queue import RequestQueues
from engine.scheduler.spec_counters import SpecDecodeCounters
from engine.scheduler.stop_tokens import StopDecision, check_stop

Finish = Callable[[Request, RequestStatus], None]


class StepResults:
    """What both ways share; :meth:`planned` and :meth:`apply` are the two halves."""

    def __init__(
        self,
        kv: KVCacheManager,
        queues: RequestQueues,
        *,
        max_model_len: int,
        sliding_window: int | None,
        finish: Finish,
    ) -> None:
        self._kv = kv
        self._queues = queues
        self._max_model_len = max_model_len
        self._sliding_window = sliding_window
        self._finish = finish
        self.spec_decode = SpecDecodeCounters()

    def planned(self, scheduled: list[ScheduledRequest]) -> None:
        """A plan was just made."""

    def apply(
        self,
        output: SchedulerOutput,
        sampled_token_ids: Mapping[str, int],
        num_accepted_drafts: Mapping[str, int],
    ) -> list[RequestUpdate]:
        """A plan was computed: one update per request that got a token (a verify row's
        request: its ``num_accepted_drafts`` first drafts, then its sampled token)."""
        raise NotImplementedError

    def after_token(self, request: Request, token_id: int) -> RequestUpdate:
        """Apply the token-level stops to ``request``'s newest token."""
        decision = check_stop(request, self._max_model_len)
        if decision is not None:
            request.stop_reason = decision.stop_reason
            self._finish(request, decision.status)
        elif request.prefill_only:
            self._finish(request, RequestStatus.FINISHED_PREFILL)
        return RequestUpdate.of(request, [token_id])

    def _keep_blocks(self, request: Request) -> None:
        """Cache the request's newly full blocks; free those behind its sliding window (only
        once its prompt is computed: a prefill keeps, and exports, its whole prompt). The next
        token, at ``num_computed_tokens``, sees keys from ``num_computed_tokens - window + 1``."""
        self._kv.cache_full_blocks(request)
        window = self._sliding_window
        if window is None or request.prefill_only:
            return
        if request.num_computed_tokens < request.num_prompt_tokens:
            return
        first_needed = request.num_computed_tokens - window + 1
        if first_needed >= self._kv.block_size:
            self._kv.release_leading(request.request_id, first_needed // self._kv.block_size)


class PlainStepResults(StepResults):
    """A plan takes effect in :meth:`apply`."""

    def apply(
        self,
        output: SchedulerOutput,
        sampled_token_ids: Mapping[str, int],
        num_accepted_drafts: Mapping[str, int],
    ) -> list[RequestUpdate]:
        """Advance progress, keep blocks, append sampled tokens; requests aborted, finished or
        preempted since the plan are skipped."""
        updates: list[RequestUpdate] = []
        for item in output.scheduled:
            request = self._queues.get(item.request_id)
            if (
                request is None
                or request.status is not RequestStatus.RUNNING
                or request.num_computed_tokens != item.start_position
            ):
                continue
            if item.draft_token_ids:
                updates.append(
                    self._apply_verified(request, item, sampled_token_ids, num_accepted_drafts)
                )
                continue
            if item.start_position < request.num_prompt_tokens:
                record_chunk(request, item.start_position, item.end_position)
            request.num_computed_tokens = item.end_position
            self._keep_blocks(request)
            if item.samples_token:
                token_id = sampled(sampled_token_ids, item)
                request.append_output_token(token_id)
                updates.append(self.after_token(request, token_id))
        return updates

    def _apply_verified(
        self,
        request: Request,
        item: ScheduledRequest,
        sampled_token_ids: Mapping[str, int],
        num_accepted_drafts: Mapping[str, int],
    ) -> RequestUpdate:
        """A verify row: append the accepted drafts and the sampled token one by one until a
        stop; the KV computed is that of every token but the newest."""
        drafts = item.draft_token_ids
        num_accepted = num_accepted_drafts.get(item.request_id, 0)
        if not 0 <= num_accepted <= len(drafts):
            raise ValueError(
                f"request {item.request_id}: {num_accepted} of {len(drafts)} drafts accepted"
            )
        self.spec_decode.record(len(drafts), num_accepted)
        new_token_ids: list[int] = []
        decision: StopDecision | None = None
        for token_id in [*drafts[:num_accepted], sampled(sampled_token_ids, item)]:
            request.append_output_token(token_id)
            new_token_ids.append(token_id)
            decision = check_stop(request, self._max_model_len)
            if decision is not None:
                break
        request.num_computed_tokens = request.num_tokens - 1
        self._keep_blocks(request)
        if decision is not None:
            request.stop_reason = decision.stop_reason
            self._finish(request, decision.status)
        return RequestUpdate.of(request, new_token_ids)


class OverlappedStepResults(StepResults):
    """A plan counts as computed when made; :meth:`apply` fills in its sampled ids."""

    def planned(self, scheduled: list[ScheduledRequest]) -> None:
        """Advance progress now; a sampling request holds one placeholder token."""
        for item in scheduled:
            request = self._queues.get(item.request_id)
            if request is None:
                continue
            if item.start_position < request.num_prompt_tokens:
                record_chunk(request, item.start_position, item.end_position)
            request.num_computed_tokens = item.end_position
            if item.samples_token:
                request.num_output_placeholders += 1

    def apply(
        self,
        output: SchedulerOutput,
        sampled_token_ids: Mapping[str, int],
        num_accepted_drafts: Mapping[str, int],
    ) -> list[RequestUpdate]:
        """Record the sampled tokens (a request preempted since the plan gets its token too,
        and keeps it for the recompute), keep blocks of running requests, apply stops.
        Requests that ended since the plan are skipped, their token dropped."""
        if any(item.draft_token_ids for item in output.scheduled) or num_accepted_drafts:
            raise ValueError("overlapped steps never verify drafts (a speculating engine syncs)")
        updates: list[RequestUpdate] = []
        for item in output.scheduled:
            request = self._queues.get(item.request_id)
            if request is None or request.is_finished:
                continue
            token_id = None
            if item.samples_token and request.num_output_placeholders:
                token_id = sampled(sampled_token_ids, item)
                request.resolve_placeholder(token_id)
            # NOTE: before the stops: a request this token ends (a prefill) still offers its
            # blocks to the prefix cache, as with plain steps
            if request.status is RequestStatus.RUNNING:
                self._keep_blocks(request)
            if token_id is not None:
                updates.append(self.after_token(request, token_id))
        return updates


def sampled(sampled_token_ids: Mapping[str, int], item: ScheduledRequest) -> int:
    """The token sampled for ``item``; ``ValueError`` when the runner returned none."""
    if item.request_id not in sampled_token_ids:
        raise ValueError(f"no sampled token for request {item.request_id}, which samples")
    return sampled_token_ids[item.request_id]
