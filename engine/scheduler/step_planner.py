"""One step's plan: which tokens of which requests run next, within the budget and the pool.

In order:

1. **Running** requests in arrival order. A decode costs one token, plus its draft tokens
   when it speculates (a verify row; drafts only take the budget the decodes still to come
   leave, and never reach past ``max_tokens`` or ``max_model_len``); a partly computed prompt
   gets ``min(remaining, budget - decodes still to come)`` tokens, so decodes of running
   requests are never starved by a long prefill (chunked prefill). With
   ``long_prefill_token_threshold`` a prompt's chunk is capped at it (admission too), which
   leaves the rest of the budget to other prompts.
2. If that needs a block the pool lacks, the **latest-arrived** running request is preempted
   (blocks freed, ``num_computed_tokens`` reset, back to the head of the waiting queue) —
   repeatedly, down to the request itself. Earlier requests therefore always progress.
3. If nothing was preempted, **waiting** requests are admitted first come first served while
   ``max_num_seqs`` and the token budget allow and the pool has the blocks for their next chunk
   (after reusing cached prefix blocks); the first one that does not fit stops admission. One
   whose prefix continues in a host or disk tier is not planned yet: it holds the blocks, its
   load starts, and it waits in ``loading`` until the scheduler settles the load.

A request following a recorded chunk plan (a recompute after a failed transfer) is chunked at
the recorded positions (:mod:`~engine.scheduler.chunk_plan`).
"""

from __future__ import annotations

import logging

from core.config import EngineConfig
from engine.kv.kv_cache_manager import NO_HIT, ComputedBlocks, KVCacheManager
from engine.request import Request, RequestStatus
from engine.scheduler.chunk_plan import recorded_hit, recorded_span
from engine.scheduler.output import PENDING_TOKEN_ID, ScheduledRequest
from engine.scheduler.queue import RequestQueues
from engine.scheduler.tier_loading import TierLoading

logger = logging.getLogger(__name__)


class StepPlanner:
    """Plans each step over the scheduler's queues, KV manager and tier loading (shared)."""

    def __init__(
        self,
        config: EngineConfig,
        kv: KVCacheManager,
        queues: RequestQueues,
        tiers: TierLoading,
        *,
        max_model_len: int,
    ) -> None:
        self.block_size = config.block_size
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_num_seqs = config.max_num_seqs
        self.max_loras = config.max_loras if config.enable_lora else None
        self.max_prefill_chunk = (
            config.long_prefill_token_threshold or config.max_num_batched_tokens
        )
        self.num_preemptions_total = 0
        self._kv = kv
        self._queues = queues
        self._tiers = tiers
        self._overshoot = False
        """True once a recorded chunk took more than the step's room (one per step)."""

    def plan(self) -> tuple[list[ScheduledRequest], list[str]]:
        """The next step's scheduled requests, and the ids preempted to make room for them."""
        self._overshoot = False
        scheduled: list[ScheduledRequest] = []
        preempted: list[str] = []
        budget = self._schedule_running(self.max_num_batched_tokens, scheduled, preempted)
        if not preempted:
            self._schedule_waiting(budget, scheduled)
        return scheduled, preempted

    def _schedule_running(
        self, budget: int, scheduled: list[ScheduledRequest], preempted: list[str]
    ) -> int:
        running = self._queues.running
        decodes_left = sum(1 for r in running if self._decodes_next(r))
        index = 0
        while index < len(running) and (budget > 0 or self._overshoot):
            request = running[index]
            remaining = request.num_uncomputed_tokens
            if self._ends_at_pending_token(request):
                index += 1
                continue
            num_drafts = 0
            if remaining == 1:
                decodes_left -= 1
                num_drafts = self._num_drafts(request, budget - 1 - decodes_left)
                num_new = 1 + num_drafts
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
                decodes_left = sum(1 for r in running[index + 1 :] if self._decodes_next(r))
            scheduled.append(self._plan(request, num_new, num_drafts))
            budget -= num_new
            index += 1
        return budget

    def _num_drafts(self, request: Request, room: int) -> int:
        """How many of the request's draft tokens this step verifies: what the budget's
        ``room`` allows, and no more than the tokens it may still generate less one (the
        step always yields one token of its own). Drafts beyond are dropped."""
        drafts = request.draft_token_ids
        if not drafts or request.num_output_placeholders:
            return 0
        num_tokens_left = min(
            request.sampling_params.max_tokens - request.num_output_tokens,
            self.max_model_len - request.num_tokens,
        )
        num = max(0, min(len(drafts), room, num_tokens_left - 1))
        del drafts[num:]
        return num

    def _decodes_next(self, request: Request) -> bool:
        return request.num_uncomputed_tokens == 1 and not self._ends_at_pending_token(request)

    def _ends_at_pending_token(self, request: Request) -> bool:
        """True when a token still on the device ends the request whatever its id (a length
        limit, a prefill-only request's first token): it is not planned again."""
        if not request.num_output_placeholders:
            return False
        num_outputs = request.num_output_tokens + request.num_output_placeholders
        return (
            request.prefill_only
            or num_outputs >= request.sampling_params.max_tokens
            or request.num_tokens_with_placeholders >= self.max_model_len
        )

    def _allocate_or_preempt(self, request: Request, num_new: int, preempted: list[str]) -> bool:
        while not self._kv.allocate_slots(request, num_new):
            victim = self._queues.pop_latest_running()
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self._kv.free(request.request_id)
        request.num_computed_tokens = 0
        request.draft_token_ids.clear()
        request.prompt_chunk_ends.clear()
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions_total += 1
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
            if not self._adapter_fits(request):
                break
            computed: ComputedBlocks = NO_HIT
            # NOTE: a request asking for prompt logprobs computes every prompt position
            wants_all = request.sampling_params.prompt_logprobs is not None
            if request.num_computed_tokens == 0 and not wants_all:  # look for a cached prefix
                computed = self._kv.get_computed_blocks(request, request.num_tokens - 1)
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
            if not self._kv.allocate_slots(request, num_new, computed):
                break
            queues.waiting.popleft()
            self._adopt_hit(request, computed)
            request.status = RequestStatus.RUNNING
            queues.add_running(request)
            scheduled.append(self._plan(request, num_new))
            budget -= num_new

    def _adapter_fits(self, request: Request) -> bool:
        """False when admitting ``request`` would put more than ``max_loras`` distinct LoRA
        adapters in the running set (every step's adapters must fit the device slots)."""
        if self.max_loras is None or request.lora_name is None:
            return True
        queues = self._queues
        names = {r.lora_name for r in (*queues.running, *queues.loading.values()) if r.lora_name}
        return request.lora_name in names or len(names) < self.max_loras

    def _adopt_hit(self, request: Request, computed: ComputedBlocks) -> None:
        request.num_computed_tokens += computed.num_tokens
        if request.num_cached_tokens is None:
            request.num_cached_tokens = computed.num_tokens
        self._tiers.on_device_hit(request.block_hashes[: len(computed.block_ids)])

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

    def _plan(self, request: Request, num_new: int, num_drafts: int = 0) -> ScheduledRequest:
        """``num_new`` tokens of ``request``, the last ``num_drafts`` of them its drafts (which
        this consumes: every step proposes afresh)."""
        start = request.num_computed_tokens
        num_known = num_new - num_drafts
        drafts = tuple(request.draft_token_ids[:num_drafts])
        request.draft_token_ids.clear()
        token_ids = request.all_token_ids[start : start + num_known]
        token_ids += [PENDING_TOKEN_ID] * (num_known - len(token_ids))  # sampled, on device
        return ScheduledRequest(
            request_id=request.request_id,
            token_ids=token_ids + list(drafts),
            start_position=start,
            block_ids=self._kv.block_ids(request.request_id),
            samples_token=start + num_known == request.num_tokens_with_placeholders,
            sampling_params=request.sampling_params,
            num_output_tokens=request.num_output_tokens + request.num_output_placeholders,
            draft_token_ids=drafts,
        )

    # -- lower KV tiers -----------------------------------------------------------------------

    def _lower_tier_hit(self, request: Request, computed: ComputedBlocks) -> int:
        """Blocks after the device hit found in host/disk tiers (whole recorded chunks only)."""
        if not self._kv.enable_prefix_caching or request.follow_chunk_ends:
            return 0
        start = len(computed.block_ids)
        hashes = self._kv.block_hashes(request, (request.num_tokens - 1) // self.block_size)
        return self._tiers.find(hashes[start:])

    def _start_load(self, request: Request, computed: ComputedBlocks, num_lower: int) -> bool:
        """Hold blocks for the device hit plus ``num_lower`` blocks and start copying them back;
        the request waits in ``loading`` (the batch keeps stepping). False: no room now."""
        if not self._kv.allocate_slots(request, num_lower * self.block_size, computed):
            return False
        self._queues.waiting.popleft()
        self._adopt_hit(request, computed)
        first = len(computed.block_ids)
        table = self._kv.block_ids(request.request_id)
        self._tiers.start_load(
            request.request_id,
            request.block_hashes[first : first + num_lower],
            table[first : first + num_lower],
        )
        request.status = RequestStatus.LOADING_KV
        self._queues.loading[request.request_id] = request
        return True
