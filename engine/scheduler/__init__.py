"""The continuous-batching scheduler and the step messages it produces (tensor-free)."""

from engine.scheduler.output import (
    ImportAllocation,
    PinnedBlocks,
    RequestUpdate,
    ScheduledRequest,
    SchedulerOutput,
    SchedulerStats,
)
from engine.scheduler.scheduler import Scheduler

__all__ = [
    "ImportAllocation",
    "PinnedBlocks",
    "RequestUpdate",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerOutput",
    "SchedulerStats",
]
