"""The configuration schema: pydantic models, unknown keys rejected, every field described.

One schema for one YAML file, split by section: ``base`` (the strict base), ``engine`` (model and
engine), ``speculative`` (the engine's draft methods), ``transfer`` (the KV data plane),
``cluster`` (the root), ``pools``, ``models``, ``routing`` (routing and disaggregation),
``planner``, ``server``, ``ray_cluster``. Import
from ``core.config``; ``files`` reads any YAML into a schema (the load tester's own included).
"""

from core.config.base import DType, StrictModel
from core.config.cluster import ClusterConfig
from core.config.engine import EngineConfig, ModelConfig
from core.config.kv_tiers import DiskTierConfig, HostTierConfig, KVTiersConfig, WritePolicy
from core.config.models import ServedModel, ServedModelConfig, pool_key, split_pool_key
from core.config.planner import PlannerConfig
from core.config.pools import (
    AutoscalingConfig,
    DecodePoolConfig,
    EPLBConfig,
    KVFailurePolicy,
    NodeSelectorConfig,
    PoolConfig,
    PrefillPoolConfig,
    Role,
)
from core.config.ray_cluster import RayClusterConfig
from core.config.routing import DisaggregationConfig, HotPrefixConfig, RoutingConfig
from core.config.server import ServerConfig
from core.config.speculative import SpeculativeConfig, SpeculativeMethod
from core.config.transfer import TransferConfig
from core.config.virtual_models import CascadeConfig, RouteRuleConfig, VirtualModelConfig

__all__ = [
    "AutoscalingConfig",
    "CascadeConfig",
    "ClusterConfig",
    "DType",
    "DecodePoolConfig",
    "DisaggregationConfig",
    "DiskTierConfig",
    "EPLBConfig",
    "EngineConfig",
    "HostTierConfig",
    "HotPrefixConfig",
    "KVFailurePolicy",
    "KVTiersConfig",
    "ModelConfig",
    "NodeSelectorConfig",
    "PlannerConfig",
    "PoolConfig",
    "PrefillPoolConfig",
    "RayClusterConfig",
    "Role",
    "RouteRuleConfig",
    "RoutingConfig",
    "ServedModel",
    "ServedModelConfig",
    "ServerConfig",
    "SpeculativeConfig",
    "SpeculativeMethod",
    "StrictModel",
    "TransferConfig",
    "VirtualModelConfig",
    "WritePolicy",
    "pool_key",
    "split_pool_key",
]
