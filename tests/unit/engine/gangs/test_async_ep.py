"""An expert-parallel gang behind AsyncEngine (two thread ranks): greedy outputs equal the
single-rank engine whichever rank gets the requests, idle gangs back off in step, and a rank
that leaves makes its peer fail its requests with a typed error and stop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from core.config import EngineConfig, ModelConfig
from core.errors import ConfigError, UnavailableError
from core.sampling import SamplingParams
from engine import LLM
from engine.async_engine import AsyncEngine
from engine.engine_builder import ExpertParallelGang, build_async_engine
from engine.expert_parallel import InProcCollective, InProcGroup
from engine.gangs import LockstepOutput
from engine.gangs.lockstep_driver import LockstepDriver, expert_load_stats
from engine.outputs import RequestOutput
from tests.unit.engine.expert_parallel.ranks import run_ranks
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

MODEL = ModelConfig(name="builtin:tiny-moe")
ENGINE = EngineConfig(max_model_len=256, block_size=8, kv_cache_memory_bytes=4 << 20)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
LONG = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
PROMPTS = [[5, 80, 81, 82, 99, 7], [300, 12, 13], [44] * 11]
MAX_IDLE_S = 0.02


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    """Single-rank greedy outputs with every expert local."""
    llm = LLM("builtin:tiny-moe", max_model_len=256, block_size=8)
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    return [list(o.token_ids) for o in outs]


@pytest.fixture
def gang() -> Iterator[list[AsyncEngine]]:
    """Two ranks, each an AsyncEngine stepping in lockstep over an in-process group."""

    def build(collective: InProcCollective) -> AsyncEngine:
        gang = ExpertParallelGang(collective, max_idle_s=MAX_IDLE_S)
        return build_async_engine(MODEL, ENGINE, gang=gang)

    engines = run_ranks(2, build, timeout_s=10.0)
    try:
        yield engines
    finally:
        for engine in engines:
            engine.shutdown()


async def _tokens(engine: AsyncEngine, request_id: str, prompt: list[int]) -> list[int]:
    outputs = [out async for out in engine.generate(request_id, prompt, GREEDY)]
    return list(outputs[-1].token_ids)


@pytest.mark.parametrize("layout", ["rank1-idle", "both-busy"])
def test_outputs_match_single_rank(
    gang: list[AsyncEngine], reference: list[list[int]], layout: str
) -> None:
    ranks = [0, 0, 0] if layout == "rank1-idle" else [0, 1, 1]

    async def main() -> list[list[int]]:
        jobs = [
            _tokens(gang[rank], f"r{i}", prompt)
            for i, (rank, prompt) in enumerate(zip(ranks, PROMPTS, strict=True))
        ]
        return list(await asyncio.wait_for(asyncio.gather(*jobs), timeout=30))

    assert asyncio.run(main()) == reference
    loads = [expert_load_stats(engine) for engine in gang]
    stats = [s for s in loads if s is not None]
    assert [s.rank for s in stats] == [0, 1]
    assert all(s.expert_tokens_total > 0 for s in stats)  # the idle rank served experts
    assert all(s.all_to_all_bytes_total > 0 for s in stats)


def test_idle_gang_backs_off_in_step(gang: list[AsyncEngine]) -> None:
    drivers = [engine.driver for engine in gang]
    assert all(isinstance(d, LockstepDriver) for d in drivers)
    assert wait_until(lambda: all(d.wait_s() == MAX_IDLE_S for d in drivers), timeout_s=5)
    # The ranks stepped together: equal counts (give or take the step one is in right now).
    assert abs(drivers[0].num_steps - drivers[1].num_steps) <= 1
    # A request still starts promptly on a backed-off gang.
    tokens = asyncio.run(asyncio.wait_for(_tokens(gang[1], "late", PROMPTS[1]), timeout=10))
    assert len(tokens) == GREEDY.max_tokens


def test_a_rank_that_leaves_fails_its_peers_requests(gang: list[AsyncEngine]) -> None:
    async def main() -> None:
        stream = gang[0].generate("long", PROMPTS[2], LONG)
        first: RequestOutput = await asyncio.wait_for(anext(stream), timeout=10)
        assert not first.finished
        await asyncio.to_thread(gang[1].shutdown)  # rank 1 leaves the gang
        with pytest.raises(UnavailableError):
            async with asyncio.timeout(10):
                async for _ in stream:
                    pass
        with pytest.raises(UnavailableError):
            await gang[0].call(lambda e: None)

    asyncio.run(main())
    assert wait_until(lambda: not gang[0].is_running(), timeout_s=5)


class _ScriptedStepper:
    """Stands in for an EPStepper: replays a script of gang_busy values."""

    def __init__(self, busy: list[bool]) -> None:
        self._busy = iter(busy)
        self.collective = InProcGroup(1).member(0)

    def step(self) -> LockstepOutput:
        return LockstepOutput(gang_busy=next(self._busy))


def test_backoff_doubles_while_idle_and_resets_when_busy() -> None:
    script = [False, False, False, False, False, True, False]
    driver = LockstepDriver(_ScriptedStepper(script), min_idle_s=0.01, max_idle_s=0.05)  # type: ignore[arg-type]
    waits = [driver.wait_s()]
    for _ in script:
        driver.step()
        waits.append(driver.wait_s())
    assert waits == [0.0, 0.01, 0.02, 0.04, 0.05, 0.05, 0.0, 0.01]
    assert driver.num_steps == 7 and driver.num_idle_steps == 6


def test_bad_backoff_and_dense_models_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        LockstepDriver(_ScriptedStepper([]), min_idle_s=0.1, max_idle_s=0.05)  # type: ignore[arg-type]
    dense = ModelConfig(name="builtin:tiny-llama")
    with pytest.raises(ConfigError, match="at least 2 experts"):
        build_async_engine(dense, ENGINE, gang=ExpertParallelGang(InProcGroup(2).member(0)))
