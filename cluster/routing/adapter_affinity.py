"""The LoRA adapter term of a routing cost: where the request's adapter already is.

A request naming an adapter costs nothing extra on a replica holding it in a device slot, a
copy into a slot on one holding it in host memory, and a load from disk on one where it is cold
(in block-of-prefill units, like the rest of the cost). The term is bounded, so the load terms
beside it still spread an adapter's requests once its replicas are busy: its requests gather
where it is loaded without piling onto one replica. Cold everywhere (or a base-model request),
every candidate gets the same term and the least-loaded one wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster.routing.policy_types import ReplicaLoad


@dataclass(frozen=True)
class AdapterWeights:
    """What an adapter's residency costs, in uncached-block units (device is free)."""

    host: float = 2.0
    """Copying the adapter from host memory into a device slot."""
    cold: float = 8.0
    """Reading it from disk (and checking it), then the copy."""


DEFAULT_ADAPTER_WEIGHTS = AdapterWeights()


def adapter_cost(
    load: ReplicaLoad, lora_name: str | None, weights: AdapterWeights = DEFAULT_ADAPTER_WEIGHTS
) -> float:
    """The adapter term of ``load`` for a request under ``lora_name`` (None: 0)."""
    if lora_name is None or lora_name in load.device_adapters:
        return 0.0
    return weights.host if lora_name in load.host_adapters else weights.cold


def with_adapter_costs(
    costs: list[float],
    candidates: Sequence[ReplicaLoad],
    lora_name: str | None,
    weights: AdapterWeights = DEFAULT_ADAPTER_WEIGHTS,
) -> list[float]:
    """``costs`` (one per candidate, same order) plus each candidate's adapter term."""
    if lora_name is None:
        return costs
    return [
        cost + adapter_cost(load, lora_name, weights)
        for cost, load in zip(costs, candidates, strict=True)
    ]
