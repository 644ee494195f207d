"""The load tester's own schema: a ``pdserve bench`` workload file (``configs/loadtest/*.yaml``).

It lives with the load tester, not in ``core.config``: no replica needs it. The strict base and
the YAML loader are the cluster config's (``core.config``), so both read and fail alike.
"""

from loadtest.config.fault_events import FaultControlConfig, FaultEventConfig
from loadtest.config.workload import (
    ArrivalConfig,
    LengthConfig,
    LoadTestConfig,
    LoadTestTargetConfig,
    LongShortMixWorkloadConfig,
    MultiTurnWorkloadConfig,
    RandomWorkloadConfig,
    SharedPrefixWorkloadConfig,
    SloConfig,
    SweepConfig,
    TraceWorkloadConfig,
)

__all__ = [
    "ArrivalConfig",
    "FaultControlConfig",
    "FaultEventConfig",
    "LengthConfig",
    "LoadTestConfig",
    "LoadTestTargetConfig",
    "LongShortMixWorkloadConfig",
    "MultiTurnWorkloadConfig",
    "RandomWorkloadConfig",
    "SharedPrefixWorkloadConfig",
    "SloConfig",
    "SweepConfig",
    "TraceWorkloadConfig",
]
