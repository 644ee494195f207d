"""Lockstep stepping over thread ranks with real engines: idle ranks, local errors, stop."""

from __future__ import annotations

import pytest

from core.config import EngineConfig, ModelConfig
from core.errors import ConfigError, UnavailableError
from core.sampling import SamplingParams
from engine import LLM, LLMEngine
from engine.expert_parallel import (
    ExpertPlacement,
    InProcCollective,
    InProcGroup,
    install_expert_parallel,
)
from engine.gangs import EPStepper, build_ep_stepper
from tests.unit.engine.expert_parallel.ranks import run_ranks

MODEL = ModelConfig(name="builtin:tiny-moe")
ENGINE = EngineConfig(max_model_len=256, block_size=8, kv_cache_memory_bytes=4 << 20)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPTS = [[5, 80, 81, 82, 99, 7], [300, 12, 13], [44] * 11]


def stepper(collective: InProcCollective) -> EPStepper[LLMEngine]:
    placement = ExpertPlacement.contiguous(8, collective.world_size)
    return build_ep_stepper(MODEL, ENGINE, collective, placement)


def add(ep: EPStepper[LLMEngine], prompts: list[list[int]], prefix: str) -> None:
    for i, prompt in enumerate(prompts):
        ep.engine.add_request(f"{prefix}{i}", prompt, GREEDY)


def finished_tokens(outputs) -> dict[str, list[int]]:
    return {o.request_id: list(o.token_ids) for o in outputs if o.finished}


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    """Single-rank greedy outputs with every expert local."""
    llm = LLM("builtin:tiny-moe", max_model_len=256, block_size=8)
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY)
    return {f"r{i}": list(o.token_ids) for i, o in enumerate(outs)}


def test_idle_rank_runs_empty_steps_and_outputs_match_single_rank(reference) -> None:
    def rank_fn(collective: InProcCollective) -> tuple[dict[str, list[int]], int, int]:
        ep = stepper(collective)
        if collective.rank == 0:
            add(ep, PROMPTS, "r")
        steps = empties = 0
        outputs = []
        while (result := ep.step()).gang_busy:
            steps += 1
            empties += result.ran_empty
            outputs.extend(result.outputs)
        return finished_tokens(outputs), steps, empties

    (tokens0, steps0, empty0), (tokens1, steps1, empty1) = run_ranks(2, rank_fn)
    assert tokens0 == reference
    assert tokens1 == {}
    assert steps0 == steps1 >= GREEDY.max_tokens
    assert empty0 == 0
    assert empty1 == steps1  # the idle rank took part in every forward with zero tokens


def test_run_until_idle_returns_on_the_same_step_everywhere(reference) -> None:
    def rank_fn(collective: InProcCollective) -> tuple[dict[str, list[int]], int]:
        ep = stepper(collective)
        add(ep, PROMPTS[: 2 - collective.rank], f"u{collective.rank}-")
        outputs = ep.run_until_idle(max_steps=50)
        return finished_tokens(outputs), ep.ep_model.num_forwards

    (tokens0, forwards0), (tokens1, forwards1) = run_ranks(2, rank_fn)
    assert tokens0 == {"u0-0": reference["r0"], "u0-1": reference["r1"]}
    assert tokens1 == {"u1-0": reference["r0"]}
    assert forwards0 == forwards1 == GREEDY.max_tokens


def test_a_local_step_error_before_the_forward_does_not_stall_the_peer(
    reference, monkeypatch: pytest.MonkeyPatch
) -> None:
    def rank_fn(collective: InProcCollective) -> tuple[dict[str, list[int]], list[str]]:
        ep = stepper(collective)
        add(ep, PROMPTS[collective.rank :: 2], f"rank{collective.rank}-")
        errors: list[str] = []
        if collective.rank == 0:
            engine = ep.engine
            real_schedule = engine.scheduler.schedule
            calls = iter(range(100))

            def flaky_schedule():
                if next(calls) == 2:
                    raise ConfigError("injected scheduling failure")
                return real_schedule()

            monkeypatch.setattr(engine.scheduler, "schedule", flaky_schedule)
        outputs = []
        while True:
            try:
                result = ep.step()
            except ConfigError as e:
                errors.append(e.message)
                continue
            outputs.extend(result.outputs)
            if not result.gang_busy:
                return finished_tokens(outputs), errors

    (tokens0, errors0), (tokens1, errors1) = run_ranks(2, rank_fn)
    assert errors0 == ["injected scheduling failure"]
    assert errors1 == []
    assert tokens0 == {"rank0-0": reference["r0"], "rank0-1": reference["r2"]}
    assert tokens1 == {"rank1-0": reference["r1"]}


def test_idle_gang_runs_no_forward_and_stop_is_agreed() -> None:
    def rank_fn(collective: InProcCollective) -> tuple[bool, int, bool, bool]:
        ep = stepper(collective)
        idle = ep.step()
        if collective.rank == 1:
            ep.request_stop()
        add(ep, PROMPTS[:1], "x")  # work is pending, but the gang stops first
        stopped = ep.step()
        return idle.gang_busy, ep.ep_model.num_forwards, stopped.stop_requested, stopped.gang_busy

    for busy, forwards, stop_requested, stopped_busy in run_ranks(2, rank_fn):
        assert (busy, forwards) == (False, 0)
        assert (stop_requested, stopped_busy) == (True, False)


def test_a_peer_that_leaves_fails_the_step_fast_and_for_good() -> None:
    def rank_fn(collective: InProcCollective) -> list[int]:
        ep = stepper(collective)
        if collective.rank == 1:
            collective.close()
            return []
        add(ep, PROMPTS[:1], "y")
        codes = []
        for _ in range(2):
            with pytest.raises(UnavailableError, match="peer rank left") as err:
                ep.step()
            codes.append(err.value.status_code)
        return codes

    assert run_ranks(2, rank_fn, timeout_s=30.0) == [[503, 503], []]


def test_install_refuses_mismatched_plans() -> None:
    model = LLM("builtin:tiny-moe", max_model_len=64, block_size=8).engine.parts.model
    alone = InProcGroup(1).member(0)
    with pytest.raises(ConfigError, match="placement is for 2 ranks"):
        install_expert_parallel(model, alone, ExpertPlacement.contiguous(8, 2))
    with pytest.raises(ConfigError, match="covers 4 experts"):
        install_expert_parallel(model, alone, ExpertPlacement.contiguous(4, 1))
    # Rank 1 of 2 must hold experts 4..7, but this model was loaded with all eight.
    with pytest.raises(ConfigError, match="rank 1 holds experts") as err:
        install_expert_parallel(model, InProcGroup(2).member(1), ExpertPlacement.contiguous(8, 2))
    assert err.value.param == "expert_ids"
    install_expert_parallel(model, alone, ExpertPlacement.contiguous(8, 1))
    with pytest.raises(ConfigError, match="already installed"):
        install_expert_parallel(model, alone, ExpertPlacement.contiguous(8, 1))


def test_ranks_with_different_placements_refuse_to_start() -> None:
    def rank_fn(collective: InProcCollective) -> str:
        placement = ExpertPlacement.contiguous(8, 2, {0: [1]} if collective.rank else None)
        with pytest.raises(ConfigError, match="different expert placements"):
            build_ep_stepper(MODEL, ENGINE, collective, placement)
        return "refused"

    assert run_ranks(2, rank_fn) == ["refused", "refused"]


def test_a_compiled_engine_is_refused_before_any_collective() -> None:
    compiled = ENGINE.model_copy(update={"compile_model": True})
    alone = InProcGroup(1).member(0)
    with pytest.raises(ConfigError, match="compile_model") as err:
        build_ep_stepper(MODEL, compiled, alone, ExpertPlacement.contiguous(8, 1))
    assert err.value.param == "compile_model"
