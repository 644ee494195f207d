"""Several sequences for one HTTP request: ``n`` and ``best_of`` per prompt, a batch of prompts.

Each sequence is its own run through the pools (its own request id; a seeded prompt's choice
``j`` samples with ``seed + j``), so choices spread over replicas and, after the first, find
their prompt in the prefix cache. Whole responses gather every run concurrently and, with
``best_of``, keep the ``n`` sequences of each prompt with the highest cumulative logprob;
streams interleave the runs' deltas as they come, each tagged with its choice index
(``prompt * n + j``). Usage counts each prompt once and every generated token.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

from cluster.ingress.dispatch.deltas import Delta, RequestUsage
from cluster.ingress.dispatch.flow import RequestRun
from cluster.ingress.openai.schemas import GenerationRequest
from core.errors import SamplingParamsError
from core.messages import TokenLogprobs


@dataclass
class Sample:
    """One finished sequence: what a whole response shows of it."""

    prompt_index: int
    run: RequestRun
    text: str = ""
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()

    @property
    def cumulative_logprob(self) -> float:
        return sum(p.chosen.logprob for p in self.logprobs)


async def collect(run: RequestRun, prompt_index: int) -> Sample:
    """Drive ``run`` to its end; its text and logprobs."""
    sample = Sample(prompt_index, run)
    async with aclosing(run.events()) as events:
        async for delta in events:
            sample.text += delta.text
            sample.logprobs.extend(delta.logprobs)
            if delta.prompt_logprobs:
                sample.prompt_logprobs = delta.prompt_logprobs
    return sample


async def collect_all(runs: Sequence[tuple[int, RequestRun]]) -> list[Sample]:
    """Every run at once; the first failure cancels the rest (their streams close, which aborts
    them on their replicas) and is raised."""
    tasks = [asyncio.ensure_future(collect(run, index)) for index, run in runs]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def best(samples: Sequence[Sample], num_prompts: int, n: int) -> list[Sample]:
    """Per prompt, its ``n`` samples with the highest cumulative logprob (all when that is all
    there are), in prompt order."""
    chosen: list[Sample] = []
    for prompt in range(num_prompts):
        mine = [s for s in samples if s.prompt_index == prompt]
        if len(mine) > n:
            mine = sorted(mine, key=lambda s: s.cumulative_logprob, reverse=True)[:n]
        chosen.extend(mine)
    return chosen


async def interleaved(runs: Sequence[RequestRun]) -> AsyncGenerator[tuple[int, Delta], None]:
    """``(choice index, delta)`` from every run as they arrive; a run's failure closes the
    others and is raised. A single run is pulled lazily, as the client reads: its decode stream
    opens only after the first token went out."""
    if len(runs) == 1:
        async with aclosing(runs[0].events()) as events:
            async for delta in events:
                yield 0, delta
        return
    queue: asyncio.Queue[tuple[int, Delta | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, run: RequestRun) -> None:
        try:
            async with aclosing(run.events()) as events:
                async for delta in events:
                    await queue.put((index, delta))
            await queue.put((index, None))
        except BaseException as e:  # handed to the consumer, which raises it
            await queue.put((index, e))

    tasks = [asyncio.ensure_future(pump(i, run)) for i, run in enumerate(runs)]
    try:
        left = len(tasks)
        while left:
            index, item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def check_choices(body: GenerationRequest, max_n: int) -> None:
    """``n`` and ``best_of`` within the server's bound; ``best_of`` >= ``n``; no ``best_of``
    stream (the best are known only at the end)."""
    n, samples = body.num_choices, body.num_samples
    best_of = getattr(body, "best_of", None)
    if n > max_n:
        raise SamplingParamsError(f"n must be at most {max_n}, got {n}", param="n")
    if best_of is not None and best_of > max_n:
        raise SamplingParamsError(
            f"best_of must be at most {max_n}, got {best_of}", param="best_of"
        )
    if best_of is not None and best_of < n:
        raise SamplingParamsError(f"best_of ({best_of}) must be >= n ({n})", param="best_of")
    if body.stream and samples > n:
        raise SamplingParamsError("best_of > n cannot be streamed", param="best_of")


def total_usage(runs: Sequence[RequestRun], num_prompts: int) -> RequestUsage:
    """Each prompt's tokens once (its most-cached run's cache hits), every generated token."""
    per_prompt = len(runs) // max(num_prompts, 1)
    usage = RequestUsage(num_prompt_tokens=0)
    for prompt in range(num_prompts):
        mine = runs[prompt * per_prompt : (prompt + 1) * per_prompt]
        usage.num_prompt_tokens += mine[0].usage.num_prompt_tokens
        usage.num_cached_tokens += max(r.usage.num_cached_tokens for r in mine)
    usage.num_generated_tokens = sum(r.usage.num_generated_tokens for r in runs)
    usage.ttft_breakdown = runs[0].ttft_breakdown() if runs else None
    return usage
