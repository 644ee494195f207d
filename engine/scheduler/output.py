"""What the scheduler hands out: the per-step plan, per-request updates and handoff records.

All are frozen dataclasses of plain ints, strings and lists (plus the request's frozen
``SamplingParams``) — never tensors. The model runner turns a :class:`SchedulerOutput` into
tensors; the engine turns :class:`RequestUpdate` s into client outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.hashing import BlockHash
from core.sampling import SamplingParams
from core.stats import KVTierStats, SpecDecodeStats
from engine.request import FinishReason, Request, RequestStatus

PENDING_TOKEN_ID = -1
"""A decode input still on the device: the id the step before sampled (overlapped steps); the
model runner fills it in from that step's sampled ids."""


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step.

    The step computes the KV of ``token_ids``, which sit at positions ``start_position`` ..
    ``start_position + len(token_ids) - 1`` of the request's sequence (``start_position`` is
    its ``num_computed_tokens`` before the step; everything before it is already in
    ``block_ids``). ``block_ids`` is the whole block table and covers ``end_position`` tokens.
    When ``samples_token`` is true the step ends the known tokens (last prompt chunk, or a
    decode), so the runner samples one token for it from the last position's logits (a
    verify row, with ``draft_token_ids``: from the last k + 1 positions' logits).
    A ``token_ids`` entry may be :data:`PENDING_TOKEN_ID` (overlapped steps).
    """

    request_id: str
    token_ids: list[int]
    start_position: int
    block_ids: list[int]
    samples_token: bool
    sampling_params: SamplingParams
    num_output_tokens: int  # output tokens before this step, pending ones included (min_tokens)
    draft_token_ids: tuple[int, ...] = ()
    """A verify row: the last ``len(draft_token_ids)`` entries of ``token_ids`` are these
    drafts (after the last known token); the runner returns logits at those k + 1 positions
    and the engine keeps a prefix of the drafts plus one token of its own."""

    @property
    def num_new_tokens(self) -> int:
        """Tokens computed for this request this step (the query length)."""
        return len(self.token_ids)

    @property
    def end_position(self) -> int:
        """Context length after the step (``seq_len`` in attention metadata)."""
        return self.start_position + len(self.token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    """The plan of one engine step, in batch order.

    ``finished_request_ids``: requests that ended (any way, pinned prefill included) since the
    previous plan — the runner drops its per-request state. ``preempted_request_ids``: requests
    whose blocks were freed by this plan; they will be recomputed from scratch later.
    """

    step_id: int
    scheduled: list[ScheduledRequest]
    finished_request_ids: list[str]
    preempted_request_ids: list[str]

    @property
    def num_scheduled_tokens(self) -> int:
        """Tokens computed this step (at most ``max_num_batched_tokens``)."""
        return sum(len(item.token_ids) for item in self.scheduled)

    @property
    def is_empty(self) -> bool:
        """True when no model forward is needed."""
        return not self.scheduled


@dataclass(frozen=True)
class RequestUpdate:
    """What one step did to one request: a new token and/or an end."""

    request_id: str
    new_token_ids: list[int]
    status: RequestStatus
    finish_reason: FinishReason | None
    stop_reason: int | str | None  # the stop token id (or string) that ended it
    num_cached_tokens: int  # prompt tokens served from the prefix cache

    @classmethod
    def of(cls, request: Request, new_token_ids: list[int]) -> RequestUpdate:
        """``request``'s state now, with ``new_token_ids`` as this step's tokens."""
        return cls(
            request_id=request.request_id,
            new_token_ids=new_token_ids,
            status=request.status,
            finish_reason=request.finish_reason,
            stop_reason=request.stop_reason,
            num_cached_tokens=request.num_cached_tokens or 0,
        )

    @property
    def finished(self) -> bool:
        """True when the request ended (``FINISHED_PREFILL``: ended here, blocks pinned)."""
        return self.status.is_finished


@dataclass(frozen=True)
class PinnedBlocks:
    """The KV of a finished prefill-only request, held until ``release``.

    ``block_ids`` hold the KV of the first ``num_tokens`` tokens (the prompt), block-table
    order; ``block_hashes`` are the chained hashes of its full blocks
    (``num_tokens // block_size`` of them — a partial last block has none).
    """

    request_id: str
    block_ids: list[int]
    block_hashes: list[BlockHash]
    num_tokens: int
    first_token_id: int
    prompt_chunk_ends: tuple[int, ...] = ()
    """Where the prompt's chunks ended (and a prefix-cache hit left off), in order."""


@dataclass(frozen=True)
class ImportAllocation:
    """Blocks reserved for an import; the first ``num_local_blocks`` already hold the right KV
    (local prefix-cache hits), so only :attr:`missing_block_indices` must be written."""

    request_id: str
    block_ids: list[int]
    num_local_blocks: int

    @property
    def missing_block_indices(self) -> list[int]:
        """Positions in ``block_ids`` whose KV must come from outside."""
        return list(range(self.num_local_blocks, len(self.block_ids)))


@dataclass(frozen=True)
class SchedulerStats:
    """A snapshot for metrics and ``pdserve status``."""

    num_running: int
    num_waiting: int
    num_waiting_for_kv: int
    num_pinned: int
    num_free_blocks: int
    num_used_blocks: int
    num_cached_blocks: int
    kv_usage: float
    num_preemptions_total: int
    num_loading_kv: int = 0
    """Requests whose prefix is being copied back from a host or disk tier."""
    num_pending_prompt_tokens: int = 0
    """Prompt tokens of waiting and running requests not computed yet (the prefill backlog)."""
    kv_tiers: tuple[KVTierStats, ...] = ()
    """Every KV tier, device first (occupancy and counters)."""
    spec_decode: SpecDecodeStats = field(default_factory=SpecDecodeStats)
    """Speculative decoding counters (all zero when the engine does not speculate)."""
