"""Chained block hashes shared by the engine's prefix cache and the cluster's KV index.

``hash_block(parent, token_ids, extra_keys)`` is a deterministic 64-bit digest (blake2b over a
fixed little-endian encoding), identical across processes, machines and Python versions; it never
uses Python's salted ``hash``. The hash of block *i* covers every token of blocks 0..i through the
parent chain, so two prompts share a block hash exactly when they share the whole prefix.

A **cache salt** (a request's ``cache_salt``, or the tenant salt the ingress derives from an API
key) enters the root the chain starts from, so requests with different salts never share a
block hash: not in any engine's prefix cache or KV tier, not in the cluster index. This closes
the prefix-cache timing side channel between tenants (the reason vLLM added ``cache_salt``).
A request's **LoRA adapter** enters the root the same way: KV computed under one adapter is
never a prefix hit for another adapter or the base model.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BlockHash = int

HASH_ALGORITHM = "blake2b-64-v1"
"""The block-hash function's name; part of every KV layout fingerprint."""

_ROOT_TAG = b"pdserve-block-hash-v1"


def root_hash(seed: int = 0, salt: str | None = None, lora_name: str | None = None) -> BlockHash:
    """The parent of the first block; ``seed`` separates incompatible caches (model, layout),
    ``salt`` separates tenants (``None`` and ``""`` are the unsalted root), ``lora_name``
    separates the KV computed under a LoRA adapter from the base model's and other adapters'
    (``None``: the base model)."""
    data = _ROOT_TAG + struct.pack("<q", seed)
    if salt:
        data += b"\x01salt:" + salt.encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(data, digest_size=8).digest()
    root = int.from_bytes(digest, "little")
    if lora_name:  # a digest of the root, never the root of any salt
        root = hash_block(root, (), ("lora:" + lora_name,))
    return root


def hash_block(
    parent: BlockHash, token_ids: Sequence[int], extra_keys: Sequence[int | str] = ()
) -> BlockHash:
    """Hash one full block given its parent's hash, its token ids and optional extra keys."""
    h = hashlib.blake2b(digest_size=8)
    h.update(struct.pack("<Q", parent))
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    for key in extra_keys:
        encoded = key.encode() if isinstance(key, str) else struct.pack("<q", key)
        h.update(b"\x00" + encoded)
    return int.from_bytes(h.digest(), "little")


def hash_prompt_blocks(
    token_ids: Sequence[int],
    block_size: int,
    *,
    seed: int = 0,
    extra_keys: Sequence[int | str] = (),
    salt: str | None = None,
    lora_name: str | None = None,
) -> list[BlockHash]:
    """Chained hashes of every *full* block of ``token_ids`` (a partial tail block has none),
    from the root of ``seed``, ``salt`` and ``lora_name``."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    hashes: list[BlockHash] = []
    parent = root_hash(seed, salt, lora_name)
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[start : start + block_size], extra_keys)
        hashes.append(parent)
    return hashes
