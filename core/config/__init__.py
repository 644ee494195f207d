"""The configuration schema: pydantic models, unknown keys rejected, every field described.

One schema for one YAML file, split by section: ``base`` (the strict base), ``engine`` (model and
engine), ``transfer`` (the KV data plane), ``cluster`` (pools, scheduler, server, Ray) and
``loadtest`` (``pdserve bench`` workloads). Import from ``core.config``.
"""

from core.config.base import DType, StrictModel
from core.config.cluster import ClusterConfig, RayClusterConfig, SchedulerConfig, ServerConfig
from core.config.engine import EngineConfig, ModelConfig
from core.config.fault_events import FaultControlConfig, FaultEventConfig
from core.config.kv_tiers import DiskTierConfig, HostTierConfig, KVTiersConfig, WritePolicy
from core.config.loadtest import (
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
from core.config.models import ServedModel, ServedModelConfig, pool_key, split_pool_key
from core.config.planner import PlannerConfig
from core.config.pools import (
    AutoscalingConfig,
    DecodePoolConfig,
    NodeSelectorConfig,
    PoolConfig,
    PrefillPoolConfig,
    Role,
)
from core.config.transfer import TransferConfig
from core.config.virtual_models import CascadeConfig, RouteRuleConfig, VirtualModelConfig

__all__ = [
    "ArrivalConfig",
    "AutoscalingConfig",
    "CascadeConfig",
    "ClusterConfig",
    "DType",
    "DecodePoolConfig",
    "DiskTierConfig",
    "EngineConfig",
    "FaultControlConfig",
    "FaultEventConfig",
    "HostTierConfig",
    "KVTiersConfig",
    "LengthConfig",
    "LoadTestConfig",
    "LoadTestTargetConfig",
    "LongShortMixWorkloadConfig",
    "ModelConfig",
    "MultiTurnWorkloadConfig",
    "NodeSelectorConfig",
    "PlannerConfig",
    "PoolConfig",
    "PrefillPoolConfig",
    "RandomWorkloadConfig",
    "RayClusterConfig",
    "Role",
    "RouteRuleConfig",
    "SchedulerConfig",
    "ServedModel",
    "ServedModelConfig",
    "ServerConfig",
    "SharedPrefixWorkloadConfig",
    "SloConfig",
    "StrictModel",
    "SweepConfig",
    "TraceWorkloadConfig",
    "TransferConfig",
    "VirtualModelConfig",
    "WritePolicy",
    "pool_key",
    "split_pool_key",
]
