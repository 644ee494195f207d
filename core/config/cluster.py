"""The serving cluster (`pdserve up CONFIG`, configs/local.yaml): pools, scheduler, server.

Past 400 lines on purpose: these sections are validated against each other (prefill and decode
agreeing on block size and hash seed, autoscaling ranges against replica counts, the server's
limits against the engine's), and the cross-section checks read best next to the fields they
tie together. Sections with no such ties live in their own modules (engine, transfer, planner,
KV tiers, load tests).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from core.config.base import MIB, StrictModel
from core.config.engine import EngineConfig, ModelConfig
from core.config.planner import PlannerConfig
from core.config.transfer import TransferConfig

Role = Literal["prefill", "decode"]


class AutoscalingConfig(StrictModel):
    """A replica range that Ray Serve scales within on ongoing requests per replica."""

    min_replicas: int = Field(1, ge=0, description="Fewest replicas (0 lets a pool scale to 0).")
    max_replicas: int = Field(..., ge=1, description="Most replicas.")
    initial_replicas: int | None = Field(
        None, ge=0, description="Replicas at deploy time; None: min_replicas."
    )
    target_ongoing_requests: float = Field(
        2.0, gt=0.0, description="Ongoing requests per replica the autoscaler aims for."
    )
    upscale_delay_s: float = Field(
        30.0, ge=0.0, description="Load must stay high this long before adding replicas."
    )
    downscale_delay_s: float = Field(
        600.0, ge=0.0, description="Load must stay low this long before removing replicas."
    )

    @model_validator(mode="after")
    def _range_is_ordered(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) > max_replicas ({self.max_replicas})"
            )
        initial = self.initial_replicas
        if initial is not None and not self.min_replicas <= initial <= self.max_replicas:
            raise ValueError(
                f"initial_replicas ({initial}) must lie in [min_replicas, max_replicas] = "
                f"[{self.min_replicas}, {self.max_replicas}]"
            )
        return self


class NodeSelectorConfig(StrictModel):
    """Which Ray nodes a pool's replicas may run on: node labels and/or a custom resource."""

    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Ray node labels every replica's node must carry (Serve label_selector).",
    )
    resource: str | None = Field(
        None,
        min_length=1,
        description="A custom Ray resource only this pool's nodes advertise (e.g. prefill_node).",
    )
    resource_per_replica: float = Field(
        0.01,
        gt=0.0,
        description="Units of `resource` each replica claims; keep it small so it only steers.",
    )


class PoolConfig(StrictModel):
    """One role's Serve deployment: replica count or range, resources, placement, limits."""

    num_replicas: int | None = Field(
        None, ge=0, description="Fixed replica count; None: 1, or the autoscaling range."
    )
    autoscaling: AutoscalingConfig | None = Field(
        None, description="Replica range for the Serve autoscaler; exclusive with num_replicas."
    )
    num_cpus: float = Field(1.0, ge=0.0, description="Logical CPUs reserved per replica.")
    num_gpus: float = Field(0.0, ge=0.0, description="GPUs reserved per replica.")
    memory_bytes: int | None = Field(
        None, ge=1, description="Ray memory reservation per replica; None: none."
    )
    resources: dict[str, float] = Field(
        default_factory=dict, description="Other custom Ray resources reserved per replica."
    )
    node_selector: NodeSelectorConfig = Field(
        default_factory=lambda: NodeSelectorConfig.model_validate({}),
        description="Node labels / custom resource that keep this pool on its own nodes.",
    )
    engine: EngineConfig | None = Field(
        None,
        description="Engine options for this pool only; the keys set here override the "
        "top-level engine: section, the others keep its values.",
    )
    max_ongoing_requests: int = Field(
        32, ge=1, description="Requests one replica works on at once (Serve backpressure)."
    )
    max_queued_requests: int = Field(
        -1, ge=-1, description="Requests queued per caller before rejecting; -1: unbounded."
    )
    graceful_shutdown_timeout_s: float = Field(
        20.0, gt=0.0, description="How long a replica being removed may finish its requests."
    )
    expert_parallel: int = Field(
        1,
        ge=1,
        description="Ranks per expert-parallel gang (MoE models only): the pool runs as gangs "
        "of this many replicas, each owning its own requests and KV and 1/N of the experts; "
        "replica counts must be multiples of it. 1: no expert parallelism.",
    )
    ep_timeout_s: float = Field(
        60.0,
        gt=0.0,
        description="Expert-parallel gangs only: bound on the rendezvous and on every "
        "collective, so a stalled rank makes its peers fail (and the gang restart) this fast.",
    )

    @model_validator(mode="after")
    def _one_replica_mode(self) -> PoolConfig:
        if self.num_replicas is not None and self.autoscaling is not None:
            raise ValueError("set either num_replicas or autoscaling, not both")
        self._check_gang_multiples()
        if self.node_selector.resource and self.node_selector.resource in self.resources:
            raise ValueError(
                f"resource {self.node_selector.resource!r} is both the node_selector and "
                "in resources; keep it in node_selector only"
            )
        return self

    def _check_gang_multiples(self) -> None:
        """Serve starts and stops whole gangs: every replica count is a multiple of the gang."""
        size = self.expert_parallel
        if size == 1:
            return
        counts = {"num_replicas": self.num_replicas}
        if self.autoscaling is not None:
            counts = {
                "autoscaling.min_replicas": self.autoscaling.min_replicas,
                "autoscaling.max_replicas": self.autoscaling.max_replicas,
                "autoscaling.initial_replicas": self.autoscaling.initial_replicas,
            }
        for name, count in counts.items():
            if count is not None and count % size != 0:
                raise ValueError(
                    f"{name} ({count}) must be a multiple of expert_parallel ({size}): "
                    "replicas come in whole gangs"
                )
        if self.autoscaling is None and self.num_replicas is None:
            raise ValueError(
                f"expert_parallel ({size}) needs num_replicas (a multiple of it) or autoscaling"
            )

    @property
    def initial_replicas(self) -> int:
        """Replicas the pool starts with."""
        if self.autoscaling is not None:
            scaling = self.autoscaling
            return (
                scaling.min_replicas
                if scaling.initial_replicas is None
                else (scaling.initial_replicas)
            )
        return 1 if self.num_replicas is None else self.num_replicas

    @property
    def min_replicas(self) -> int:
        """Fewest replicas the pool runs: ``autoscaling.min_replicas``, else the fixed count."""
        if self.autoscaling is not None:
            return self.autoscaling.min_replicas
        return self.initial_replicas


class PrefillPoolConfig(PoolConfig):
    """The prefill pool: runs prompts, samples the first token, exports the KV."""

    @property
    def deployed(self) -> bool:
        """False for ``num_replicas: 0`` (colocated serving: every request prefills on decode)."""
        return self.autoscaling is not None or self.initial_replicas > 0


class DecodePoolConfig(PoolConfig):
    """The decode pool: pulls the KV, or prefills locally, and streams the tokens."""

    kv_failure_policy: Literal["recompute", "fail"] = Field(
        "recompute",
        description="On a failed KV pull: recompute the prompt locally, or fail the request.",
    )


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
    """One YAML file for a whole serving cluster (``pdserve up CONFIG``)."""

    model: ModelConfig = Field(..., description="The model both pools serve.")
    engine: EngineConfig = Field(
        default_factory=lambda: EngineConfig.model_validate({}),
        description="Engine options of both pools (each pool may override keys).",
    )
    prefill: PrefillPoolConfig = Field(
        default_factory=lambda: PrefillPoolConfig.model_validate({}),
        description="The prefill pool.",
    )
    decode: DecodePoolConfig = Field(
        default_factory=lambda: DecodePoolConfig.model_validate({}),
        description="The decode pool.",
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

    def pool_for(self, role: Role) -> PoolConfig:
        """The pool config of ``role``."""
        return self.prefill if role == "prefill" else self.decode

    def engine_for(self, role: Role) -> EngineConfig:
        """The engine options of ``role``: the top-level ones with the pool's overrides."""
        pool = self.pool_for(role)
        if pool.engine is None:
            return self.engine
        overrides = pool.engine.model_dump(include=pool.engine.model_fields_set)
        return EngineConfig.model_validate({**self.engine.model_dump(), **overrides})

    @model_validator(mode="after")
    def _pools_agree(self) -> ClusterConfig:
        roles: tuple[Role, Role] = ("prefill", "decode")
        engines = {role: self.engine_for(role) for role in roles}
        for key in ("block_size", "hash_seed"):
            mine, theirs = getattr(engines["prefill"], key), getattr(engines["decode"], key)
            if mine != theirs:
                raise ValueError(
                    f"prefill.engine.{key} ({mine}) must equal decode.engine.{key} ({theirs}): "
                    "the KV layouts and block hashes must match"
                )
        for role, engine in engines.items():
            ranks = self.pool_for(role).expert_parallel
            if engine.compile_model and ranks > 1:
                raise ValueError(
                    f"{role}: engine.compile_model cannot be combined with expert_parallel "
                    f"({ranks})"
                )
        if self.decode.autoscaling is None and self.decode.initial_replicas == 0:
            raise ValueError("decode needs at least one replica (decode.num_replicas >= 1)")
        if self.decode.autoscaling is not None and self.decode.autoscaling.min_replicas == 0:
            raise ValueError("decode.autoscaling.min_replicas must be >= 1")
        selectors = (self.prefill.node_selector, self.decode.node_selector)
        if selectors[0].resource and selectors[0].resource == selectors[1].resource:
            raise ValueError(
                f"prefill and decode select the same node resource {selectors[0].resource!r}"
            )
        if self.transfer.port and self.transfer.port == self.server.port:
            raise ValueError(f"transfer.port and server.port are both {self.server.port}")
        if self.scheduler.planner.mode != "off":
            unscaled = [r for r in roles if self.pool_for(r).autoscaling is None]
            if unscaled:
                raise ValueError(
                    f"scheduler.planner.mode {self.scheduler.planner.mode!r} sizes pools within "
                    f"their autoscaling ranges; give {' and '.join(unscaled)} an autoscaling range"
                )
        return self
