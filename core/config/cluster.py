"""The serving cluster (`pdserve up CONFIG`, configs/local.yaml): models, scheduler, server.

The pools live in ``pools.py``, a model with its two pools (and the checks between them) in
``models.py``, virtual model names in ``virtual_models.py``; this module ties them together and
checks what spans sections (served names unique, virtual models naming served ones, the
planner against the pools' ranges, the transfer and HTTP ports apart). Past 250 lines on
purpose: the scheduler, server and Ray sections are read by those checks, which read best next
to the fields they tie together.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from core.config.base import MIB, StrictModel
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
from core.config.transfer import TransferConfig
from core.config.virtual_models import VirtualModelConfig


class SchedulerConfig(StrictModel):
    """How the ingress routes a request and whether it disaggregates it."""

    policy: Literal["round_robin", "least_loaded", "prefix_aware"] = Field(
        "prefix_aware", description="How a prefill and a decode replica are picked."
    )
    local_prefill_threshold_tokens: int = Field(
        64,
        ge=0,
        description="Prompts whose uncached part is shorter prefill locally on decode; "
        "0: always disaggregate while a prefill replica is healthy.",
    )
    migration_limit: int = Field(
        3,
        ge=0,
        description="Times one request may move to another decode replica when the one "
        "streaming it dies, drains or stalls (it continues with the tokens already sent; "
        "greedy output unchanged). 0: such a request fails with a 503.",
    )
    planner: PlannerConfig = Field(
        default_factory=PlannerConfig,
        description="How both pools are sized together (off: Serve's autoscaler per pool).",
    )
    fallback_to_local_prefill: bool = Field(
        True,
        description="Prefill locally on decode when a remote prefill fails; else fail cleanly.",
    )
    prefill_failover_cooldown_s: float = Field(
        5.0,
        gt=0.0,
        description="With fallback_to_local_prefill: after a remote prefill fails for lack of "
        "capacity (dead replica, unavailable pool, timeout), prefill locally for this long "
        "before trying the pool again.",
    )


class ServerConfig(StrictModel):
    """The OpenAI-compatible HTTP endpoint (Serve's proxy plus the Ingress deployment)."""

    host: str = Field("127.0.0.1", description="Address the HTTP proxy binds.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port.")
    api_keys_env: str | None = Field(
        None, description="Environment variable holding comma-separated API keys; None: open."
    )
    api_keys_file: str | None = Field(
        None, description="File of API keys, one per line; exclusive with api_keys_env."
    )
    context_overflow: Literal["error", "truncate_left"] = Field(
        "error",
        description="A prompt that leaves no room for the requested max_tokens within "
        "max_model_len: error (a 400 with the numbers) or truncate_left (drop its oldest tokens "
        "until it fits, leaving room for max_tokens, or 16 tokens when none is requested).",
    )
    cache_salt_per_api_key: bool = Field(
        False,
        description="Salt every request's prefix-cache hashes with (a digest of) its API key, so "
        "tenants with different keys never share cached KV on any replica or tier (needs API "
        "keys). A request's own cache_salt is combined with it.",
    )
    num_replicas: int = Field(1, ge=1, description="Ingress replicas.")
    num_cpus: float = Field(0.5, ge=0.0, description="Logical CPUs reserved per Ingress replica.")
    max_in_flight_requests: int = Field(
        256, ge=1, description="Requests one Ingress replica serves at once; more get 429."
    )
    retry_after_s: float = Field(
        1.0, ge=0.0, description="Retry-After sent with a 429 when the server is overloaded."
    )
    max_n: int = Field(
        16,
        ge=1,
        description="Largest n and best_of one request may ask for (each is that many "
        "sequences; unbounded, one request could occupy the cluster).",
    )
    max_batch_prompts: int = Field(
        64, ge=1, description="Most prompts one /v1/completions request may batch."
    )
    max_request_body_bytes: int = Field(
        8 * MIB, ge=1024, description="Largest accepted request body; more gets 413."
    )
    prefill_timeout_s: float = Field(
        120.0, gt=0.0, description="Bound on one remote prefill call (prompt compute included)."
    )
    chunk_timeout_s: float = Field(
        120.0, gt=0.0, description="Bound on the wait for each next chunk of a decode stream."
    )
    request_timeout_s: float | None = Field(
        None, gt=0.0, description="End-to-end HTTP request timeout at the proxy; None: none."
    )
    proxy_location: Literal["HeadOnly", "EveryNode"] = Field(
        "HeadOnly", description="Where Serve runs HTTP proxies: the head only or every node."
    )
    max_header_bytes: int = Field(
        32 * 1024,
        ge=1024,
        description="Largest accepted request header block (names + values); more gets 400.",
    )
    public_routes: tuple[str, ...] = Field(
        (),
        description="Routes served without an API key when keys are set (e.g. /metrics for a "
        "scraper). /health and /ready never need one; everything else does.",
    )
    fault_injection: bool = Field(
        False,
        description="Serve POST /admin/faults, which kills a pool's replica or makes KV "
        "transfers fail or stall for a while (load tests that inject faults). Off: no such "
        "route. Never on in production; API keys apply to it when set.",
    )

    @model_validator(mode="after")
    def _one_key_source(self) -> ServerConfig:
        if self.api_keys_env and self.api_keys_file:
            raise ValueError("set at most one of api_keys_env and api_keys_file")
        if self.cache_salt_per_api_key and not (self.api_keys_env or self.api_keys_file):
            raise ValueError(
                "server.cache_salt_per_api_key needs API keys (api_keys_env or api_keys_file)"
            )
        return self


class RayClusterConfig(StrictModel):
    """Where the app runs: a local Ray started by the CLI or an existing cluster."""

    address: str = Field(
        "local",
        description="local: the CLI starts a Ray on this machine; auto: join the cluster this "
        "machine belongs to; ray://host:port: a remote cluster (deploys go to its dashboard).",
    )
    namespace: str = Field("pdserve", min_length=1, description="Ray namespace of the CLI.")
    app_name: str = Field("pdserve", min_length=1, description="Serve application name.")
    route_prefix: str = Field(
        "/",
        pattern=r"^/([A-Za-z0-9._~-]+(/[A-Za-z0-9._~-]+)*)?$",
        description="HTTP path prefix of this app on Serve's proxy (several apps can share a "
        "cluster and a port under different prefixes); the OpenAI routes live below it.",
    )
    dashboard_url: str | None = Field(
        None,
        description="Ray dashboard URL that deploys and scales go through; None: "
        "http://127.0.0.1:<dashboard_port> (local, auto) or http://HOST:8265 (ray://HOST:PORT).",
    )
    dashboard_port: int = Field(
        8265, ge=1, le=65535, description="Dashboard port of a local Ray (and of auto's head)."
    )
    num_cpus: int | None = Field(
        8, ge=1, description="Logical CPUs of a local Ray (more than the cores is fine)."
    )
    object_store_memory_bytes: int | None = Field(
        256 * MIB, ge=80 * MIB, description="Object store of a local Ray; None: Ray's default."
    )
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom resources a local Ray's node advertises."
    )
    labels: dict[str, str] = Field(
        default_factory=dict, description="Node labels a local Ray's node carries."
    )

    @model_validator(mode="after")
    def _address_form(self) -> RayClusterConfig:
        if self.address not in ("local", "auto") and not self.address.startswith("ray://"):
            raise ValueError(
                f"address {self.address!r} must be 'local', 'auto' or 'ray://host:port'"
            )
        if self.dashboard_url and not self.dashboard_url.startswith(("http://", "https://")):
            raise ValueError(f"dashboard_url {self.dashboard_url!r} must start with http(s)://")
        return self

    @property
    def is_local(self) -> bool:
        """True when the CLI starts (and stops) its own Ray."""
        return self.address == "local"

    def resolved_dashboard_url(self) -> str:
        """The dashboard URL deploys go to (see ``dashboard_url``)."""
        if self.dashboard_url:
            return self.dashboard_url.rstrip("/")
        if self.address.startswith("ray://"):
            host = self.address.removeprefix("ray://").rsplit(":", 1)[0]
            return f"http://{host}:8265"
        return f"http://127.0.0.1:{self.dashboard_port}"


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
    scheduler: SchedulerConfig = Field(
        default_factory=lambda: SchedulerConfig.model_validate({}),
        description="Routing policy and conditional disaggregation.",
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
        planner = self.scheduler.planner.mode
        if planner != "off" and len(models) > 1:
            raise ValueError(
                f"scheduler.planner.mode {planner!r} sizes one model's pools; with several "
                "models use mode off (Serve's autoscaler per pool)"
            )
        if planner != "off":
            unscaled = [r for r in ROLES if self.pool_for(r).autoscaling is None]
            if unscaled:
                raise ValueError(
                    f"scheduler.planner.mode {planner!r} sizes pools within their autoscaling "
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
