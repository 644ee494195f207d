"""Paged KV bookkeeping (tensor-free): block pool, prefix cache, block tables, KV events.

``storage`` (the KV tensor itself) is deliberately not re-exported so importing this package
never imports torch.
"""

from engine.kv.block_pool import NULL_BLOCK_ID, BlockPool, KVBlock
from engine.kv.event_publisher import KVEventCallback, KVEventPublisher
from engine.kv.kv_cache_manager import NO_HIT, ComputedBlocks, KVCacheManager

__all__ = [
    "NO_HIT",
    "NULL_BLOCK_ID",
    "BlockPool",
    "ComputedBlocks",
    "KVBlock",
    "KVCacheManager",
    "KVEventCallback",
    "KVEventPublisher",
]
