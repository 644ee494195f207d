"""Rebalancing a live gang (two thread ranks, real engines): copies fetched from their owners,
outputs token-identical to a gang that never rebalances, no request lost and no KV leaked."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from core.config import EngineConfig, EPLBConfig, ModelConfig
from core.errors import ConfigError
from core.sampling import SamplingParams
from engine import LLMEngine
from engine.expert_parallel import ExpertPlacement, InProcCollective
from engine.expert_parallel.reshard import transfer_plan
from engine.expert_parallel.router_skew import skew_routing
from engine.gangs import EPStepper, build_ep_stepper
from tests.unit.engine.expert_parallel.ranks import run_ranks

MODEL = ModelConfig(name="builtin:tiny-moe")
ENGINE = EngineConfig(max_model_len=256, block_size=8, kv_cache_memory_bytes=4 << 20)
HOT_EXPERTS = (0, 1)  # both on rank 0 in the contiguous placement
PROMPTS = [[5, 80, 81, 82, 99, 7], [300, 12, 13], [44] * 11, [9, 8, 7, 6, 5, 4, 3, 2, 1]]


def test_transfer_plan_moves_only_new_copies_from_their_primaries() -> None:
    old = ExpertPlacement.contiguous(8, 2, redundant={5: [0]})
    new = ExpertPlacement.contiguous(8, 2, redundant={0: [1], 1: [1], 6: [0]})
    assert transfer_plan(old, new) == {(0, 1): (0, 1), (1, 0): (6,)}
    with pytest.raises(ConfigError, match="primary"):
        transfer_plan(old, ExpertPlacement(8, ((4, 5, 6, 7), (0, 1, 2, 3))))


def run_gang(eplb: EPLBConfig | None, max_tokens: int) -> list[dict[str, Any]]:
    """Both ranks serve their half of PROMPTS under skewed routing; per rank what happened."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    def rank_fn(collective: InProcCollective) -> dict[str, Any]:
        placement = ExpertPlacement.contiguous(8, collective.world_size)
        ep: EPStepper[LLMEngine] = build_ep_stepper(MODEL, ENGINE, collective, placement, eplb=eplb)
        assert skew_routing(ep.ep_model.model, HOT_EXPERTS, 4.0) > 0
        scheduler = ep.engine.scheduler
        free_before = scheduler.kv.num_free_blocks
        for i, prompt in enumerate(PROMPTS[collective.rank :: 2]):
            ep.engine.add_request(f"r{collective.rank}-{i}", prompt, params)
        tokens: dict[str, list[int]] = {}
        while (result := ep.step()).gang_busy:
            scheduler.kv.check_integrity()
            scheduler.check_integrity()
            tokens.update({o.request_id: list(o.token_ids) for o in result.outputs if o.finished})
        balancer = ep.balancer
        return {
            "tokens": tokens,
            "free_blocks": (free_before, scheduler.kv.num_free_blocks),
            "num_rebalances": balancer.num_rebalances if balancer else 0,
            "redundant": balancer.placement.redundant if balancer else (),
            "held": [layer.moe.expert_ids for layer in ep.ep_model.layers],
            "rows": [layer.moe.gate_up_proj.shape[0] for layer in ep.ep_model.layers],
            "computed": ep.ep_model.stats.snapshot()["total_tokens_per_expert"],
        }

    return run_ranks(2, rank_fn, timeout_s=60.0)


@pytest.fixture(scope="module")
def without_rebalance() -> list[dict[str, Any]]:
    return run_gang(None, max_tokens=12)


def test_outputs_match_a_gang_that_never_rebalances(without_rebalance) -> None:
    eplb = EPLBConfig(redundant_experts=2, rebalance_interval_steps=3)
    with_rebalance = run_gang(eplb, max_tokens=12)
    for rank in (0, 1):
        assert with_rebalance[rank]["tokens"] == without_rebalance[rank]["tokens"]
        assert len(with_rebalance[rank]["tokens"]) == 2
    assert with_rebalance[0]["num_rebalances"] == with_rebalance[1]["num_rebalances"] == 1
    assert with_rebalance[0]["redundant"] == ((), HOT_EXPERTS)
    # rank 1 now holds and computes copies of rank 0's hot experts, in every MoE layer
    assert all(held == (0, 1, 4, 5, 6, 7) for held in with_rebalance[1]["held"])
    assert all(rows == 6 for rows in with_rebalance[1]["rows"])
    assert with_rebalance[1]["computed"][0] > 0
    assert without_rebalance[1]["computed"][0] == 0


def test_repeated_rebalances_under_load_lose_no_request_and_leak_no_kv() -> None:
    eplb = EPLBConfig(redundant_experts=3, rebalance_interval_steps=2)
    ranks = run_gang(eplb, max_tokens=20)
    for rank, result in enumerate(ranks):
        assert sorted(result["tokens"]) == [f"r{rank}-0", f"r{rank}-1"]
        assert all(len(t) == 20 for t in result["tokens"].values())
        before, after = result["free_blocks"]
        assert after == before
    assert ranks[0]["num_rebalances"] == ranks[1]["num_rebalances"] >= 1
    assert ranks[0]["redundant"] == ranks[1]["redundant"]


def test_copies_hold_the_primary_weights_bit_for_bit() -> None:
    eplb = EPLBConfig(redundant_experts=2, rebalance_interval_steps=1)

    def rank_fn(collective: InProcCollective) -> dict[int, torch.Tensor]:
        placement = ExpertPlacement.contiguous(8, collective.world_size)
        ep = build_ep_stepper(MODEL, ENGINE, collective, placement, eplb=eplb)
        skew_routing(ep.ep_model.model, HOT_EXPERTS, 4.0)
        if collective.rank == 0:
            ep.engine.add_request("only", [1, 2, 3], SamplingParams(max_tokens=3))
        ep.run_until_idle(max_steps=20)
        moe = ep.ep_model.layers[-1].moe
        return {e: moe.down_proj[int(moe.global_to_local[e])].clone() for e in HOT_EXPERTS}

    primary, copy = run_ranks(2, rank_fn, timeout_s=60.0)
    for expert_id in HOT_EXPERTS:
        assert torch.equal(primary[expert_id], copy[expert_id])


def test_a_copy_budget_the_gang_cannot_hold_fails_at_build() -> None:
    eplb = EPLBConfig(redundant_experts=9, rebalance_interval_steps=1)  # 8 experts x 1 peer

    def rank_fn(collective: InProcCollective) -> str | None:
        placement = ExpertPlacement.contiguous(8, collective.world_size)
        try:
            build_ep_stepper(MODEL, ENGINE, collective, placement, eplb=eplb)
        except ConfigError as e:
            return e.param
        return None

    assert run_ranks(2, rank_fn, timeout_s=60.0) == ["eplb.redundant_experts"] * 2
