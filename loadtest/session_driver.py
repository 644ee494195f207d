"""Drive sessions against the server: arrivals, the concurrency cap, think time, history.

All sessions are built before the clock starts (as ``vllm bench serve`` does), so no prompt
synthesis or tokenization runs on the event loop while streams are being timed; records are
assembled after the last request finishes. The concurrency cap limits requests in flight (a
session thinking between turns holds no slot); the time a request waits for a slot is its
``queue_s`` and is not part of its TTFT. A failed turn ends its session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass

import numpy as np

from loadtest.arrivals import arrival_times
from loadtest.clock import now_s
from loadtest.config import ArrivalConfig
from loadtest.http_client import OpenAIStreamClient, Prompt, new_request_id
from loadtest.tokens import TokenCounter
from loadtest.types import RequestRecord, Session, StreamOutcome

OnDone = Callable[[StreamOutcome], None]


@dataclass(frozen=True)
class _Sent:
    """One request as sent, with what came back."""

    request_id: str
    session_id: int
    turn_index: int
    prompt_tokens: int
    max_output_tokens: int
    queued_at_s: float
    outcome: StreamOutcome
    label: str = ""


@dataclass(frozen=True)
class RunResult:
    """Every request's record and the benchmark duration (first dispatch to last answer)."""

    records: tuple[RequestRecord, ...]
    duration_s: float


class _SessionDriver:
    """Runs one session's turns, carrying the conversation history."""

    def __init__(
        self,
        client: OpenAIStreamClient,
        slots: AbstractAsyncContextManager[object],
        on_done: OnDone | None,
    ) -> None:
        self._client = client
        self._slots = slots
        self._on_done = on_done
        self.sent: list[_Sent] = []

    def _prompt(self, session: Session, history: list[tuple[str, str]], text: str) -> Prompt:
        if self._client.chat:
            messages = [{"role": "system", "content": session.system_text}]
            messages = messages if session.system_text else []
            for user, answer in history:
                messages += [
                    {"role": "user", "content": user},
                    {"role": "assistant", "content": answer},
                ]
            return [*messages, {"role": "user", "content": text}]
        return session.system_text + "".join(u + a for u, a in history) + text

    async def run(self, session: Session) -> None:
        history: list[tuple[str, str]] = []
        history_tokens = session.system_tokens
        for index, turn in enumerate(session.turns):
            if turn.think_time_s > 0:
                await asyncio.sleep(turn.think_time_s)
            prompt = self._prompt(session, history, turn.text)
            request_id = new_request_id()
            queued_at_s = now_s()
            async with self._slots:
                outcome = await self._client.stream(prompt, turn.max_output_tokens, request_id)
            prompt_tokens = history_tokens + turn.text_tokens
            self.sent.append(
                _Sent(
                    request_id,
                    session.session_id,
                    index,
                    prompt_tokens,
                    turn.max_output_tokens,
                    queued_at_s,
                    outcome,
                    session.label,
                )
            )
            if self._on_done is not None:
                self._on_done(outcome)
            if not outcome.success:
                return
            answer_tokens = outcome.usage_output_tokens or outcome.num_token_chunks
            history.append((turn.text, outcome.generated_text))
            history_tokens = prompt_tokens + answer_tokens


def _record(sent: _Sent, start_s: float, counter: TokenCounter) -> RequestRecord:
    out = sent.outcome
    if not out.success:
        output_tokens, source = 0, "none"
    elif out.usage_output_tokens is not None:
        output_tokens, source = out.usage_output_tokens, "usage"
    elif counter.exact:
        output_tokens, source = counter.count(out.generated_text), "tokenizer"
    else:
        output_tokens, source = out.num_token_chunks, "chunks"
    expected_prompt_tokens = sent.prompt_tokens + counter.overhead_tokens
    return RequestRecord(
        request_id=sent.request_id,
        session_id=sent.session_id,
        turn_index=sent.turn_index,
        success=out.success,
        start_s=out.start_time_s - start_s,
        queue_s=out.start_time_s - sent.queued_at_s,
        prompt_tokens=out.usage_prompt_tokens or expected_prompt_tokens,
        output_tokens=output_tokens,
        ttft_s=out.ttft_s,
        latency_s=out.latency_s,
        itl_s=out.itl_s,
        failure_kind=out.failure_kind,
        error=out.error,
        http_status=out.http_status,
        max_output_tokens=sent.max_output_tokens,
        output_token_source=source,
        expected_prompt_tokens=expected_prompt_tokens,
        server_timing=out.server_timing,
        prompt_token_source="usage" if out.usage_prompt_tokens else "bench",
        label=sent.label,
    )


async def run_sessions(
    sessions: Sequence[Session],
    arrivals: ArrivalConfig,
    client: OpenAIStreamClient,
    counter: TokenCounter,
    *,
    on_done: OnDone | None = None,
    start_s: float | None = None,
) -> RunResult:
    """Send ``sessions`` at their arrival times (trace times or the arrival process), counted
    from ``start_s`` (on the loop clock, ``loadtest.clock``; default: now)."""
    times = arrival_times(arrivals, np.random.default_rng((arrivals.seed, 1)))
    slots: AbstractAsyncContextManager[object] = (
        asyncio.Semaphore(arrivals.max_concurrency) if arrivals.max_concurrency else nullcontext()
    )
    driver = _SessionDriver(client, slots, on_done)
    tasks: list[asyncio.Task[None]] = []
    start_s = now_s() if start_s is None else start_s
    for session in sessions:
        at_s = session.arrival_s if session.arrival_s is not None else next(times)
        if arrivals.duration_s is not None and at_s >= arrivals.duration_s:
            break
        delay_s = start_s + at_s - now_s()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        tasks.append(asyncio.create_task(driver.run(session)))
    await asyncio.gather(*tasks)
    duration_s = now_s() - start_s
    records = sorted((_record(s, start_s, counter) for s in driver.sent), key=lambda r: r.start_s)
    return RunResult(records=tuple(records), duration_s=duration_s)
