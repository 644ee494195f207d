"""The LoRA adapter term: device beats host beats cold, a cold adapter goes to the least-loaded
replica, and an adapter's requests spill off its replica once it is busy."""

from __future__ import annotations

from cluster.routing.adapter_affinity import AdapterWeights, adapter_cost
from cluster.routing.policies import choose_least_loaded, choose_prefix_aware
from cluster.routing.policy_types import (
    CostWeights,
    HotSpotConfig,
    PoolRole,
    ReplicaLoad,
    RoutingInputs,
)

DECODE = CostWeights.for_role(PoolRole.DECODE)


def replica(rid: str, *, device: str = "", host: str = "", running: int = 0) -> ReplicaLoad:
    return ReplicaLoad(
        rid,
        num_running_requests=running,
        num_free_blocks=100,
        device_adapters=frozenset([device] if device else []),
        host_adapters=frozenset([host] if host else []),
    )


def choose(lora: str | None, *candidates: ReplicaLoad) -> str:
    inputs = RoutingInputs(PoolRole.DECODE, tuple(candidates), lora_name=lora)
    return choose_prefix_aware(inputs, DECODE, HotSpotConfig()).replica_id


def test_the_term_orders_device_host_cold() -> None:
    weights = AdapterWeights(host=2.0, cold=8.0)
    assert adapter_cost(replica("a", device="x"), "x", weights) == 0.0
    assert adapter_cost(replica("a", host="x"), "x", weights) == 2.0
    assert adapter_cost(replica("a", device="y"), "x", weights) == 8.0
    assert adapter_cost(replica("a"), None, weights) == 0.0


def test_a_request_goes_where_its_adapter_is_nearest() -> None:
    cold, host, device = replica("c"), replica("h", host="x"), replica("d", device="x")
    assert choose("x", cold, host, device) == "d"
    assert choose("x", cold, host) == "h"
    assert choose(None, replica("a", running=1), replica("b", device="x")) == "b"


def test_a_cold_adapter_goes_to_the_least_loaded_replica() -> None:
    busy, idle = replica("busy", running=3, device="y"), replica("idle", running=1)
    assert choose("x", busy, idle) == "idle"
    inputs = RoutingInputs(PoolRole.DECODE, (busy, idle), lora_name="x")
    assert choose_least_loaded(inputs, DECODE).replica_id == "idle"


def test_an_adapters_requests_spill_off_a_busy_replica() -> None:
    # decode weighs a request 2.0 and a cold adapter 8.0: 4 more requests tip it
    assert choose("x", replica("d", device="x", running=3), replica("o")) == "d"
    assert choose("x", replica("d", device="x", running=5), replica("o")) == "o"
