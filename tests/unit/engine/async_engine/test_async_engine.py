"""AsyncEngine: one engine thread serving asyncio callers — streaming, aborts, idling while KV
is imported, surviving a failing step, and shutting down with every waiter released."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from core.errors import InvalidRequestError, PdserveError, PromptTooLongError, UnavailableError
from core.ids import new_request_id
from core.sampling import SamplingParams
from engine.async_engine import AsyncEngine
from engine.engine import LLMEngine
from engine.llm import LLM
from engine.outputs import RequestOutput
from tests.unit.engine.async_engine.tiny_engine import GREEDY, PROMPTS, check_integrity
from tests.waiting import async_wait_until

pytestmark = pytest.mark.timeout(60)

LONG = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)


@pytest.fixture
def engine(offline_llm: LLM, reference: dict[str, list[int]]) -> Iterator[AsyncEngine]:
    """A fresh AsyncEngine over the offline LLM's engine (references are computed first)."""
    async_engine = AsyncEngine(offline_llm.engine)
    try:
        yield async_engine
        if async_engine.is_running():
            asyncio.run(check_integrity(async_engine))
    finally:
        async_engine.shutdown()  # never leave a second thread on the shared engine
    stats = offline_llm.engine.scheduler.stats()
    assert stats.num_used_blocks == 0 and not offline_llm.engine.has_unfinished(), stats


async def _outputs(engine: AsyncEngine, prompt: list[int], params: SamplingParams) -> list:
    return [out async for out in engine.generate(new_request_id(), prompt, params)]


def test_generate_streams_one_output_per_step(
    engine: AsyncEngine, reference: dict[str, list[int]]
) -> None:
    outputs = asyncio.run(_outputs(engine, PROMPTS["len70"], GREEDY))
    assert [len(o.new_token_ids) for o in outputs] == [1] * len(reference["len70"])
    assert list(outputs[-1].token_ids) == reference["len70"]
    assert [o.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]


def test_concurrent_requests_from_two_event_loops(
    engine: AsyncEngine, reference: dict[str, list[int]]
) -> None:
    results: dict[str, list[int]] = {}

    def run(name: str) -> None:
        outputs = asyncio.run(_outputs(engine, PROMPTS[name], GREEDY))
        results[name] = list(outputs[-1].token_ids)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("len16", "len33", "len150")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert results == {n: reference[n] for n in ("len16", "len33", "len150")}


def test_call_runs_on_the_engine_thread(engine: AsyncEngine) -> None:
    name = asyncio.run(engine.call(lambda e: threading.current_thread().name))
    assert name == "pdserve-engine"


def test_closing_the_stream_aborts_the_request(engine: AsyncEngine) -> None:
    async def main() -> None:
        stream = engine.generate(new_request_id(), PROMPTS["len150"], LONG)
        for _ in range(3):
            assert not (await anext(stream)).finished
        assert engine.stats().num_used_blocks > 0
        await stream.aclose()
        assert await async_wait_until(lambda: engine.stats().num_used_blocks == 0)

    asyncio.run(main())


def test_cancelling_the_consumer_aborts_the_request(engine: AsyncEngine) -> None:
    async def main() -> None:
        seen = asyncio.Event()

        async def consume() -> None:
            async for _ in engine.generate(new_request_id(), PROMPTS["len150"], LONG):
                seen.set()

        task = asyncio.ensure_future(consume())
        await asyncio.wait_for(seen.wait(), timeout=10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await async_wait_until(lambda: engine.stats().num_used_blocks == 0)

    asyncio.run(main())


def test_abort_from_elsewhere_ends_the_stream(engine: AsyncEngine) -> None:
    async def main() -> list[RequestOutput]:
        request_id = new_request_id()
        outputs = []
        async for out in engine.generate(request_id, PROMPTS["len33"], LONG):
            outputs.append(out)
            if len(outputs) == 2:
                assert await engine.abort(request_id)
        assert not await engine.abort(request_id)
        return outputs

    outputs = asyncio.run(main())
    assert outputs[-1].finished and outputs[-1].finish_reason == "abort"
    assert outputs[-1].token_ids == outputs[-2].token_ids


def test_admission_errors_are_raised_and_leave_others_alone(engine: AsyncEngine) -> None:
    async def main() -> None:
        with pytest.raises(PromptTooLongError):
            await _outputs(engine, [3 + i % 250 for i in range(512)], GREEDY)
        request_id = new_request_id()
        stream = await engine.open(request_id, PROMPTS["len16"], GREEDY)
        with pytest.raises(InvalidRequestError):
            await engine.open(request_id, PROMPTS["len16"], GREEDY)
        outputs = [out async for out in stream]
        assert outputs[-1].finished and outputs[-1].finish_reason == "length"

    asyncio.run(main())


def test_idle_while_waiting_for_kv_does_not_step(
    engine: AsyncEngine, reference: dict[str, list[int]]
) -> None:
    steps = [0]
    original = engine.engine.step

    def counting_step() -> list[RequestOutput]:
        steps[0] += 1
        return original()

    async def main() -> None:
        await engine.call(lambda e: setattr(e, "step", counting_step))
        try:
            prompt, first = PROMPTS["len33"], reference["len33"][0]
            _, stream = await engine.open_import(new_request_id(), prompt, GREEDY, first)
            try:
                assert engine.stats().num_waiting_for_kv == 1
                for _ in range(50):  # each command wakes the loop; none may lead to a step
                    await engine.call(lambda e: None)
                assert steps[0] == 0
                await _outputs(engine, PROMPTS["len5"], GREEDY)  # a runnable request steps
                assert steps[0] == len(reference["len5"])
            finally:
                stream.close()
        finally:
            await engine.call(lambda e: delattr(e, "step"))

    asyncio.run(main())


def test_failing_step_fails_its_requests_and_keeps_serving(
    engine: AsyncEngine, reference: dict[str, list[int]]
) -> None:
    runner = engine.engine.runner
    original = runner.execute

    def fail_once(*args: object, **kwargs: object) -> object:
        del runner.execute  # back to the real method
        raise RuntimeError("injected step failure")

    async def main() -> None:
        prompt, first = PROMPTS["len33"], reference["len33"][0]
        _, importing = await engine.open_import(new_request_id(), prompt, GREEDY, first)
        await engine.call(lambda e: setattr(e.runner, "execute", fail_once))
        with pytest.raises(PdserveError, match="injected step failure"):
            await _outputs(engine, PROMPTS["len16"], GREEDY)
        assert engine.stats().num_waiting_for_kv == 1  # not in the batch: left alone
        importing.close()
        outputs = await _outputs(engine, PROMPTS["len16"], GREEDY)
        assert list(outputs[-1].token_ids) == reference["len16"]
        assert runner.execute == original

    asyncio.run(main())


def test_shutdown_releases_every_waiter(offline_llm: LLM, engine: AsyncEngine) -> None:
    async def main() -> None:
        stream = engine.generate(new_request_id(), PROMPTS["len150"], LONG)
        await anext(stream)
        await asyncio.to_thread(engine.shutdown)
        with pytest.raises(UnavailableError):
            async for _ in stream:
                pass
        with pytest.raises(UnavailableError):
            await engine.call(lambda e: None)
        engine.abort_soon("anything")  # fire-and-forget after shutdown: a no-op

    asyncio.run(main())
    assert not engine.is_running()
    llm_engine: LLMEngine = offline_llm.engine
    llm_engine.scheduler.check_integrity()
