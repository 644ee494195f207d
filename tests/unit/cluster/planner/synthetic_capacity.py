"""A synthetic capacity model the slo planner tests plan with: round numbers, so every expected
replica count can be worked out by hand."""

from __future__ import annotations

from cluster.planner.capacity_model import CapacityModel, DecodePoint, PrefillPoint

# One prefill replica: 1000 tokens/s at any length (0.1 s per 100 tokens alone); decode ITL
# 10 ms + 1 ms per running sequence at 100 tokens of context, twice that at 1000.
MODEL = CapacityModel(
    model="m",
    device="cpu",
    prefill=(
        PrefillPoint(100, 1, 0.1),
        PrefillPoint(1000, 1, 1.0),
        PrefillPoint(100, 4, 0.4),
        PrefillPoint(1000, 4, 4.0),
    ),
    decode=(
        DecodePoint(1, 100, 0.011),
        DecodePoint(32, 100, 0.042),
        DecodePoint(1, 1000, 0.022),
        DecodePoint(32, 1000, 0.084),
    ),
)
