"""A load test's fault schedule (``events:`` in a ``pdserve bench`` workload YAML).

Each event fires ``at_s`` seconds after the run starts: ``kill_replica`` kills the busiest
replica of ``pool``; ``transfer_fail`` / ``transfer_stall`` make every prefill replica's KV
exports abort, or wait ``stall_per_chunk_s`` per chunk, for ``duration_s``; ``scale`` sets
``pool`` to ``replicas`` (what ``pdserve scale`` does). Kills and transfer faults go through
the server's ``/admin/faults`` (the app must run with ``server.fault_injection: true``);
scaling runs ``pdserve scale`` against ``control.app_name``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from core.config.base import StrictModel


class FaultEventConfig(StrictModel):
    """One fault injected during a load test."""

    at_s: float = Field(..., ge=0.0, description="Seconds after the run starts.")
    action: Literal["kill_replica", "transfer_fail", "transfer_stall", "scale"] = Field(
        ..., description="What happens."
    )
    pool: Literal["prefill", "decode"] | None = Field(
        None, description="The pool a kill_replica or scale acts on."
    )
    replicas: int | None = Field(None, ge=0, description="scale: the pool's new replica count.")
    duration_s: float = Field(
        5.0, gt=0.0, le=3600.0, description="transfer_fail / transfer_stall: how long it lasts."
    )
    stall_per_chunk_s: float = Field(
        0.5, gt=0.0, le=60.0, description="transfer_stall: wait before each KV chunk."
    )

    @model_validator(mode="after")
    def _needs_its_fields(self) -> FaultEventConfig:
        if self.action in ("kill_replica", "scale") and self.pool is None:
            raise ValueError(f"{self.action} needs a pool (prefill or decode)")
        if self.action == "scale" and self.replicas is None:
            raise ValueError("scale needs replicas")
        if self.action == "scale" and self.pool == "decode" and self.replicas == 0:
            raise ValueError("decode needs at least one replica")
        return self

    @property
    def effect_s(self) -> float:
        """How long the fault itself lasts (0 for an instant one)."""
        return self.duration_s if self.action.startswith("transfer_") else 0.0


class FaultControlConfig(StrictModel):
    """How the load tester reaches the cluster's control plane for scale events."""

    app_name: str = Field("pdserve", description="The app pdserve scale acts on.")
    dashboard_url: str | None = Field(
        None, description="Ray dashboard URL; None: what pdserve up recorded for the app."
    )
    ray_address: str = Field("auto", description="Ray address used with dashboard_url.")
    recovery_window_s: float = Field(
        5.0,
        gt=0.0,
        description="Requests started in a window this long must meet the TTFT/ITL targets "
        "for the latency to count as recovered after an event.",
    )
