"""One bad request fails alone: an exception attributable to one request during a step (its
grammar, its penalties or logits processing, its sampling, non-finite logits in its row, its
output processing) ends that request with ``finish_reason`` ``"error"`` and frees its blocks,
while the rest of the batch finishes with the outputs of a run without it. A failure of the
forward itself still fails the whole step, and says so."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import torch

from core.errors import PdserveError
from core.sampling import SamplingParams
from engine import LLM
from engine.async_engine import AsyncEngine
from engine.engine import LLMEngine
from engine.model_runner import StepLogits
from engine.outputs import RequestOutput
from engine.sampling import penalties
from engine.sampling.row import SamplingRow
from engine.sampling.sampler import Sampler, make_generator

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=8, temperature=1.0, seed=11, ignore_eos=True)
MARKED = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, presence_penalty=0.125)
GOOD = {
    "a": ([5, 6, 7, 8, 9, 10], GREEDY),
    "b": ([40, 41, 42] * 6, GREEDY),
    "c": ([70, 71, 72, 73], SEEDED),
}
BAD_PROMPT = [100, 101, 102, 103, 104]

Inject = Callable[[LLMEngine, pytest.MonkeyPatch], None]


def run(
    requests: dict[str, tuple[list[int], SamplingParams]],
    async_scheduling: str,
    inject: Inject | None = None,
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> tuple[dict[str, RequestOutput], LLMEngine]:
    engine = LLM("builtin:tiny-llama", async_scheduling=async_scheduling).engine  # type: ignore[arg-type]
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    if inject is not None:
        assert monkeypatch is not None
        inject(engine, monkeypatch)
    finals: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        for output in engine.step():
            assert output.request_id not in finals, "an output after the final one"
            if output.finished:
                finals[output.request_id] = output
    return finals, engine


class ExplodingGrammar:
    """A grammar state whose mask or acceptance raises (as a broken matcher would)."""

    terminated = False

    def __init__(self, where: str) -> None:
        self.where = where

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        if self.where == "fill":
            raise RuntimeError("matcher state corrupted")

    def accept(self, token_id: int) -> bool:
        if self.where == "accept":
            raise RuntimeError("matcher rejected its own mask")
        return True


def grammar_fails(where: str) -> Inject:
    def inject(engine: LLMEngine, _: pytest.MonkeyPatch) -> None:
        engine.grammars._states["bad"] = ExplodingGrammar(where)  # type: ignore[assignment]

    return inject


def penalties_fail_for_marked_rows(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    real = penalties.apply

    def apply(logits: torch.Tensor, rows: Any) -> torch.Tensor:
        if any(row.params.presence_penalty == 0.125 for row in rows):
            raise ValueError("penalty table out of range")
        return real(logits, rows)

    monkeypatch.setattr(penalties, "apply", apply)


def generator_breaks(engine: LLMEngine, _: pytest.MonkeyPatch) -> None:
    engine._generators["bad"] = "not a generator"  # type: ignore[assignment]


def logits_go_nan(engine: LLMEngine, _: pytest.MonkeyPatch) -> None:
    real = engine.runner.execute

    def execute(scheduled: Any, pending: Any = None) -> StepLogits:
        out = real(scheduled, pending)
        if "bad" not in out.request_ids:
            return out
        logits = out.logits.clone()  # an inference tensor: written through a copy
        logits[out.request_ids.index("bad")] = float("nan")
        return StepLogits(out.request_ids, logits, out.prompt_logits)

    engine.runner.execute = execute  # type: ignore[method-assign]


def output_processing_fails(engine: LLMEngine, _: pytest.MonkeyPatch) -> None:
    real = engine.outputs.process

    def process(state: Any, update: Any, logprob: Any) -> Any:
        if update.request_id == "bad" and len(state.token_ids) >= 2:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "detokenizer tripped")
        return real(state, update, logprob)

    engine.outputs.process = process  # type: ignore[method-assign]


CASES: dict[str, tuple[SamplingParams, Inject, str]] = {
    "grammar mask": (SEEDED, grammar_fails("fill"), "sampling it failed"),
    "grammar accept": (GREEDY, grammar_fails("accept"), "its grammar failed on token"),
    "penalties": (MARKED, penalties_fail_for_marked_rows, "penalty table out of range"),
    "sampler": (SEEDED, generator_breaks, "sampling it failed"),
    "non-finite logits": (GREEDY, logits_go_nan, "not finite"),
    "output processing": (GREEDY, output_processing_fails, "processing its output failed"),
}


@pytest.mark.parametrize("async_scheduling", ["off", "on"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_row_fails_alone(
    case: str, async_scheduling: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    params, inject, cause = CASES[case]
    expected, _ = run(GOOD, async_scheduling)
    requests = {**GOOD, "bad": (BAD_PROMPT, params)}
    got, engine = run(requests, async_scheduling, inject, monkeypatch)
    for request_id in GOOD:
        assert got[request_id].outputs[0].token_ids == expected[request_id].outputs[0].token_ids
        assert got[request_id].error is None
    bad = got["bad"]
    assert bad.finished and bad.finish_reason == "error"
    assert bad.error is not None and "request bad" in bad.error and cause in bad.error
    stats = engine.scheduler.stats()
    assert stats.num_used_blocks == 0 and stats.num_running == 0 and not engine.has_unfinished()


def test_every_row_failing_alone_ends_each_request_and_the_engine_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    requests = {"bad": (BAD_PROMPT, MARKED), "bad2": ([9, 8, 7], MARKED)}
    got, engine = run(requests, "off", penalties_fail_for_marked_rows, monkeypatch)
    assert {rid: out.finish_reason for rid, out in got.items()} == {"bad": "error", "bad2": "error"}
    engine.add_request("after", [5, 6, 7], GREEDY)
    outputs: list[RequestOutput] = []
    while engine.has_unfinished():
        outputs += engine.step()
    assert outputs[-1].finished and outputs[-1].finish_reason == "length"


def test_a_failing_forward_still_fails_the_whole_step_and_says_so() -> None:
    engine = LLM("builtin:tiny-llama").engine

    def broken(*_: Any) -> StepLogits:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    engine.runner.execute = broken  # type: ignore[method-assign]
    async_engine = AsyncEngine(engine)

    async def one(request_id: str) -> None:
        async for _ in async_engine.generate(request_id, [5, 6, 7], GREEDY):
            pass

    async def both() -> list[BaseException | None]:
        return await asyncio.gather(one("x"), one("y"), return_exceptions=True)

    try:
        errors = asyncio.run(both())
    finally:
        async_engine.shutdown()
    for error in errors:
        assert isinstance(error, PdserveError)
        assert "whole batch, not for one request" in str(error) and "illegal memory" in str(error)
    assert engine.scheduler.stats().num_used_blocks == 0


def test_a_request_that_fails_alone_raises_in_its_own_stream_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = LLM("builtin:tiny-llama").engine
    penalties_fail_for_marked_rows(engine, monkeypatch)
    async_engine = AsyncEngine(engine)

    async def collect(request_id: str, params: SamplingParams) -> RequestOutput | BaseException:
        last: RequestOutput | None = None
        try:
            async for output in async_engine.generate(request_id, [5, 6, 7, 8], params):
                last = output
        except PdserveError as e:
            return e
        assert last is not None
        return last

    async def both() -> list[RequestOutput | BaseException]:
        return list(await asyncio.gather(collect("ok", GREEDY), collect("bad", MARKED)))

    try:
        ok, bad = asyncio.run(both())
    finally:
        async_engine.shutdown()
    assert isinstance(ok, RequestOutput) and ok.finish_reason == "length"
    assert isinstance(bad, PdserveError) and "request bad" in str(bad)


def test_the_sampler_puts_generators_back_before_it_samples_the_good_rows() -> None:
    """Isolation must not move a seeded neighbour's random stream: the good rows draw exactly
    what a batch without the failing row draws."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    params = SamplingParams(temperature=1.0, seed=5)

    def row(generator: Any) -> SamplingRow:
        return SamplingRow(
            params=params, num_generated_tokens=0, eos_token_ids=(), generator=generator
        )

    clean = Sampler(seed=1).sample(logits[[0, 2]], [row(make_generator(5)), row(make_generator(6))])
    sampler = Sampler(seed=1)
    isolated = sampler.sample_isolating_rows(
        logits, [row(make_generator(5)), row("broken"), row(make_generator(6))]
    )
    assert isolated.kept == (0, 2) and list(isolated.failures) == [1]
    assert isolated.sample is not None
    out = isolated.sample.to_output(isolated.sample.tensors())
    assert out.token_ids == clean.token_ids and out.finite == [True, True]
