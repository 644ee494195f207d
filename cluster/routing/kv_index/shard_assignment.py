"""Which index shard follows which replica.

The index is sharded by **replica**, not by block hash: each replica's events, seq numbers,
snapshots and expiry live in exactly one shard (``shard_of`` its id), so a batch goes to one
shard whole, a shard restart resyncs only its own replicas, and the consistency rules of
``index`` hold per shard unchanged. A prompt's lookup then merges per-replica hits, which never
overlap between shards. Sharding by hash range would split every batch (and every replica's
sequence) over all shards and make a shard restart degrade every replica; sharding by model
would leave one hot model on one shard.
"""

from __future__ import annotations

import zlib


def shard_of(replica_id: str, num_shards: int) -> int:
    """The shard (``0 .. num_shards - 1``) that indexes ``replica_id``; stable across
    processes and restarts (CRC-32 of the id, not Python's salted ``hash``)."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    return zlib.crc32(replica_id.encode("utf-8", "surrogatepass")) % num_shards
