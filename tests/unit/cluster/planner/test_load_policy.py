"""The load planner on synthetic metric streams: bursts, a shift to long prompts, idleness,
decode KV pressure and queues, step limits; the Serve policy object and the deploy schema."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.ops.deploy_schema import app_schema
from cluster.planner.load_policy import (
    PoolLoad,
    Reason,
    plan_decode,
    plan_prefill,
    prefill_demand,
)
from cluster.serve.planner_policy import POLICY_FUNCTION, PdservePlanner
from core.config import ClusterConfig, PlannerConfig
from tests.unit.cluster.planner.serve_context import FakeContext, FakeId, Window

CONFIG = PlannerConfig(
    mode="load", prefill_queue_tokens_per_replica=1000, decode_kv_usage_target=0.5, max_step=2
)


def run_stream(loads: list[dict[str, float]], start: int, plan: Any) -> list[tuple[int, Reason]]:
    """Feed a stream of load snapshots, each seeing the replicas the previous decision set."""
    replicas, out = start, []
    for sample in loads:
        decision = plan(PoolLoad(num_replicas=replicas, **sample), CONFIG)
        replicas = decision.target
        out.append((replicas, decision.reason))
    return out


def test_a_prefill_burst_scales_up_within_the_step_limit_then_settles() -> None:
    burst = [{"pending_prompt_tokens": 7000, "running": 8}] * 3
    burst += [{"pending_prompt_tokens": 2500, "running": 3}] * 3
    steps = run_stream(burst, start=1, plan=plan_prefill)
    assert [r for r, _ in steps] == [3, 5, 7, 5, 3, 3]  # +-2 per decision, then it settles
    assert [reason for _, reason in steps] == [
        Reason.STEP_LIMIT,
        Reason.STEP_LIMIT,
        Reason.PREFILL_BACKLOG,
        Reason.STEP_LIMIT,
        Reason.PREFILL_BACKLOG,
        Reason.STEADY,
    ]


def test_a_shift_to_long_prompts_grows_prefill_not_decode() -> None:
    prefill = plan_prefill(PoolLoad(2, pending_prompt_tokens=4000, running=2), CONFIG)
    decode = plan_decode(PoolLoad(2, kv_usage=0.5, running=4), CONFIG)
    assert (prefill.target, prefill.reason) == (4, Reason.PREFILL_BACKLOG)
    assert (decode.target, decode.reason) == (2, Reason.STEADY)


def test_idle_pools_ask_for_their_minimum_one_step_at_a_time() -> None:
    assert run_stream([{}] * 3, start=5, plan=plan_prefill) == [
        (3, Reason.STEP_LIMIT),
        (1, Reason.STEP_LIMIT),
        (0, Reason.IDLE),
    ]  # Serve clamps 0 to the pool's min_replicas and waits out downscale_delay_s
    assert plan_decode(PoolLoad(2), CONFIG).target == 0


def test_decode_grows_with_kv_pressure_queues_and_sequence_targets() -> None:
    assert plan_decode(PoolLoad(2, kv_usage=0.9, running=10), CONFIG).target == 4
    queued = plan_decode(PoolLoad(2, kv_usage=0.3, running=4, waiting=3), CONFIG)
    assert (queued.target, queued.reason) == (3, Reason.DECODE_QUEUE)
    by_seqs = PlannerConfig(mode="load", decode_seqs_per_replica=4, max_step=5)
    decision = plan_decode(PoolLoad(2, kv_usage=0.2, running=14, waiting=2), by_seqs)
    assert (decision.target, decision.reason) == (4, Reason.DECODE_SEQS)
    light = plan_decode(PoolLoad(4, kv_usage=0.1, running=2), CONFIG)
    assert (light.target, light.reason) == (2, Reason.STEP_LIMIT)


def test_the_serve_policy_decides_both_pools_and_leaves_others_alone() -> None:
    planner = PdservePlanner(CONFIG.model_dump(mode="json"))
    contexts = {
        FakeId("Prefill"): FakeContext(
            1, 1, {"pending_prompt_tokens": {"a": 2500.0}, "running": {"a": 3.0}}
        ),
        FakeId("Decode"): FakeContext(
            2, 2, {"kv_usage": {"b": 0.9, "c": 0.7}, "running": {"b": 6.0, "c": 5.0}}
        ),
        FakeId("Ingress"): FakeContext(1, 1),
    }
    targets, state = planner(contexts)
    by_name = {key.name: value for key, value in targets.items()}
    assert by_name == {"Prefill": 3, "Decode": 4, "Ingress": 1}
    assert {key.name: value["reason"] for key, value in state.items()} == {
        "Prefill": "prefill_backlog",
        "Decode": "kv_pressure",
    }


def test_prompts_queued_on_decode_bring_a_prefill_pool_back_from_zero() -> None:
    # a pool at zero reports nothing: decode's queue of prompts long enough to go remote
    # (mean 2,000 uncached tokens >= the 64-token threshold) is its demand
    planner = PdservePlanner(
        CONFIG.model_dump(mode="json"), disaggregation={"local_prefill_threshold_tokens": 64}
    )
    decode_metrics = {
        "pending_prompt_tokens": {"b": 1500.0, "c": 900.0},
        "prompt_len": {"b": 2000.0, "c": 0.0},
        "running": {"b": 4.0, "c": 3.0},
        "kv_usage": {"b": 0.4, "c": 0.4},
    }
    contexts = {
        FakeId("Prefill"): FakeContext(0, 0),
        FakeId("Decode"): FakeContext(2, 2, decode_metrics),
    }
    targets, state = planner(contexts)
    prefill = next(k for k in targets if k.name == "Prefill")
    assert targets[prefill] == 2  # ceil(2,400 / 1,000) = 3, one step of 2 from zero
    assert state[prefill]["reason"] == "step_limit"
    decode_metrics["pending_prompt_tokens"] = {"b": 600.0}
    targets, state = planner(contexts)
    assert (targets[prefill], state[prefill]["reason"]) == (1, "prefill_demand")
    # just after the pool went to zero, decode's window still holds the queue of before
    contexts[FakeId("Prefill")] = FakeContext(
        0, 0, last_scale_down_time=100.0, current_time=103.0, config=Window(5.0)
    )
    targets, state = planner(contexts)
    assert (targets[prefill], state[prefill]["reason"]) == (0, "idle")
    contexts[FakeId("Prefill")] = FakeContext(
        0, 0, last_scale_down_time=100.0, current_time=106.0, config=Window(5.0)
    )
    targets, state = planner(contexts)
    assert (targets[prefill], state[prefill]["reason"]) == (1, "prefill_demand")
    # prompts short enough to prefill on decode anyway are no demand: the pool stays at zero
    decode_metrics["prompt_len"] = {"b": 40.0}
    targets, state = planner(contexts)
    assert (targets[prefill], state[prefill]["reason"]) == (0, "idle")
    assert plan_prefill(prefill_demand(PoolLoad(2), 2000.0, 64), CONFIG).target == 0


def test_the_planner_is_deployed_as_the_apps_autoscaling_policy() -> None:
    pools = {"autoscaling": {"min_replicas": 1, "max_replicas": 4}}
    config = ClusterConfig.model_validate(
        {
            "model": {"name": "builtin:tiny-moe"},
            "prefill": pools,
            "decode": pools,
            "planner": {"mode": "load", "max_step": 1},
        }
    )
    policy = app_schema(config)["autoscaling_policy"]
    assert policy["policy_function"] == POLICY_FUNCTION
    assert policy["policy_kwargs"]["planner"]["max_step"] == 1
    threshold = config.disaggregation.local_prefill_threshold_tokens
    assert policy["policy_kwargs"]["disaggregation"]["local_prefill_threshold_tokens"] == threshold
    assert PdservePlanner(**policy["policy_kwargs"]).disaggregation == config.disaggregation
    assert "autoscaling_policy" not in app_schema(
        ClusterConfig.model_validate({"model": {"name": "builtin:tiny-moe"}})
    )
    with pytest.raises(ValueError, match="give prefill and decode an autoscaling range"):
        ClusterConfig.model_validate(
            {"model": {"name": "builtin:tiny-moe"}, "planner": {"mode": "load"}}
        )
