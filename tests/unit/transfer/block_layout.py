"""The KV layout the transfer tests move: small blocks, so a pull spans several chunks."""

from __future__ import annotations

from core.kv_layout import KVLayout

# 2 layers x 2 kv heads x 32 dims x fp32 x 2 (K, V) x 16 tokens = 16 KiB per block.
LAYOUT = KVLayout("test-model", "float32", 16, 2, 2, 32, 0)
