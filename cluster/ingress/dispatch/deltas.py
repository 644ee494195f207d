"""What a run hands its protocol handler: each step's :class:`Delta` and the request's
:class:`RequestUsage`."""

from __future__ import annotations

from dataclasses import dataclass

from cluster.ingress.dispatch.ttft_breakdown import TtftBreakdown
from core.messages import TokenLogprobs


@dataclass(frozen=True)
class Delta:
    """New output of one step: token ids, their text, and the finish reason on the last one."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    logprobs: tuple[TokenLogprobs, ...] = ()
    """One per token when the request asked for logprobs."""
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()
    """On the first delta, when the request asked for prompt logprobs (``echo``)."""


@dataclass
class RequestUsage:
    """Token counts of one request (the OpenAI ``usage`` object)."""

    num_prompt_tokens: int
    num_cached_tokens: int = 0
    num_generated_tokens: int = 0
    ttft_breakdown: TtftBreakdown | None = None
    """The first choice's (``usage.ttft_breakdown``)."""
