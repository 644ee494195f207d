"""Every YAML in configs/ is valid; the cluster schema rejects what it must; the builder and
the Serve option mapping do what the YAML says. No Ray cluster needed (these run in seconds)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray.autoscaler
import yaml
from pydantic import BaseModel
from ray.serve import Application

from cluster.ops.deploy_schema import IMPORT_PATH, deploy_schema, scaled_schema
from cluster.serve.app_builder import build_app
from cluster.serve.config_file import REPO_CONFIGS, config_to_mapping, load_cluster_config
from cluster.serve.ingress_setup import load_api_keys
from cluster.serve.pool_options import pool_deployment_options
from core import config as schema
from core.config import ClusterConfig
from core.errors import ConfigError

YAMLS = sorted(REPO_CONFIGS.glob("*.yaml"))
LAUNCHERS = [p for p in YAMLS if "cluster_name" in yaml.safe_load(p.read_text())]
PDSERVE_CONFIGS = [p for p in YAMLS if p not in LAUNCHERS]


def test_configs_directory_has_both_kinds() -> None:
    assert {p.name for p in PDSERVE_CONFIGS} >= {"local.yaml", "gpu-cluster.yaml"}
    assert {p.name for p in LAUNCHERS} >= {"ray-cluster-gpu.yaml"}


@pytest.mark.parametrize("path", PDSERVE_CONFIGS, ids=lambda p: p.name)
def test_every_pdserve_config_validates(path: Path) -> None:
    config = load_cluster_config(path)
    assert load_cluster_config(config_to_mapping(config)) == config


@pytest.mark.parametrize("path", LAUNCHERS, ids=lambda p: p.name)
def test_launcher_yaml_matches_ray_schema_and_its_pools(path: Path) -> None:
    launcher = yaml.safe_load(path.read_text())
    ray_schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(launcher, ray_schema)
    match = re.search(r"pdserve up (configs/[\w.-]+\.yaml)", path.read_text())
    assert match, "a launcher YAML names the pdserve config it runs"
    config = load_cluster_config(REPO_CONFIGS.parent / match.group(1))
    node_types = launcher["available_node_types"]
    hosts = {role: _node_types_for(pool, node_types) for role, pool in _pools(config)}
    assert hosts["prefill"] and hosts["decode"], hosts
    assert not hosts["prefill"] & hosts["decode"], "the pools must not share node types"
    assert launcher["head_node_type"] not in hosts["prefill"] | hosts["decode"]


def _pools(config: ClusterConfig) -> list[tuple[str, schema.PoolConfig]]:
    return [("prefill", config.prefill), ("decode", config.decode)]


def _node_types_for(pool: schema.PoolConfig, node_types: dict[str, Any]) -> set[str]:
    """Node types whose labels and resources satisfy the pool's selector and one replica."""
    selector = pool.node_selector
    found = set()
    for name, node in node_types.items():
        labels, resources = node.get("labels", {}), node["resources"]
        labelled = all(labels.get(k) == v for k, v in selector.labels.items())
        has_resource = not selector.resource or resources.get(selector.resource, 0) > 0
        fits = resources.get("GPU", 0) >= pool.num_gpus and resources.get("CPU", 0) >= pool.num_cpus
        if labelled and has_resource and fits:
            found.add(name)
    return found


def _all_models(root: type[BaseModel]) -> set[type[BaseModel]]:
    found, todo = set(), [root]
    while todo:
        model = todo.pop()
        found.add(model)
        for field in model.model_fields.values():
            args = getattr(field.annotation, "__args__", ()) or (field.annotation,)
            todo += [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            todo = [m for m in todo if m not in found]
    return found


def test_every_cluster_field_is_described() -> None:
    models = _all_models(ClusterConfig)
    assert {schema.PrefillPoolConfig, schema.AutoscalingConfig, schema.TransferConfig} <= models
    for model in models:
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"


def _error_of(data: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_cluster_config(data)
    return info.value


@pytest.mark.parametrize(
    ("data", "param", "words"),
    [
        ({"model": {"name": "m"}, "decode": {"replicas": 2}}, "decode.replicas", "Extra inputs"),
        ({"model": {"name": "m"}, "prefill": {"num_cpus": -1}}, "prefill.num_cpus", "greater"),
        ({"model": {"name": "m"}, "decode": {"kv_failure_policy": "retry"}}, "decode", "fail"),
        ({"model": {"name": "m"}, "routing": {"policy": "random"}}, "routing.policy", ""),
        (
            {
                "model": {"name": "m"},
                "prefill": {"num_replicas": 2, "autoscaling": {"max_replicas": 3}},
            },
            "prefill",
            "either num_replicas or autoscaling",
        ),
        (
            {
                "model": {"name": "m"},
                "prefill": {"autoscaling": {"min_replicas": 4, "max_replicas": 2}},
            },
            "prefill.autoscaling",
            "min_replicas (4) > max_replicas (2)",
        ),
        ({"model": {"name": "m"}, "decode": {"num_replicas": 0}}, "<root>", "decode needs"),
        (
            {"model": {"name": "m"}, "prefill": {"engine": {"block_size": 32}}},
            "<root>",
            "prefill.engine.block_size (32) must equal decode.engine.block_size (16)",
        ),
        (
            {"model": {"name": "m"}, "server": {"api_keys_env": "K", "api_keys_file": "f"}},
            "server",
            "at most one",
        ),
        ({"model": {"name": "m"}, "cluster": {"address": "10.0.0.1:6379"}}, "cluster", "ray://"),
    ],
    ids=[
        "unknown-key",
        "negative-cpus",
        "policy",
        "scheduler",
        "replicas-and-range",
        "range",
        "no-decode",
        "block-size",
        "two-key-sources",
        "address",
    ],
)
def test_bad_configs_name_the_field(data: dict[str, Any], param: str, words: str) -> None:
    error = _error_of(data)
    assert error.param is not None and error.param.startswith(param), error.message
    assert words in error.message


def test_pool_engine_overrides_only_the_keys_given() -> None:
    config = load_cluster_config(
        {
            "model": {"name": "m"},
            "engine": {"max_num_seqs": 7, "max_num_batched_tokens": 128},
            "prefill": {"engine": {"max_num_batched_tokens": 1024}},
        }
    )
    assert config.engine_for("prefill").max_num_batched_tokens == 1024
    assert config.engine_for("prefill").max_num_seqs == 7
    assert config.engine_for("decode").max_num_batched_tokens == 128
    assert load_cluster_config(config_to_mapping(config)).engine_for("prefill") == (
        config.engine_for("prefill")
    )


def test_pool_options_carry_resources_selectors_and_ranges() -> None:
    config = load_cluster_config(REPO_CONFIGS / "gpu-cluster.yaml")
    options = pool_deployment_options(config.prefill)
    actor = options["ray_actor_options"]
    assert actor["num_gpus"] == 1 and actor["num_cpus"] == 8
    assert actor["resources"] == {"prefill_node": 1}
    assert actor["label_selector"] == {"pdserve.io/pool": "prefill"}
    assert options["autoscaling_config"]["max_replicas"] == 8
    assert "num_replicas" not in options
    fixed = pool_deployment_options(load_cluster_config(REPO_CONFIGS / "local.yaml").decode)
    assert fixed["num_replicas"] == 1 and "autoscaling_config" not in fixed
    assert "label_selector" not in fixed["ray_actor_options"]


def test_build_app_takes_a_path_or_a_mapping() -> None:
    assert isinstance(build_app({"config": str(REPO_CONFIGS / "local.yaml")}), Application)
    mapping = config_to_mapping(load_cluster_config(REPO_CONFIGS / "local.yaml"))
    assert isinstance(build_app({"config": mapping}), Application)
    with pytest.raises(ConfigError, match="config"):
        build_app({})
    with pytest.raises(ConfigError, match="unknown application args"):
        build_app({"config": mapping, "replicas": 3})


def test_deploy_schema_and_in_place_scaling() -> None:
    config = load_cluster_config(REPO_CONFIGS / "local.yaml")
    body = deploy_schema(config, others={"other": {"name": "other", "import_path": "x:y"}})
    apps = {app["name"]: app for app in body["applications"]}
    assert apps["pdserve"]["import_path"] == IMPORT_PATH
    assert load_cluster_config(apps["pdserve"]["args"]["config"]) == config
    assert apps["other"] == {"name": "other", "import_path": "x:y"}
    scaled = scaled_schema(body, "pdserve", {"Prefill": 3})

    def ranges(schema: dict[str, Any]) -> dict[str, tuple[int, int]]:
        overrides = schema["applications"][-1]["deployments"]
        scaling = {d["name"]: d["autoscaling_config"] for d in overrides}
        return {name: (r["min_replicas"], r["max_replicas"]) for name, r in scaling.items()}

    assert ranges(scaled) == {"Prefill": (3, 3), "Decode": (1, 1)}
    again = scaled_schema(scaled, "pdserve", {"Prefill": 1})
    assert ranges(again) == {"Prefill": (1, 1), "Decode": (1, 1)}
    assert scaled["applications"][-1]["args"] == apps["pdserve"]["args"]  # same code version
    with pytest.raises(ConfigError):
        scaled_schema(body, "missing", {"Decode": 1})


def test_a_prefill_pool_of_zero_is_left_out_of_the_app() -> None:
    mapping = config_to_mapping(load_cluster_config(REPO_CONFIGS / "local.yaml"))
    colocated = {**mapping, "prefill": {"num_replicas": 0}, "decode": {"num_replicas": 2}}
    app = build_app({"config": colocated})
    pools = app._bound_deployment.init_args[0]
    assert list(pools) == ["smollm2"]
    prefill_handle, decode_handle = pools["smollm2"]
    assert prefill_handle is None and decode_handle is not None


def test_each_model_gets_its_own_named_pools() -> None:
    app = build_app({"config": str(REPO_CONFIGS / "local-multi-model.yaml")})
    pools = app._bound_deployment.init_args[0]
    names = {
        model: tuple(None if p is None else p._bound_deployment.name for p in pair)
        for model, pair in pools.items()
    }
    assert names == {
        "tiny-llama": (None, "Decode-tiny-llama"),
        "tiny-moe": ("Prefill-tiny-moe", "Decode-tiny-moe"),
    }
    router = pools["tiny-moe"][1]._bound_deployment._deployment_config.request_router_config
    assert router.request_router_kwargs["model"] == "tiny-moe"


def test_api_keys_come_from_the_named_file_or_variable(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("sk-one\n\n sk-two \n")
    from_file = schema.ServerConfig.model_validate({"api_keys_file": str(keys_file)})
    assert load_api_keys(from_file) == {"sk-one", "sk-two"}
    from_env = schema.ServerConfig.model_validate({"api_keys_env": "PDSERVE_TEST_KEYS"})
    assert load_api_keys(from_env, {"PDSERVE_TEST_KEYS": "a, b"}) == {"a", "b"}
    with pytest.raises(ConfigError, match="no API keys"):
        load_api_keys(from_env, {})
    assert load_api_keys(schema.ServerConfig.model_validate({})) == frozenset()
