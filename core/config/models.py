"""The models a cluster serves: each with its own checkpoint, engine options and two pools.

A cluster YAML names one model (``model:`` with top-level ``prefill:`` / ``decode:``) or several
(``models:``, a list of :class:`ServedModelConfig`). Either way the rest of pdserve reads
:class:`ServedModel` s, the resolved form: engine options merged (top-level ``engine:``, then the
model's, then the pool's keys win), the names clients may send, and the model's *scope*, which
keeps its pools apart from other models' in the KV index, the stats board, the routers and the
Serve deployment names. A single-model cluster has the empty scope, so its pools keep the plain
names ``prefill`` and ``decode`` (and deployments ``Prefill`` and ``Decode``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from core.config.base import StrictModel
from core.config.engine import EngineConfig, ModelConfig
from core.config.lora import check_lora_modules
from core.config.pools import DecodePoolConfig, PoolConfig, PrefillPoolConfig, Role

ROLES: tuple[Role, Role] = ("prefill", "decode")


def pool_key(role: str, scope: str) -> str:
    """What a pool is called in the KV index, the stats board and its router: the role for a
    single-model cluster, ``role/model`` for one model of several."""
    return f"{role}/{scope}" if scope else role


def split_pool_key(key: str) -> tuple[str, str]:
    """``(role, scope)`` of a :func:`pool_key`."""
    role, _, scope = key.partition("/")
    return role, scope


def merge_engine(base: EngineConfig, override: EngineConfig | None) -> EngineConfig:
    """``base`` with the keys ``override`` sets (only those) replaced."""
    if override is None:
        return base
    changes = override.model_dump(include=override.model_fields_set)
    return EngineConfig.model_validate({**base.model_dump(), **changes})


class ServedModelConfig(StrictModel):
    """One entry of ``models:``: a model and the two pools that serve it."""

    model: ModelConfig = Field(..., description="The checkpoint and its served name.")
    engine: EngineConfig | None = Field(
        None,
        description="Engine options of this model; the keys set here override the top-level "
        "engine: section (and a pool's engine: overrides these).",
    )
    prefill: PrefillPoolConfig = Field(
        default_factory=lambda: PrefillPoolConfig.model_validate({}),
        description="This model's prefill pool (num_replicas: 0 serves it colocated).",
    )
    decode: DecodePoolConfig = Field(
        default_factory=lambda: DecodePoolConfig.model_validate({}),
        description="This model's decode pool.",
    )


@dataclass(frozen=True)
class ServedModel:
    """A model as the cluster serves it (resolved from either YAML form)."""

    scope: str
    """Keeps this model's pools apart (empty for a single-model cluster)."""
    model: ModelConfig
    prefill: PrefillPoolConfig
    decode: DecodePoolConfig
    engine: EngineConfig
    """The model's engine options before the pools' own overrides."""
    field_path: str = ""
    """Where this model sits in the YAML (``models[1].``), for error messages."""

    @property
    def name(self) -> str:
        """The canonical served name (``served_name``, else the model's ``name``)."""
        return self.model.served_name or self.model.name

    def pool_for(self, role: Role) -> PoolConfig:
        """The pool config of ``role``."""
        return self.prefill if role == "prefill" else self.decode

    def engine_for(self, role: Role) -> EngineConfig:
        """The engine options a ``role`` replica of this model runs with."""
        return merge_engine(self.engine, self.pool_for(role).engine)

    def pool_key(self, role: Role) -> str:
        """This model's ``role`` pool in the KV index, the board and the routers."""
        return pool_key(role, self.scope)

    def _check_tensor_parallel(self, role: Role, size: int) -> None:
        """A tensor-parallel pool: one GPU per rank, not with expert parallelism. Pools of
        different sizes exchange KV head by head (``core.tensor_parallel.plan_kv_pieces``), so
        any sizes that split the model pair up (``pdserve validate`` checks them against it)."""
        if size == 1:
            return
        at, pool = self.field_path, self.pool_for(role)
        if pool.expert_parallel > 1:
            raise ValueError(
                f"{at}{role}: engine.tensor_parallel_size ({size}) cannot be combined with "
                f"expert_parallel ({pool.expert_parallel}) yet"
            )
        if pool.num_gpus and pool.num_gpus != size:
            raise ValueError(
                f"{at}{role}.num_gpus ({pool.num_gpus:g}) must equal "
                f"{role}.engine.tensor_parallel_size ({size}): a tensor-parallel replica holds "
                "one GPU per rank"
            )

    def _check_lora(self, engines: dict[Role, EngineConfig]) -> None:
        """Both pools serve adapters alike: ``lora_modules`` needs ``enable_lora`` in both, and
        a pool with adapters and one without would split a request's prefill from its decode."""
        at = self.field_path
        enabled = {role: engine.enable_lora for role, engine in engines.items()}
        if enabled["prefill"] != enabled["decode"] and self.prefill.initial_replicas:
            raise ValueError(
                f"{at}prefill.engine.enable_lora ({enabled['prefill']}) must equal "
                f"{at}decode.engine.enable_lora ({enabled['decode']}): both pools apply a "
                "request's adapter"
            )
        if self.model.lora_modules and not enabled["decode"]:
            raise ValueError(f"{at}model.lora_modules needs engine.enable_lora: true")
        check_lora_modules(self.model.lora_modules, self.name, at)

    def check(self) -> None:
        """The checks between this model's two pools; ValueError naming the field."""
        at = self.field_path
        engines = {role: self.engine_for(role) for role in ROLES}
        for key in ("block_size", "hash_seed"):
            mine, theirs = getattr(engines["prefill"], key), getattr(engines["decode"], key)
            if mine != theirs:
                raise ValueError(
                    f"{at}prefill.engine.{key} ({mine}) must equal {at}decode.engine.{key} "
                    f"({theirs}): the KV layouts and block hashes must match"
                )
        self._check_lora(engines)
        for role, engine in engines.items():
            self._check_tensor_parallel(role, engine.tensor_parallel_size)
            ranks = self.pool_for(role).expert_parallel
            if engine.compile_model and ranks > 1:
                raise ValueError(
                    f"{at}{role}: engine.compile_model cannot be combined with expert_parallel "
                    f"({ranks})"
                )
        if self.decode.autoscaling is None and self.decode.initial_replicas == 0:
            raise ValueError(f"{at}decode needs at least one replica (num_replicas >= 1)")
        if self.decode.autoscaling is not None and self.decode.autoscaling.min_replicas == 0:
            raise ValueError(f"{at}decode.autoscaling.min_replicas must be >= 1")
        selectors = (self.prefill.node_selector, self.decode.node_selector)
        if selectors[0].resource and selectors[0].resource == selectors[1].resource:
            raise ValueError(
                f"{at}prefill and {at}decode select the same node resource "
                f"{selectors[0].resource!r}"
            )


def served_names(models: tuple[ServedModel, ...]) -> dict[str, ServedModel]:
    """Every name a client may send as ``model``, and the model it picks.

    The canonical names must be unique (ValueError naming the second one); a model's ``name``
    is also accepted when it differs from its served name and no other model claims it."""
    canonical: dict[str, ServedModel] = {}
    for served in models:
        if served.name in canonical:
            raise ValueError(
                f"{served.field_path}model.served_name: {served.name!r} is already the name of "
                f"{canonical[served.name].field_path or 'the'} model; served names must be unique"
            )
        canonical[served.name] = served
    names = dict(canonical)
    aliases = [s.model.name for s in models]
    for served in models:
        alias = served.model.name
        if alias not in canonical and aliases.count(alias) == 1:
            names[alias] = served
    return names
