"""Token-level stop conditions, checked after each sampled token.

Stop *strings* need the detokenized text and are decided by the engine (``Scheduler.finish``);
everything decidable from token ids is here. A stop token (EOS unless ``ignore_eos``, or one of
``stop_token_ids``) counts only after ``min_tokens`` other tokens (none under a grammar): the
sampler is expected to mask those tokens until then, and this check keeps the rule even if it
does not. A stop token wins over a length limit reached by the same token.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.request import Request, RequestStatus


@dataclass(frozen=True)
class StopDecision:
    """The terminal status a request reached and the token that caused a stop, if any."""

    status: RequestStatus
    stop_reason: int | None = None


def check_stop(request: Request, max_model_len: int) -> StopDecision | None:
    """Whether the request's last output token ends it (``None``: keep going)."""
    params = request.sampling_params
    last_token_id = request.output_token_ids[-1]
    if request.num_output_tokens > params.held_open_for:
        if last_token_id in params.stop_token_ids:
            return StopDecision(RequestStatus.FINISHED_STOPPED, stop_reason=last_token_id)
        if not params.ignore_eos and last_token_id in request.eos_token_ids:
            return StopDecision(RequestStatus.FINISHED_STOPPED)
    if request.num_output_tokens >= params.max_tokens or request.num_tokens >= max_model_len:
        return StopDecision(RequestStatus.FINISHED_LENGTH)
    return None
