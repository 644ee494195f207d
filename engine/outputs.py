"""What the engine hands back per request: cumulative output plus the delta of the last step."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of one sampled token and the top-n alternatives at its position."""

    token_id: int
    logprob: float
    top_token_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class RequestOutput:
    """The state of one request after an engine step.

    ``token_ids``/``text`` are cumulative; ``new_token_ids``/``new_text`` are what this step
    added (what a stream sends). ``text`` never contains a matched stop string.
    ``num_cached_tokens`` counts prompt tokens served from the prefix cache.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    new_token_ids: tuple[int, ...] = ()
    new_text: str = ""
    finished: bool = False
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    prompt: str | None = None
    logprobs: tuple[TokenLogprob, ...] = field(default=(), compare=False)
