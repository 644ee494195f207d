"""What Serve hands an application-level autoscaling policy, faked: deployment ids and each
deployment's ``AutoscalingContext`` (the fields pdserve's planner reads)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FakeId:
    name: str
    app_name: str = "pdserve"

    def __hash__(self) -> int:
        return hash(self.name)


@dataclass
class Window:
    look_back_period_s: float


@dataclass
class FakeContext:
    current_num_replicas: int
    target_num_replicas: int
    aggregated_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    capacity_adjusted_min_replicas: int = 0
    capacity_adjusted_max_replicas: int = 64
    last_scale_down_time: float | None = None
    current_time: float | None = None
    config: Window | None = None
