"""Admission that cannot leak: a request is validated before it enters any queue, and any
exception once it is inside (whatever its type) removes it and frees its blocks on the spot —
through every entry point (``LLMEngine.add_request`` / ``add_import_request``, ``AsyncEngine``
``open`` / ``open_import`` / ``generate``, the offline ``LLM``) and through a failing step."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from core.errors import InvalidRequestError, PdserveError
from core.sampling import MAX_SEED, MIN_SEED, SamplingParams
from engine.async_engine import AsyncEngine
from engine.engine import LLMEngine
from engine.llm import LLM

pytestmark = pytest.mark.timeout(60)

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=4, temperature=0.9, seed=7, ignore_eos=True)
PROMPT = [5 + (i * 37) % 200 for i in range(40)]  # three blocks of 16: some full, one partial


class Injected(RuntimeError):
    """A plain exception (not a ``PdserveError``) raised where nothing expects one."""


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("builtin:tiny-llama", max_model_len=256, kv_cache_memory_bytes=4 << 20)


@pytest.fixture
def engine(llm: LLM) -> Iterator[LLMEngine]:
    """The module's engine; every test must leave its pool whole."""
    yield llm.engine
    assert_whole(llm.engine)


@pytest.fixture
def async_engine(engine: LLMEngine) -> Iterator[AsyncEngine]:
    """An ``AsyncEngine`` over the same engine, shut down before the pool is checked."""
    wrapped = AsyncEngine(engine)
    try:
        yield wrapped
    finally:
        wrapped.shutdown()


def assert_whole(engine: LLMEngine) -> None:
    """No request in the scheduler, every block free, the KV bookkeeping consistent."""
    scheduler = engine.scheduler
    stats = scheduler.stats()
    assert not engine.has_unfinished(), stats
    assert stats.num_pinned == 0 and stats.num_waiting_for_kv == 0, stats
    pool = scheduler.kv.pool
    assert pool.num_free_blocks == pool.num_usable_blocks, stats
    scheduler.kv.check_integrity()
    scheduler.check_integrity()


def fail_after(
    target: object,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    observe: Callable[[], object] | None = None,
) -> list[Any]:
    """Make ``target.name`` do its work, then raise :class:`Injected`. Returns, per call, what
    it returned (or ``observe()`` just after it), so a test can prove what the work left."""
    return _wrap(target, name, monkeypatch, observe=observe, then_raise=True)


def record(target: object, name: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record what each call of ``target.name`` returned; it behaves as before."""
    return _wrap(target, name, monkeypatch, observe=None, then_raise=False)


def _wrap(
    target: object,
    name: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    observe: Callable[[], object] | None,
    then_raise: bool,
) -> list[Any]:
    real = getattr(target, name)
    results: list[Any] = []

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        results.append(result if observe is None else observe())
        if then_raise:
            raise Injected(f"injected after {name}")
        return result

    monkeypatch.setattr(target, name, wrapper)
    return results


def run_to_end(engine: LLMEngine, request_id: str) -> list[int]:
    """Step until ``request_id`` finishes; its token ids."""
    while True:
        for output in engine.step():
            if output.request_id == request_id and output.finished:
                return list(output.token_ids)


# -- any signed 64-bit seed runs, and repeats ----------------------------------------------------


@pytest.mark.parametrize("seed", [-1, MIN_SEED, 0, MAX_SEED])
def test_signed_seeds_run_and_repeat(engine: LLMEngine, seed: int) -> None:
    params = SamplingParams(max_tokens=3, temperature=1.0, seed=seed, ignore_eos=True)
    engine.add_request("seed-first", PROMPT, params)
    first = run_to_end(engine, "seed-first")
    engine.add_request("seed-again", PROMPT, params)
    assert run_to_end(engine, "seed-again") == first
    assert len(first) == 3


# -- validation before any queue --------------------------------------------------------------


@pytest.mark.parametrize("bad", ["vocab", -1, True, 3.0])
def test_prompt_token_outside_the_vocab_is_refused_before_queueing(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch, bad: object
) -> None:
    token = engine.parts.arch.vocab_size if bad == "vocab" else bad
    calls = fail_after(engine.scheduler, "add_request", monkeypatch)
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request("oov", [*PROMPT, token], GREEDY)  # type: ignore[list-item]
    assert info.value.param == "prompt_token_ids"
    assert f"prompt_token_ids[{len(PROMPT)}]" in info.value.message
    assert calls == [] and engine.scheduler.get_request("oov") is None


def test_import_with_first_token_outside_the_vocab_is_refused(engine: LLMEngine) -> None:
    vocab_size = engine.parts.arch.vocab_size
    with pytest.raises(InvalidRequestError) as info:
        engine.add_import_request("oov-import", PROMPT, GREEDY, vocab_size)
    assert info.value.param == "first_token_id"
    assert engine.scheduler.get_request("oov-import") is None


def test_offline_batch_with_one_bad_prompt_queues_none(
    llm: LLM, engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fail_after(engine.scheduler, "add_request", monkeypatch)
    bad = [PROMPT, [*PROMPT, engine.parts.arch.vocab_size]]
    with pytest.raises(InvalidRequestError, match="prompt_token_ids"):
        llm.generate(prompt_token_ids=bad, sampling_params=GREEDY)
    assert calls == []


# -- LLMEngine: a failure after the scheduler accepted the request ----------------------------


@pytest.mark.parametrize("prefill_only", [False, True])
def test_add_request_failing_after_queueing_leaves_nothing(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch, prefill_only: bool
) -> None:
    queued = fail_after(engine.scheduler, "add_request", monkeypatch, observe=engine.has_unfinished)
    with pytest.raises(Injected):
        engine.add_request("orphan", PROMPT, SEEDED, prefill_only=prefill_only)
    assert queued == [True]  # the scheduler held it when the failure hit
    assert engine.step() == []  # nothing left to run (an orphan would pin its prompt here)
    assert_whole(engine)
    monkeypatch.undo()
    engine.add_request("orphan", PROMPT, SEEDED)  # the id is free again
    assert len(run_to_end(engine, "orphan")) == SEEDED.max_tokens


def test_add_import_request_failing_after_reserving_frees_its_blocks(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    allocations = fail_after(engine.scheduler, "add_import_request", monkeypatch)
    with pytest.raises(Injected):
        engine.add_import_request("import-orphan", PROMPT, SEEDED, first_token_id=9)
    assert len(allocations) == 1 and allocations[0].block_ids  # blocks were reserved
    assert_whole(engine)


def test_duplicate_id_refusal_leaves_the_first_request_running(engine: LLMEngine) -> None:
    engine.add_request("dup", PROMPT, GREEDY)
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request("dup", PROMPT, GREEDY)
    assert info.value.param == "request_id"
    assert len(run_to_end(engine, "dup")) == GREEDY.max_tokens


# -- LLMEngine: a step that fails for its batch -----------------------------------------------


def test_prefill_only_request_whose_sampling_fails_is_removed(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its sampling raises on its own row: it fails alone (nothing of it stays)."""
    fail_after(engine.sampler, "sample_on_device", monkeypatch)
    engine.add_request("prefill-fails", PROMPT, SEEDED, prefill_only=True)
    [output] = engine.step()
    assert output.finish_reason == "error" and output.error is not None
    assert "Injected" in output.error
    assert engine.scheduler.get_request("prefill-fails") is None
    assert engine.get_pinned_blocks("prefill-fails") is None


def test_prefill_only_request_pinned_before_output_processing_fails_is_freed(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned = fail_after(
        engine.outputs,
        "process",
        monkeypatch,
        observe=lambda: engine.get_pinned_blocks("pinned-fails") is not None,
    )
    engine.add_request("pinned-fails", PROMPT, GREEDY, prefill_only=True)
    [output] = engine.step()
    assert output.finish_reason == "error"
    assert pinned == [True]  # the step had pinned the prompt's blocks when it failed
    assert engine.get_pinned_blocks("pinned-fails") is None
    assert engine.scheduler.stats().num_used_blocks == 0


def test_prefill_only_request_whose_forward_fails_is_removed(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure no row owns (the forward) fails the whole step, and the request with it."""
    fail_after(engine.runner, "execute", monkeypatch)
    engine.add_request("forward-fails", PROMPT, SEEDED, prefill_only=True)
    with pytest.raises(Injected):
        engine.step()
    assert engine.scheduler.get_request("forward-fails") is None
    assert engine.get_pinned_blocks("forward-fails") is None


def test_offline_generate_with_a_failing_step_leaves_nothing(
    llm: LLM, engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_after(engine.runner, "execute", monkeypatch)
    with pytest.raises(Injected):
        llm.generate(prompt_token_ids=[PROMPT, PROMPT[:20]], sampling_params=SEEDED)


def test_offline_generate_whose_every_row_fails_returns_errors_and_leaves_nothing(
    llm: LLM, engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_after(engine.sampler, "sample_on_device", monkeypatch)
    outputs = llm.generate(prompt_token_ids=[PROMPT, PROMPT[:20]], sampling_params=SEEDED)
    assert [out.finish_reason for out in outputs] == ["error", "error"]
    assert not engine.has_unfinished()


# -- AsyncEngine: open / open_import / generate -----------------------------------------------


def test_async_open_failing_after_queueing_leaves_nothing(
    async_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_after(async_engine.engine.scheduler, "add_request", monkeypatch)

    async def main() -> None:
        with pytest.raises(Injected):
            await async_engine.open("async-orphan", PROMPT, SEEDED)
        await async_engine.call(assert_whole)

    asyncio.run(main())


def test_async_open_import_failing_after_reserving_leaves_nothing(
    async_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_after(async_engine.engine.scheduler, "add_import_request", monkeypatch)

    async def main() -> None:
        with pytest.raises(Injected):
            await async_engine.open_import("async-import", PROMPT, SEEDED, first_token_id=9)
        await async_engine.call(assert_whole)

    asyncio.run(main())


def test_async_generate_prefill_only_failing_after_queueing_leaves_nothing(
    async_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_after(async_engine.engine.scheduler, "add_request", monkeypatch)

    async def main() -> None:
        with pytest.raises(Injected):
            async for _ in async_engine.generate(
                "async-prefill", PROMPT, SEEDED, prefill_only=True
            ):
                pass
        await async_engine.call(assert_whole)
        monkeypatch.undo()
        outputs = [o async for o in async_engine.generate("async-prefill", PROMPT, GREEDY)]
        assert outputs[-1].finished and len(outputs[-1].token_ids) == GREEDY.max_tokens

    asyncio.run(main())


def test_async_open_failing_in_its_own_bookkeeping_leaves_nothing(
    async_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine admitted the request; the ``AsyncEngine``'s own step after it raises."""
    added = record(async_engine.engine, "add_request", monkeypatch)
    fail_after(async_engine, "_track", monkeypatch)

    async def main() -> None:
        with pytest.raises(Injected):
            await async_engine.open("bookkeeping", PROMPT, SEEDED, prefill_only=True)
        assert added == [None]
        await async_engine.call(assert_whole)

    asyncio.run(main())


def test_async_prefill_only_whose_sampling_fails_is_removed(
    async_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_after(async_engine.engine.sampler, "sample_on_device", monkeypatch)

    async def main() -> None:
        with pytest.raises(PdserveError, match="injected after sample"):
            async for _ in async_engine.generate("async-sample", PROMPT, SEEDED, prefill_only=True):
                pass
        await async_engine.call(assert_whole)

    asyncio.run(main())


def test_async_step_failure_removes_a_request_that_has_no_stream(
    async_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request added straight to the engine (no stream to fail) leaves with its failed step
    instead of failing every later step."""
    fail_after(async_engine.engine.sampler, "sample_on_device", monkeypatch)

    async def main() -> None:
        await async_engine.call(lambda e: e.add_request("streamless", PROMPT, SEEDED))
        with pytest.raises(PdserveError, match="injected after sample"):
            async for _ in async_engine.generate("streamed", PROMPT, SEEDED):
                pass
        await async_engine.call(assert_whole)

    asyncio.run(main())
