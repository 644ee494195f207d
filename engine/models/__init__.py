"""Model families (dense and MoE decoders) built from an HF ``config.json``."""

from engine.models.config import ModelArchConfig, RopeScaling
from engine.models.decoder import CausalLM, DecoderLayer
from engine.models.moe import MoELayer
from engine.models.registry import SUPPORTED_ARCHITECTURES, ArchSpec, MoESpec, get_arch_spec
from engine.models.weight_map import (
    WeightMap,
    WeightSlot,
    build_weight_map,
    canonical_checkpoint_shapes,
)

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "ArchSpec",
    "CausalLM",
    "DecoderLayer",
    "MoELayer",
    "MoESpec",
    "ModelArchConfig",
    "RopeScaling",
    "WeightMap",
    "WeightSlot",
    "build_weight_map",
    "canonical_checkpoint_shapes",
    "get_arch_spec",
]
