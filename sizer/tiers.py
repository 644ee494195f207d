"""Sessions per KV tier: the seeds' capacity arithmetic extended to host RAM and disk.

A replica holds ``floor(tier bytes / KV bytes per session)`` warm sessions in a tier, where a
session's KV is its context padded to whole blocks (the same ``kv_bytes_per_request`` the
device rows use; the engine stores whole blocks in every tier). The device row is the plan's
own ``max_concurrent_requests``; host and disk rows appear when their sizes are given
(``--host-gb``, ``--disk-gb``, per replica). A session parked in a lower tier costs nothing
while idle and comes back at the tier's load cost instead of a full prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import ConfigError
from sizer.gpus import GB
from sizer.kv_capacity import CapacityPlan


@dataclass(frozen=True)
class TierCapacity:
    """One tier of one replica: its bytes and how many sessions of each length fit."""

    medium: str
    bytes_per_replica: int
    sessions: int
    """Sessions of the request's context length."""
    sessions_by_context: tuple[tuple[int, int], ...]
    """``(context tokens, sessions)`` for each row of the capacity table."""


def tier_capacities(
    plan: CapacityPlan, *, host_gb: float | None, disk_gb: float | None
) -> tuple[TierCapacity, ...]:
    """Device first, then host and disk when sized; raises ``ConfigError`` on a size <= 0."""
    tp = plan.tensor_parallel_size
    tiers = [_tier("device", plan.kv_budget_bytes_per_gpu * tp, plan)]
    for medium, size_gb in (("host", host_gb), ("disk", disk_gb)):
        if size_gb is None:
            continue
        if size_gb <= 0:
            raise ConfigError(f"--{medium}-gb must be > 0, got {size_gb:g}", param=f"{medium}_gb")
        tiers.append(_tier(medium, round(size_gb * GB), plan))
    return tuple(tiers)


def _tier(medium: str, num_bytes: int, plan: CapacityPlan) -> TierCapacity:
    if medium == "device":  # the plan already rounds per GPU under tensor parallelism
        by_context = tuple((r.context_len_tokens, r.max_concurrent_requests) for r in plan.table)
        return TierCapacity(medium, num_bytes, plan.max_concurrent_requests, by_context)
    by_context = tuple(
        (row.context_len_tokens, num_bytes // max(row.kv_bytes_per_request, 1))
        for row in plan.table
    )
    return TierCapacity(
        medium, num_bytes, num_bytes // max(plan.kv_bytes_per_request, 1), by_context
    )
