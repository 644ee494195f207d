"""Which configs make ``/ready`` wait for a prefill replica: only a pool that always keeps one."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.serve.ingress_setup import build_ingress_settings
from core.config import ClusterConfig
from engine.builtin import resolve_model


@pytest.mark.parametrize(
    ("prefill", "required"),
    [
        ({}, True),
        ({"num_replicas": 2}, True),
        ({"autoscaling": {"min_replicas": 1, "max_replicas": 2}}, True),
        ({"num_replicas": 0}, False),
        ({"autoscaling": {"min_replicas": 0, "max_replicas": 2}}, False),
        ({"autoscaling": {"min_replicas": 0, "max_replicas": 2, "initial_replicas": 1}}, False),
    ],
)
def test_ready_waits_for_prefill_only_when_the_pool_keeps_a_replica(
    prefill: dict[str, Any], required: bool
) -> None:
    config = ClusterConfig.model_validate(
        {"model": {"name": "builtin:tiny-llama"}, "prefill": prefill}
    )
    model_dir = resolve_model(config.primary.model.name)
    settings = build_ingress_settings(config, config.primary, model_dir, environ={})
    assert settings.prefill_required is required
