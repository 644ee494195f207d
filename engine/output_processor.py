"""Per-request output state: detokenize new tokens, apply stop strings, build RequestOutputs.

The scheduler decides token-level stops (EOS, stop token ids, lengths); this module owns the
text-level ones. A stop string ends the request and is never emitted; the text of a finishing
stop token (EOS or a ``stop_token_ids`` entry) is not emitted either, though its id stays in
``token_ids`` as HF ``generate()`` keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.sampling import SamplingParams
from engine.outputs import RequestOutput, TokenLogprob
from engine.sampling import StopStringMatcher
from engine.scheduler.output import RequestUpdate
from engine.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass
class RequestState:
    """What the engine keeps per live request besides the scheduler's ``Request``."""

    request_id: str
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    stops: StopStringMatcher
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass(frozen=True)
class ProcessedUpdate:
    """One request's output after a step, and the stop string it hit (if any)."""

    output: RequestOutput
    stop_string: str | None


class OutputProcessor:
    """Turns scheduler updates into client-facing :class:`RequestOutput` s."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def new_state(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
    ) -> RequestState:
        """Fresh per-request state."""
        return RequestState(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=tuple(prompt_token_ids),
            params=params,
            detokenizer=IncrementalDetokenizer(self.tokenizer, prompt_token_ids=prompt_token_ids),
            stops=StopStringMatcher(params.stop),
        )

    def process(
        self, state: RequestState, update: RequestUpdate, logprob: TokenLogprob | None
    ) -> ProcessedUpdate:
        """Apply one step's update (new token ids and/or an end) to ``state``."""
        new_ids = list(update.new_token_ids)
        state.token_ids.extend(new_ids)
        if logprob is not None:
            state.logprobs.append(logprob)
        text_ids = new_ids
        if update.finished and new_ids and update.stop_reason == new_ids[-1]:
            text_ids = new_ids[:-1]  # a finishing stop token has no text
        check = state.stops.feed(state.detokenizer.step(text_ids) if text_ids else "")
        pieces = [check.text]
        finished, reason = update.finished, update.finish_reason
        if not check.stopped and finished:
            tail = state.stops.feed(state.detokenizer.finish())
            pieces.append(tail.text)
            check = tail
            if not tail.stopped:
                pieces.append(state.stops.flush())
        reason_str: str | None = None if reason is None else str(reason)
        if check.stopped:
            finished, reason_str = True, "stop"
        output = RequestOutput(
            request_id=state.request_id,
            prompt_token_ids=state.prompt_token_ids,
            token_ids=tuple(state.token_ids),
            text=state.stops.text,
            new_token_ids=tuple(new_ids),
            new_text="".join(pieces),
            finished=finished,
            finish_reason=reason_str,
            num_cached_tokens=update.num_cached_tokens,
            prompt=state.prompt,
            logprobs=tuple(state.logprobs),
        )
        return ProcessedUpdate(output, check.stop if check.stopped else None)
