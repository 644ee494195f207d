"""Per-request output state: detokenize new tokens, apply stop strings, gather logprobs, build
RequestOutputs.

The scheduler decides token-level stops (EOS, stop token ids, lengths); this module owns the
text-level ones. A stop string ends the request and is never emitted; the text of a finishing
stop token (EOS or a ``stop_token_ids`` entry) is not emitted either, though its id stays in
``token_ids`` as HF ``generate()`` keeps it. Where the request asked for ``logprobs``, each
sampled position becomes vLLM's ``{token_id: Logprob}`` (the sampled token and the top-n); with
``prompt_logprobs``, so does each prompt position after the first (vLLM's ``prompt_logprobs``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from core.sampling import SamplingParams
from engine.outputs import (
    CompletionOutput,
    Logprob,
    PositionLogprobs,
    RequestMetrics,
    RequestOutput,
    TokenLogprob,
)
from engine.request import FinishReason, RequestStatus
from engine.sampling import StopStringMatcher
from engine.sampling.ops import top_logprobs
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
    logprobs: list[PositionLogprobs] | None = None  # None unless the request asked for them
    cumulative_logprob: float | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = None  # [None, position 1, ...]
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None

    def scheduled(self, now: float) -> None:
        """The request is in a batch at ``now`` (only the first time counts)."""
        if self.first_scheduled_time is None:
            self.first_scheduled_time = now

    @property
    def metrics(self) -> RequestMetrics:
        """The request's engine timings so far."""
        return RequestMetrics(self.arrival_time, self.first_scheduled_time, self.first_token_time)


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
            detokenizer=IncrementalDetokenizer(
                self.tokenizer,
                skip_special_tokens=params.skip_special_tokens,
                prompt_token_ids=prompt_token_ids,
            ),
            stops=StopStringMatcher(params.stop, include_stop=params.include_stop_str_in_output),
            logprobs=None if params.logprobs is None else [],
            cumulative_logprob=None if params.logprobs is None else 0.0,
            prompt_logprobs=None if params.prompt_logprobs is None else [None],
        )

    def process(
        self, state: RequestState, update: RequestUpdate, logprob: TokenLogprob | None
    ) -> ProcessedUpdate:
        """Apply one step's update (new token ids and/or an end) to ``state``."""
        new_ids = list(update.new_token_ids)
        state.token_ids.extend(new_ids)
        if new_ids and state.first_token_time is None:
            state.first_token_time = time.monotonic()
        if logprob is not None:
            self._add_logprob(state, logprob)
        text_ids = new_ids
        if update.finished and new_ids and update.stop_reason == new_ids[-1]:
            text_ids = new_ids[:-1]  # a finishing stop token has no text
        check = state.stops.feed(state.detokenizer.step(text_ids) if text_ids else "")
        pieces = [check.text]
        finished, reason = update.finished, update.finish_reason
        if not check.stopped and finished and update.status is not RequestStatus.FINISHED_PREFILL:
            tail = state.stops.feed(state.detokenizer.finish())
            pieces.append(tail.text)
            check = tail
            if not tail.stopped:
                pieces.append(state.stops.flush())
        if update.status is RequestStatus.FINISHED_PREFILL and not check.stopped:
            # the sequence goes on elsewhere: bytes of an unfinished character stay held back
            # (the importing decode replays this token through its own detokenizer and emits
            # them with the next one), text held for a possible stop string goes out
            pieces.append(state.stops.flush())
        reason_str: str | None = None if reason is None else str(reason)
        if check.stopped:
            finished, reason_str = True, "stop"
        output = _output(
            state,
            reason_str,
            check.stop if check.stopped else update.stop_reason,
            finished=finished,
            num_cached_tokens=update.num_cached_tokens,
            new_token_ids=tuple(new_ids),
            new_text="".join(pieces),
        )
        return ProcessedUpdate(output, check.stop if check.stopped else None)

    def process_tokens(
        self,
        state: RequestState,
        update: RequestUpdate,
        logprobs: Sequence[TokenLogprob | None],
    ) -> ProcessedUpdate:
        """:meth:`process` for an update of any number of tokens (a verify row's accepted
        drafts and its own token; ``logprobs`` one per token, or empty): each token is applied
        as if it came from its own step, up to the first stop string, which drops the tokens
        after it as decoding without drafts would never have made them. One output, whose
        ``new_token_ids`` and ``new_text`` cover every token applied."""
        new_ids = list(update.new_token_ids)
        if len(new_ids) <= 1:
            return self.process(state, update, logprobs[0] if logprobs else None)
        running = dataclasses.replace(
            update, status=RequestStatus.RUNNING, finish_reason=None, stop_reason=None
        )
        texts: list[str] = []
        for j, token_id in enumerate(new_ids):
            last = j == len(new_ids) - 1
            step = dataclasses.replace(update if last else running, new_token_ids=[token_id])
            processed = self.process(state, step, logprobs[j] if logprobs else None)
            texts.append(processed.output.new_text)
            if last or processed.stop_string is not None:
                break
        output = dataclasses.replace(
            processed.output, new_token_ids=tuple(new_ids[: j + 1]), new_text="".join(texts)
        )
        return ProcessedUpdate(output, processed.stop_string)

    def failed(self, state: RequestState, error: str) -> RequestOutput:
        """The final output of a request that failed alone: what it generated so far (text
        held back for a stop string left out), ``finish_reason`` ``"error"`` and the cause."""
        return _output(state, str(FinishReason.ERROR), None, finished=True, error=error)

    def add_prompt_logprobs(self, state: RequestState, start: int, logits: torch.Tensor) -> None:
        """Record the prompt logprobs that one step's logits [n, vocab] at positions ``start``
        .. give: row ``i`` scores prompt token ``start + i + 1``. Positions already recorded (a
        recomputation after preemption) are skipped."""
        known = state.prompt_logprobs
        if known is None:
            return
        prompt = state.prompt_token_ids
        first = len(known) - 1 - start  # rows before it were recorded already
        last = min(logits.shape[0], len(prompt) - 1 - start)
        if first < 0 or first >= last:
            return
        rows = logits[first:last].float()
        targets = torch.tensor(prompt[start + first + 1 : start + last + 1], device=rows.device)
        num_top = state.params.prompt_logprobs or 0
        chosen, ranks, top_ids, top_values = top_logprobs(rows, targets, num_top)
        for j, token_id in enumerate(targets.tolist()):
            top = (tuple(top_ids[j].tolist()), tuple(top_values[j].tolist()))
            known.append(
                self._position(TokenLogprob(token_id, float(chosen[j]), int(ranks[j]), *top))
            )

    def _position(self, logprob: TokenLogprob) -> PositionLogprobs:
        position = {logprob.token_id: self._entry(logprob.token_id, logprob.logprob, logprob.rank)}
        ranked = zip(logprob.top_token_ids, logprob.top_logprobs, strict=True)
        for rank, (token_id, value) in enumerate(ranked, start=1):
            position.setdefault(token_id, self._entry(token_id, value, rank))
        return position

    def _add_logprob(self, state: RequestState, logprob: TokenLogprob) -> None:
        if state.logprobs is None or state.cumulative_logprob is None:
            return
        state.logprobs.append(self._position(logprob))
        state.cumulative_logprob += logprob.logprob

    def _entry(self, token_id: int, value: float, rank: int) -> Logprob:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return Logprob(logprob=value, rank=rank, decoded_token=text)


def _output(
    state: RequestState,
    finish_reason: str | None,
    stop_reason: int | str | None,
    *,
    finished: bool,
    num_cached_tokens: int = 0,
    new_token_ids: tuple[int, ...] = (),
    new_text: str = "",
    error: str | None = None,
) -> RequestOutput:
    """``state``'s request output so far, its one sequence ending as given, with the step's
    new tokens and text."""
    completion = CompletionOutput(
        index=0,
        text=state.stops.text,
        token_ids=tuple(state.token_ids),
        cumulative_logprob=state.cumulative_logprob,
        logprobs=None if state.logprobs is None else list(state.logprobs),
        finish_reason=finish_reason,
        stop_reason=stop_reason,
    )
    return RequestOutput(
        request_id=state.request_id,
        prompt=state.prompt,
        prompt_token_ids=state.prompt_token_ids,
        outputs=[completion],
        finished=finished,
        num_cached_tokens=num_cached_tokens,
        prompt_logprobs=None if state.prompt_logprobs is None else list(state.prompt_logprobs),
        new_token_ids=new_token_ids,
        new_text=new_text,
        metrics=state.metrics,
        error=error,
    )
