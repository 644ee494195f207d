"""``pdserve upgrade``'s plan: routing-only changes restart nothing, a new checkpoint of the same
architecture replaces both pools of its model, what cannot be upgraded to is refused naming it;
the rolling order keeps each version within one replica of the P:D ratio."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.ops.upgrade_plan import (
    ModelIdentity,
    plan_upgrade,
    ratio_deviation,
    rolling_steps,
)
from cluster.serve.config_file import load_cluster_config
from core.config import ClusterConfig
from core.errors import UpgradeRefusedError

pytestmark = pytest.mark.timeout(10)

BASE: dict[str, Any] = {
    "model": {"name": "/models/llama-a", "served_name": "llama"},
    "prefill": {"num_replicas": 2},
    "decode": {"num_replicas": 4},
}
IDENTITIES = {
    "/models/llama-a": ModelIdentity("LlamaForCausalLM", 32000),
    "/models/llama-b": ModelIdentity("LlamaForCausalLM", 32000),
    "/models/qwen": ModelIdentity("Qwen2ForCausalLM", 151936),
}


def config(**changes: Any) -> ClusterConfig:
    return load_cluster_config({**BASE, **changes})


def plan(new: ClusterConfig) -> Any:
    return plan_upgrade(config(), new, IDENTITIES.__getitem__)


def test_nothing_changed_is_an_empty_plan() -> None:
    assert plan(config()).empty


def test_routing_and_planner_changes_apply_in_place() -> None:
    new = config(
        routing={"policy": "least_loaded"}, disaggregation={"local_prefill_threshold_tokens": 7}
    )
    upgrade = plan(new)
    assert upgrade.in_place == ("routing", "disaggregation")
    assert not upgrade.restarts and not upgrade.empty


def test_a_new_checkpoint_of_the_architecture_replaces_both_pools() -> None:
    upgrade = plan(config(model={"name": "/models/llama-b", "served_name": "llama"}))
    (model,) = upgrade.models
    assert model.restart_reasons == ("model",) and upgrade.restarts
    assert upgrade.in_place == ()


def test_engine_and_pool_size_changes() -> None:
    upgrade = plan(config(engine={"block_size": 32}, decode={"num_replicas": 6}))
    (model,) = upgrade.models
    assert model.restart_reasons == ("engine",)
    assert (model.num_prefill, model.num_decode) == (None, 6)


@pytest.mark.parametrize(
    ("changes", "param", "names"),
    [
        ({"model": {"name": "/models/qwen", "served_name": "llama"}}, "model.name", "Qwen2"),
        ({"model": {"name": "/models/llama-a", "served_name": "x"}}, "models", "['x']"),
        ({"server": {"port": 8123}}, "server", "pdserve down"),
    ],
)
def test_what_cannot_be_upgraded_to_is_refused_naming_it(
    changes: dict[str, Any], param: str, names: str
) -> None:
    with pytest.raises(UpgradeRefusedError) as info:
        plan(config(**changes))
    assert info.value.param == param
    assert names in info.value.message


@pytest.mark.parametrize(("num_prefill", "num_decode"), [(2, 4), (4, 1), (3, 5), (0, 2), (7, 7)])
def test_rolling_steps_keep_both_versions_within_one_replica_of_the_ratio(
    num_prefill: int, num_decode: int
) -> None:
    steps = rolling_steps(num_prefill, num_decode)
    assert len(steps) == num_prefill + num_decode  # one replica per step
    last = steps[-1]
    assert (last.num_new_prefill, last.num_new_decode) == (num_prefill, num_decode)
    for step in steps:
        new = (step.num_new_prefill, step.num_new_decode)
        old = (num_prefill - new[0], num_decode - new[1])
        for p, d in (new, old):
            assert ratio_deviation(p, d, num_prefill, num_decode) <= 1.0, (step, p, d)


def test_rolling_steps_of_two_prefill_four_decode() -> None:
    steps = [(s.num_new_prefill, s.num_new_decode) for s in rolling_steps(2, 4)]
    assert steps == [(1, 0), (1, 1), (1, 2), (2, 2), (2, 3), (2, 4)]


def test_routing_knobs_and_planner_thresholds_apply_in_place_the_rest_takes_a_redeploy() -> None:
    upgrade = plan(
        config(
            routing={
                "policy": "hot_prefix",
                "hot_prefixes": {"head_blocks": 2},
                "migration_limit": 1,
            },
            planner={"max_step": 4},
            virtual_models=[{"name": "auto", "default": "llama"}],
        )
    )
    assert upgrade.in_place == ("routing", "planner", "virtual_models")
    assert upgrade.ingress_fields == (
        "routing.policy",
        "routing.hot_prefixes",
        "routing.migration_limit",
        "planner.max_step",
        "virtual_models",
    )
    assert upgrade.redeploy_fields == () and not upgrade.restarts
    replicas_read = plan(config(routing={"kv_index_shards": 2, "kv_index_stride": 4}))
    assert replicas_read.redeploy_fields == ("routing.kv_index_shards", "routing.kv_index_stride")
    assert replicas_read.ingress_fields == ()


def test_the_planner_mode_and_profile_take_a_redeploy_its_thresholds_do_not() -> None:
    autoscaled = {"autoscaling": {"min_replicas": 1, "max_replicas": 4}}
    pools = {"prefill": autoscaled, "decode": autoscaled}
    running = config(**pools, planner={"mode": "load"})
    threshold = {"local_prefill_threshold_tokens": 7}
    tuned = config(
        **pools, planner={"mode": "load", "decode_kv_usage_target": 0.5}, disaggregation=threshold
    )
    upgrade = plan_upgrade(running, tuned, IDENTITIES.__getitem__)
    assert upgrade.ingress_fields == ("disaggregation", "planner.decode_kv_usage_target")
    assert upgrade.redeploy_fields == ()
    slo = config(**pools, planner={"mode": "slo", "profile": "capacity.json", "max_step": 3})
    upgrade = plan_upgrade(running, slo, IDENTITIES.__getitem__)
    assert upgrade.redeploy_fields == ("planner.mode", "planner.profile")
    assert upgrade.ingress_fields == ("planner.max_step",)
