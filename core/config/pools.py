"""A role's pool: replica count or autoscaling range, resources, node placement, limits.

Each model a cluster serves has a prefill and a decode pool of these (``core.config.models``);
the checks here concern one pool alone, the checks between pools live with the model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from core.config.base import StrictModel
from core.config.engine import EngineConfig

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
    look_back_period_s: float | None = Field(
        None,
        gt=0.0,
        description="The window over which Serve averages each replica's load (and pdserve's "
        "planner signals) before a decision; None: Serve's default (30 s). Shorter reacts "
        "sooner to a burst and flaps more.",
    )
    metrics_interval_s: float | None = Field(
        None,
        gt=0.0,
        description="How often each replica (and each router) reports its load to Serve's "
        "autoscaler (Serve's metrics_interval_s); None: Serve's default (10 s). A decision can "
        "only follow a burst once a report carries it.",
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


KVFailurePolicy = Literal["recompute", "fail"]
"""What a decode replica does when a KV pull fails: recompute the prompt locally, or fail."""


class EPLBConfig(StrictModel):
    """Expert-parallel load balancing: redundant copies of the hottest experts, re-planned
    from the gang's measured routing every ``rebalance_interval_steps`` lockstep steps."""

    redundant_experts: int = Field(
        0,
        ge=0,
        description="Extra expert copies over the whole gang, on top of each expert's one "
        "primary rank; each rank holds at most ceil(N / expert_parallel) of them. 0: off.",
    )
    rebalance_interval_steps: int = Field(
        256,
        ge=1,
        description="Lockstep steps between re-plans; each plan uses the tokens routed to each "
        "expert (all ranks, all MoE layers) during the steps since the previous one.",
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
    eplb: EPLBConfig = Field(
        default_factory=EPLBConfig,
        description="Expert-parallel gangs only: load balancing by redundant expert copies.",
    )

    @model_validator(mode="after")
    def _one_replica_mode(self) -> PoolConfig:
        if self.num_replicas is not None and self.autoscaling is not None:
            raise ValueError("set either num_replicas or autoscaling, not both")
        self._check_gang_multiples()
        if self.eplb.redundant_experts and self.expert_parallel == 1:
            raise ValueError(
                f"eplb.redundant_experts ({self.eplb.redundant_experts}) needs expert_parallel > 1"
            )
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

    kv_failure_policy: KVFailurePolicy = Field(
        "recompute",
        description="On a failed KV pull: recompute the prompt locally, or fail the request.",
    )
