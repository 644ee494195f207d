"""The serving cluster (`pdserve up CONFIG`, configs/local.yaml): the root of the schema.

Each section has its own module (pools, models, virtual models, routing and disaggregation,
planner, transfer, server, Ray cluster); this one ties them together and checks what spans
sections: served names unique, virtual models naming served ones, the planner against the
pools' ranges, the transfer and HTTP ports apart, and the keys an older config may still use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, model_validator

from core.config.base import StrictModel
from core.config.engine import EngineConfig, ModelConfig
from core.config.models import (
    ROLES,
    ServedModel,
    ServedModelConfig,
    merge_engine,
    served_names,
)
from core.config.planner import PlannerConfig
from core.config.pools import DecodePoolConfig, PoolConfig, PrefillPoolConfig, Role
from core.config.ray_cluster import RayClusterConfig
from core.config.routing import MOVED_KEYS, DisaggregationConfig, RoutingConfig
from core.config.server import ServerConfig
from core.config.transfer import TransferConfig
from core.config.virtual_models import VirtualModelConfig
from core.errors import ConfigError


class ClusterConfig(StrictModel):
    """One YAML file for a whole serving cluster (``pdserve up CONFIG``).

    One model (``model:`` with ``prefill:`` and ``decode:``) or several (``models:``); the rest
    of pdserve reads :meth:`served_models`, which resolves both forms."""

    model: ModelConfig | None = Field(
        None, description="The model both pools serve (one-model form); exclusive with models."
    )
    models: tuple[ServedModelConfig, ...] = Field(
        (),
        description="Several models behind one endpoint, each with its own engine options and "
        "pools; a request's model field picks one (the first when it names none). Exclusive "
        "with model, prefill and decode.",
    )
    virtual_models: tuple[VirtualModelConfig, ...] = Field(
        (),
        description="Names (e.g. auto) whose requests are routed to one of the served models "
        "by rules and an optional cascade.",
    )
    engine: EngineConfig = Field(
        default_factory=lambda: EngineConfig.model_validate({}),
        description="Engine options of every pool (each model and pool may override keys).",
    )
    prefill: PrefillPoolConfig = Field(
        default_factory=lambda: PrefillPoolConfig.model_validate({}),
        description="The prefill pool (one-model form).",
    )
    decode: DecodePoolConfig = Field(
        default_factory=lambda: DecodePoolConfig.model_validate({}),
        description="The decode pool (one-model form).",
    )
    transfer: TransferConfig = Field(
        default_factory=lambda: TransferConfig.model_validate({}),
        description="The KV data plane between the pools.",
    )
    routing: RoutingConfig = Field(
        default_factory=lambda: RoutingConfig.model_validate({}),
        description="How requests are placed on replicas (and moved when one dies).",
    )
    disaggregation: DisaggregationConfig = Field(
        default_factory=lambda: DisaggregationConfig.model_validate({}),
        description="When a prompt prefills on the prefill pool and when on decode.",
    )
    planner: PlannerConfig = Field(
        default_factory=PlannerConfig,
        description="How both pools are sized together (off: Serve's autoscaler per pool).",
    )
    server: ServerConfig = Field(
        default_factory=lambda: ServerConfig.model_validate({}), description="The HTTP endpoint."
    )
    cluster: RayClusterConfig = Field(
        default_factory=lambda: RayClusterConfig.model_validate({}),
        description="The Ray cluster to run on.",
    )

    def served_models(self) -> tuple[ServedModel, ...]:
        """Every model served, in YAML order (the first answers requests naming none)."""
        if self.model is not None:
            return (ServedModel("", self.model, self.prefill, self.decode, self.engine),)
        return tuple(
            ServedModel(
                scope=entry.model.served_name or entry.model.name,
                model=entry.model,
                prefill=entry.prefill,
                decode=entry.decode,
                engine=merge_engine(self.engine, entry.engine),
                field_path=f"models[{i}].",
            )
            for i, entry in enumerate(self.models)
        )

    @property
    def primary(self) -> ServedModel:
        """The first model: the one requests without a model name go to."""
        return self.served_models()[0]

    def pool_for(self, role: Role) -> PoolConfig:
        """The first model's pool config of ``role``."""
        return self.primary.pool_for(role)

    def engine_for(self, role: Role) -> EngineConfig:
        """The engine options of the first model's ``role`` pool."""
        return self.primary.engine_for(role)

    @model_validator(mode="before")
    @classmethod
    def _no_moved_keys(cls, data: Any) -> Any:
        """An old ``scheduler:`` section is refused, naming where each of its keys went (a
        ``ConfigError`` straight through pydantic, so its ``param`` is the old key)."""
        if not isinstance(data, Mapping) or "scheduler" not in data:
            return data
        old = data["scheduler"]
        keys = [f"scheduler.{key}" for key in old] if isinstance(old, Mapping) and old else []
        moves = [f"{key} -> {MOVED_KEYS[key]}" for key in keys if key in MOVED_KEYS]
        where = "; ".join(moves) or ", ".join(f"{k} -> {v}" for k, v in MOVED_KEYS.items())
        raise ConfigError(
            "the scheduler: section was split into routing:, disaggregation: and planner: "
            f"(move {where})",
            param=keys[0] if keys else "scheduler",
        )

    @model_validator(mode="after")
    def _models_agree(self) -> ClusterConfig:
        self._check_model_form()
        models = self.served_models()
        for served in models:
            served.check()
        names = served_names(models)
        self._check_virtual_models(names)
        if self.transfer.port and self.transfer.port == self.server.port:
            raise ValueError(f"transfer.port and server.port are both {self.server.port}")
        planner = self.planner.mode
        if planner != "off" and len(models) > 1:
            raise ValueError(
                f"planner.mode {planner!r} sizes one model's pools; with several "
                "models use mode off (Serve's autoscaler per pool)"
            )
        if planner != "off":
            unscaled = [r for r in ROLES if self.pool_for(r).autoscaling is None]
            if unscaled:
                raise ValueError(
                    f"planner.mode {planner!r} sizes pools within their autoscaling "
                    f"ranges; give {' and '.join(unscaled)} an autoscaling range"
                )
        return self

    def _check_model_form(self) -> None:
        if (self.model is None) == (not self.models):
            raise ValueError("give either model: (one model) or models: (a list), not both")
        if self.models:
            stray = sorted({"prefill", "decode"} & self.model_fields_set)
            if stray:
                raise ValueError(
                    f"with models:, each model has its own pools: move {' and '.join(stray)} "
                    "into its models[i] entry"
                )

    def _check_virtual_models(self, names: dict[str, ServedModel]) -> None:
        seen: set[str] = set()
        for i, virtual in enumerate(self.virtual_models):
            at = f"virtual_models[{i}]"
            if virtual.name in names or virtual.name in seen:
                raise ValueError(f"{at}.name: {virtual.name!r} is already a served model name")
            seen.add(virtual.name)
            for field, model in virtual.models():
                if model not in names:
                    raise ValueError(
                        f"{at}.{field}: no served model is named {model!r} "
                        f"(served: {', '.join(names)})"
                    )
