"""What the engine hands back per request, shaped like vLLM's ``RequestOutput``.

A :class:`RequestOutput` carries one :class:`CompletionOutput` per generated sequence (the
engine's own outputs have exactly one; ``LLM.generate`` gathers ``n`` of them per prompt),
plus the delta of the last step that streams send.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.messages import LogprobEntry, StageTimes, TokenLogprobs


@dataclass(frozen=True)
class TokenLogprob:
    """The sampler's record of one sampled token: its log-probability, its rank in the vocabulary
    (1 = most likely) and the top-n alternatives at its position (best first)."""

    token_id: int
    logprob: float
    rank: int
    top_token_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class Logprob:
    """vLLM's per-token entry: log-probability, rank in the vocabulary (1 = most likely) and the
    token's text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PositionLogprobs = dict[int, Logprob]
"""One generated position: token id -> :class:`Logprob`, the sampled token and the top-n."""


@dataclass(frozen=True)
class CompletionOutput:
    """One generated sequence of a request, cumulative so far.

    ``text`` never contains a matched stop string. ``cumulative_logprob`` and ``logprobs`` (one
    :data:`PositionLogprobs` per generated token) are ``None`` unless the request asked for
    ``logprobs``. ``stop_reason`` is the stop string or stop token id that ended the sequence;
    ``None`` for any other end (EOS included) and while it runs.
    """

    index: int
    text: str
    token_ids: tuple[int, ...]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        """True once the sequence has ended (vLLM's ``CompletionOutput.finished()``)."""
        return self.finish_reason is not None


@dataclass(frozen=True)
class RequestMetrics:
    """When the engine saw a request (``time.monotonic()`` seconds in its process, vLLM's
    names): added, first put in a batch, first token sampled (None until each happens)."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None

    @property
    def time_in_queue(self) -> float:
        """Seconds from arrival to the first batch (0 until scheduled)."""
        if self.first_scheduled_time is None:
            return 0.0
        return self.first_scheduled_time - self.arrival_time

    @property
    def prefill_time(self) -> float:
        """Seconds from the first batch to the first sampled token (0 until both happened)."""
        if self.first_scheduled_time is None or self.first_token_time is None:
            return 0.0
        return self.first_token_time - self.first_scheduled_time

    def stage_times(self) -> StageTimes:
        """Queue and prefill time as the message a role reports them in."""
        return StageTimes(queue_s=self.time_in_queue, prefill_s=self.prefill_time)


@dataclass(frozen=True)
class RequestOutput:
    """The state of one request: after an engine step, or finished from ``LLM.generate``.

    ``outputs`` holds one :class:`CompletionOutput` per sequence (index 0 .. n-1).
    ``num_cached_tokens`` counts prompt tokens served from the prefix cache.
    ``new_token_ids``/``new_text`` are what the last engine step added to ``outputs[0]`` (what a
    stream sends); ``token_ids``, ``text`` and ``finish_reason`` read ``outputs[0]``.
    ``metrics`` times the request in the engine (queue and prefill, :class:`RequestMetrics`).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    """With ``SamplingParams.prompt_logprobs``: None for the first prompt token, then each
    token's ``{token_id: Logprob}`` given the tokens before it."""
    new_token_ids: tuple[int, ...] = ()
    new_text: str = ""
    metrics: RequestMetrics | None = None
    error: str | None = None
    """Why the request failed on its own (``finish_reason`` ``"error"``): its grammar, sampling
    options, penalties or non-finite logits raised while the rest of its batch went on."""

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The first sequence's generated token ids."""
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        """The first sequence's text."""
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        """Why the first sequence ended (``stop``, ``length``, ``abort``, ``error``), None while
        it runs."""
        return self.outputs[0].finish_reason


def message_logprobs(position: PositionLogprobs, token_id: int, num_top: int) -> TokenLogprobs:
    """One position as the typed message the roles send (``core.messages.TokenLogprobs``):
    ``token_id``'s entry and the ``num_top`` best, best first."""
    entries = {t: LogprobEntry(t, p.decoded_token or "", p.logprob) for t, p in position.items()}
    ranked = sorted(
        (p.rank, t) for t, p in position.items() if p.rank is not None and p.rank <= num_top
    )
    return TokenLogprobs(entries[token_id], tuple(entries[t] for _, t in ranked))


def new_logprobs(output: RequestOutput, num_top: int | None) -> tuple[TokenLogprobs, ...]:
    """The positions of ``output.new_token_ids`` (empty unless the request asked for logprobs)."""
    positions = output.outputs[0].logprobs
    new = output.new_token_ids
    if num_top is None or positions is None or not new or len(positions) < len(new):
        return ()
    recent = positions[len(positions) - len(new) :]
    return tuple(message_logprobs(p, t, num_top) for p, t in zip(recent, new, strict=True))


def prompt_message_logprobs(
    output: RequestOutput, num_top: int | None
) -> tuple[TokenLogprobs | None, ...]:
    """``output.prompt_logprobs`` as messages (empty unless the request asked for them)."""
    if num_top is None or output.prompt_logprobs is None:
        return ()
    ids = output.prompt_token_ids
    return tuple(
        None if p is None else message_logprobs(p, ids[i], num_top)
        for i, p in enumerate(output.prompt_logprobs)
    )
