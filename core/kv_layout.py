"""The KV-cache layout contract between engine, transfer, prefill and decode.

KV storage is one tensor per worker, *block-major*::

    kv[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]   # 2 = (K, V)

so every block (all layers, K and V) is one contiguous byte span of ``block_bytes``: the
transfer layer moves a block with one copy, and attention reads layer ``l`` through the strided
view ``kv[:, l]``.

An 8-bit KV cache (``int8``, ``float8_e4m3fn``) keeps the same shape with each head row widened
by ``scale_bytes``: ``head_dim`` quantized values followed by that row's float16 scale (one scale
per token, layer, K/V and head). Scales travel inside the block, so transfers, tiers and the
prefix cache move quantized blocks as they are. A :class:`KVLayout` fingerprint travels with
every transfer handle; prefill and decode refuse to exchange blocks whose fingerprints differ.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace

from core.errors import LayoutMismatchError
from core.hashing import HASH_ALGORITHM

QUANTIZED_KV_SCALE_BYTES = 2
"""An 8-bit KV cache's scale after each head row: one float16."""

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8_e4m3fn": 1,
    "int8": 1,
}


@dataclass(frozen=True)
class KVLayout:
    """Everything that must match for one worker's KV blocks to be valid in another's."""

    model_id: str
    dtype: str
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    hash_seed: int
    """Seed of the chained block hashes (``EngineConfig.hash_seed``): equal layouts hash alike."""
    scale_bytes: int = 0
    """Bytes of scale after each head row (2: a float16 scale; 0: unquantized)."""
    tp_size: int = 1
    """Tensor-parallel ranks of the engine these blocks belong to; ``num_kv_heads`` is one
    rank's share (:mod:`engine.models.tp_shard`)."""
    tp_rank: int = 0
    """Which rank's KV heads these blocks hold."""
    total_kv_heads: int = 0
    """The model's KV heads before the split (0: ``num_kv_heads``, one rank)."""

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of ``dtype``."""
        return DTYPE_BYTES[self.dtype]

    @property
    def row_elements(self) -> int:
        """Elements of one stored head row: ``head_dim`` values plus the scale's bytes."""
        return self.head_dim + self.scale_bytes // self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """2 (K and V) x layers x kv_heads x (head_dim x dtype bytes + scale bytes)."""
        return 2 * self.num_layers * self.num_kv_heads * self.row_elements * self.dtype_bytes

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all layers, K and V."""
        return self.bytes_per_token * self.block_size

    def fingerprint(self) -> str:
        """A short stable digest of every field and of the block-hash algorithm."""
        named = {**asdict(self), "hash_algorithm": HASH_ALGORITHM}
        if self.tp_size == 1:  # one rank: the digest of the layouts before tensor parallelism
            del named["tp_size"], named["tp_rank"], named["total_kv_heads"]
        fields = sorted(named.items())
        text = "|".join(f"{k}={v}" for k, v in fields)
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()

    @property
    def model_kv_heads(self) -> int:
        """The model's KV heads, every rank's share together."""
        return self.total_kv_heads or self.num_kv_heads

    def unsplit(self) -> KVLayout:
        """The layout of the same blocks on one rank holding every KV head: what a prefill and a
        decode of different tensor-parallel sizes must agree on (its fingerprint is on every
        handle)."""
        if self.tp_size == 1:
            return self
        return replace(
            self, num_kv_heads=self.model_kv_heads, tp_size=1, tp_rank=0, total_kv_heads=0
        )

    def with_heads(self, num_kv_heads: int) -> KVLayout:
        """This layout narrowed to ``num_kv_heads`` of its heads (one shard of a pull)."""
        return replace(self, num_kv_heads=num_kv_heads)

    def check_compatible(self, other: KVLayout) -> None:
        """Raise :class:`LayoutMismatchError` naming every field that differs."""
        mine, theirs = asdict(self), asdict(other)
        diffs = [f"{k}: {mine[k]!r} != {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]
        if diffs:
            raise LayoutMismatchError("KV layouts differ: " + "; ".join(diffs))
