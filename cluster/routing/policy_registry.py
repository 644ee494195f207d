"""The routing-policy contract and the registry of the names YAML may use.

``routing.policy`` in a cluster YAML is one of :func:`policy_names` (built in:
:data:`BUILTIN_POLICY_NAMES`); :func:`make_policy` turns the name (plus optional weights,
hot-spot thresholds and the ``hot_prefix`` policy's ``HotPrefixConfig``) into a
:class:`RoutingPolicy`. A new policy is a class with ``name`` and ``choose``, registered with
:func:`register_policy`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from cluster.routing.hit_minus_load import HotPrefixPolicy
from cluster.routing.policies import LeastLoadedPolicy, PrefixAwarePolicy, RoundRobinPolicy
from cluster.routing.policy_types import CostWeights, HotSpotConfig, RoutingDecision, RoutingInputs
from core.config import HotPrefixConfig
from core.errors import ConfigError


class RoutingPolicy(Protocol):
    """Ranks the candidate replicas of one request."""

    @property
    def name(self) -> str:
        """The registry name (a YAML value and a log/metrics label)."""
        ...

    def choose(self, inputs: RoutingInputs) -> RoutingDecision:
        """Return the decision for ``inputs``; must not block or do I/O (it runs on the
        router's event loop) and must rank every candidate exactly once."""
        ...


PolicyFactory = Callable[[CostWeights | None, HotSpotConfig], RoutingPolicy]

_REGISTRY: dict[str, PolicyFactory] = {
    "round_robin": lambda weights, hot_spot: RoundRobinPolicy(),
    "least_loaded": lambda weights, hot_spot: LeastLoadedPolicy(weights=weights),
    "prefix_aware": PrefixAwarePolicy,
    "hot_prefix": lambda weights, hot_spot: HotPrefixPolicy(HotPrefixConfig()),
}

BUILTIN_POLICY_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Make ``name`` usable in YAML; raises ``ValueError`` if it is taken."""
    if name in _REGISTRY:
        raise ValueError(f"routing policy {name!r} is already registered")
    _REGISTRY[name] = factory


def policy_names() -> list[str]:
    """Every registered policy name."""
    return list(_REGISTRY)


def make_policy(
    name: str,
    *,
    weights: CostWeights | None = None,
    hot_spot: HotSpotConfig | None = None,
    hot_prefixes: HotPrefixConfig | None = None,
) -> RoutingPolicy:
    """The policy registered as ``name``; ``weights`` None means the pool role's defaults;
    ``hot_prefixes`` configures ``hot_prefix`` (None: the schema's defaults)."""
    if name == "hot_prefix" and hot_prefixes is not None:
        return HotPrefixPolicy(hot_prefixes)
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ConfigError(
            f"unknown routing policy {name!r}; expected one of {', '.join(_REGISTRY)}",
            param="routing.policy",
        )
    return factory(weights, hot_spot or HotSpotConfig())
