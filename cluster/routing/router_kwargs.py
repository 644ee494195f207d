"""A request router's settings: the JSON-shaped ``request_router_kwargs`` and their parsing.

Serve hands ``RequestRouterConfig.request_router_kwargs`` to ``initialize_state``; they must be
JSON-serialisable, so :class:`RouterSettings` is built from and written to plain dicts
(:meth:`RouterSettings.from_kwargs` / :meth:`RouterSettings.to_kwargs`). Invalid values raise
``ConfigError`` naming the key, so a bad YAML fails at deploy time, not at the first request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from cluster.routing.policy_registry import RoutingPolicy, make_policy
from cluster.routing.policy_types import CostWeights, HotSpotConfig, PoolRole
from core.config import HotPrefixConfig
from core.errors import ConfigError


@dataclass(frozen=True)
class RouterSettings:
    """Everything one pool's router needs besides what Serve gives it."""

    pool: PoolRole
    block_size: int  # the engines' (``engine.block_size``): cached blocks -> tokens
    model: str = ""  # the served model's scope (``ServedModel.scope``; empty: the only one)
    policy: str = "prefix_aware"
    weights: CostWeights | None = None  # None: the pool role's defaults
    hot_spot: HotSpotConfig = field(default_factory=HotSpotConfig)
    session_ttl_s: float = 300.0
    max_sessions: int = 100_000
    use_index: bool = True  # follow the KV index actor (off: load-only, e.g. no actor)
    namespace: str = "pdserve"
    poll_interval_s: float = 0.05
    index_app: str = ""  # the app whose KV index to follow (empty: the router's own)
    max_staleness_s: float = 5.0
    index_shards: int = 1  # ``routing.kv_index_shards``: how many index actors to follow
    index_stride: int = 1  # ``routing.kv_index_stride``: one block hash in this many indexed
    max_scored_candidates: int = 64  # past this, score the best holders and a random sample
    hot_prefixes: HotPrefixConfig = field(default_factory=HotPrefixConfig)  # ``hot_prefix``
    deliver_copies: bool = False  # ``hot_prefix``: call holder and target (off: copies wait)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> RouterSettings:
        """Parse ``request_router_kwargs``; unknown keys and bad values raise ``ConfigError``."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(
                f"unknown request router option(s) {', '.join(unknown)}",
                param=f"request_router_kwargs.{unknown[0]}",
            )
        values = dict(kwargs)
        try:
            values["pool"] = PoolRole(values.get("pool", ""))
        except ValueError as e:
            raise ConfigError(
                f"request router pool must be 'prefill' or 'decode', got {values.get('pool')!r}",
                param="request_router_kwargs.pool",
            ) from e
        values["weights"] = _nested(CostWeights, values.get("weights"), "weights")
        values["hot_spot"] = _nested(HotSpotConfig, values.get("hot_spot"), "hot_spot")
        if values["hot_spot"] is None:
            values["hot_spot"] = HotSpotConfig()
        values["hot_prefixes"] = _hot_prefixes(values.get("hot_prefixes"))
        if "block_size" not in values:
            raise ConfigError(
                "request router option block_size is required",
                param="request_router_kwargs.block_size",
            )
        settings = cls(**values)
        settings.make_policy()  # validates the policy name
        settings._check_ranges()
        return settings

    def _check_ranges(self) -> None:
        checks = {
            "block_size": isinstance(self.block_size, int) and self.block_size > 0,
            "session_ttl_s": self.session_ttl_s >= 0,
            "max_sessions": self.max_sessions >= 1,
            "poll_interval_s": self.poll_interval_s > 0,
            "max_staleness_s": self.max_staleness_s > 0,
            "index_shards": isinstance(self.index_shards, int) and self.index_shards >= 1,
            "index_stride": isinstance(self.index_stride, int) and self.index_stride >= 1,
            "max_scored_candidates": self.max_scored_candidates >= 2,
        }
        for key, ok in checks.items():
            if not ok:
                raise ConfigError(
                    f"request router option {key}={getattr(self, key)!r} is out of range",
                    param=f"request_router_kwargs.{key}",
                )

    def to_kwargs(self) -> dict[str, Any]:
        """The JSON-shaped ``request_router_kwargs`` for these settings."""
        data = dataclasses.asdict(self)
        data["pool"] = self.pool.value
        data["hot_prefixes"] = self.hot_prefixes.model_dump()
        return data

    def make_policy(self) -> RoutingPolicy:
        """A fresh policy instance (a router keeps its own: round robin has a counter)."""
        return make_policy(
            self.policy,
            weights=self.weights,
            hot_spot=self.hot_spot,
            hot_prefixes=self.hot_prefixes,
        )


def _hot_prefixes(value: Any) -> HotPrefixConfig:
    if value is None or isinstance(value, HotPrefixConfig):
        return value or HotPrefixConfig()
    try:
        return HotPrefixConfig.model_validate(value)
    except ValidationError as e:
        raise ConfigError(
            f"invalid hot_prefixes: {e}", param="request_router_kwargs.hot_prefixes"
        ) from e


def _nested(kind: type[Any], value: Any, key: str) -> Any:
    if value is None or isinstance(value, kind):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key} must be a mapping", param=f"request_router_kwargs.{key}")
    try:
        return kind(**value)
    except TypeError as e:
        raise ConfigError(f"invalid {key}: {e}", param=f"request_router_kwargs.{key}") from e
