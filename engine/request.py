"""A request's mutable state inside one engine: tokens, progress, status and finish reason.

The scheduler owns every :class:`Request` it was given and mutates it; everyone else reads.
``num_computed_tokens`` counts leading tokens of ``all_token_ids`` whose KV is in the request's
blocks. A request whose every token is computed samples its next token, so a decode step
computes exactly one token: the one sampled by the step before — plus, when the request
speculates, the draft tokens it verifies (:attr:`Request.draft_token_ids`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from core.errors import InvalidRequestError
from core.hashing import BlockHash
from core.sampling import SamplingParams


class FinishReason(enum.StrEnum):
    """Why a request ended (the OpenAI ``finish_reason`` for the first two)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


class RequestStatus(enum.Enum):
    """Where a request is in its life; the ``FINISHED_*`` states are terminal."""

    WAITING = "waiting"
    WAITING_FOR_KV = "waiting_for_kv"  # import: blocks held, KV being written from outside
    LOADING_KV = "loading_kv"  # prefix hit in a lower KV tier: blocks held, KV being copied back
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue, will recompute
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"
    FINISHED_PREFILL = "finished_prefill"  # prefill-only: first token out, blocks pinned

    @property
    def is_finished(self) -> bool:
        """True for every terminal state (``FINISHED_PREFILL`` included)."""
        return self in _FINISHED

    @property
    def finish_reason(self) -> FinishReason | None:
        """The reason a finished request reports (``None`` while running or pinned)."""
        return _REASON_OF.get(self)

    @classmethod
    def finished_with(cls, reason: FinishReason) -> RequestStatus:
        """The terminal status for ``reason``."""
        return _STATUS_OF[reason]


_REASON_OF = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}
_STATUS_OF = {reason: status for status, reason in _REASON_OF.items()}
_FINISHED = frozenset(_REASON_OF) | {RequestStatus.FINISHED_PREFILL}


@dataclass(eq=False)
class Request:
    """One generation request as the scheduler tracks it.

    ``prefill_only``: finish with ``FINISHED_PREFILL`` once the first token is sampled, keeping
    the prompt's blocks pinned until released (the prefill role). ``eos_token_ids`` end the
    request unless ``sampling_params.ignore_eos``. ``prompt_chunk_ends`` records where each
    computed prompt chunk ended (and where a prefix-cache hit left off); a request given
    ``follow_chunk_ends`` (a recompute of another replica's prefill) never lets a chunk cross one
    of those positions, so its prompt is computed in the same chunks. ``cache_salt`` enters the
    root of its block-hash chain: it shares cached blocks only with requests of the same salt.
    ``lora_name`` (the LoRA adapter it runs under, None: the base model) enters that root too.
    """

    request_id: str
    prompt_token_ids: Sequence[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    prefill_only: bool = False
    cache_salt: str | None = None
    lora_name: str | None = None
    output_token_ids: list[int] = field(default_factory=list, init=False)
    all_token_ids: list[int] = field(default_factory=list, init=False)
    num_computed_tokens: int = field(default=0, init=False)
    status: RequestStatus = field(default=RequestStatus.WAITING, init=False)
    stop_reason: int | str | None = field(default=None, init=False)
    block_hashes: list[BlockHash] = field(default_factory=list, init=False)
    num_cached_tokens: int | None = field(default=None, init=False)
    num_preemptions: int = field(default=0, init=False)
    arrival_seq: int = field(default=-1, init=False)
    prompt_chunk_ends: list[int] = field(default_factory=list, init=False)
    follow_chunk_ends: tuple[int, ...] = field(default=(), init=False)
    num_output_placeholders: int = field(default=0, init=False)
    """Tokens sampled by a step still on the device (overlapped steps): they count as known
    for planning (the next decode computes the KV of one, whose id the device fills in) but
    are in neither token list until :meth:`resolve_placeholder`."""
    draft_token_ids: list[int] = field(default_factory=list, init=False)
    """Tokens a speculative proposer guessed to follow ``all_token_ids``, for the next step to
    verify; consumed by the plan that schedules them (in no token list until accepted)."""

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise InvalidRequestError(
                f"request {self.request_id}: the prompt is empty", param="prompt"
            )
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens in the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens so far."""
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.output_token_ids)

    @property
    def num_tokens_with_placeholders(self) -> int:
        """Known tokens plus the sampled ones still on the device."""
        return len(self.all_token_ids) + self.num_output_placeholders

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens whose KV still has to be computed before the next sample."""
        return self.num_tokens_with_placeholders - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        """True once the status is terminal."""
        return self.status.is_finished

    @property
    def finish_reason(self) -> FinishReason | None:
        """Why it finished, or ``None``."""
        return self.status.finish_reason

    def append_output_token(self, token_id: int) -> None:
        """Record one generated token (its KV is computed by the next step)."""
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def resolve_placeholder(self, token_id: int) -> None:
        """The oldest sampled-but-unread token is ``token_id``: record it."""
        if self.num_output_placeholders <= 0:
            raise ValueError(f"request {self.request_id} has no token pending")
        self.num_output_placeholders -= 1
        self.append_output_token(token_id)
