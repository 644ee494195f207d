"""The tier-routing benchmark on a small workload: the tier-aware index keeps sessions where
their offloaded KV is, so it hits at least as much as a device-only index."""

from __future__ import annotations

import argparse

from benchmarks.kv_tier_routing import MODEL, serve_chat
from core.config import EngineConfig, ModelConfig
from engine.setup import build_engine_parts


def test_tier_index_hits_more_than_a_device_only_index() -> None:
    args = argparse.Namespace(
        sessions=5,
        turns=4,
        system_tokens=0,
        user_tokens=48,
        answer=16,
        device_blocks=24,
        host_blocks=200,
    )
    probe = EngineConfig(max_model_len=256, kv_cache_memory_bytes=4 << 20)
    block_bytes = build_engine_parts(ModelConfig(name=MODEL), probe).layout.block_bytes
    tier = serve_chat("tier_index", args, block_bytes)
    device = serve_chat("device_index", args, block_bytes)
    assert tier.hit_rate > device.hit_rate
