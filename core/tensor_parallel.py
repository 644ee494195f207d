"""Which tensor-parallel sizes split a model: the one rule the engine, the sizer and the config
checks share.

Attention heads split evenly over the ranks; KV heads split evenly too, or — when there are fewer
KV heads than ranks — each is replicated on ``size / num_kv_heads`` ranks, so one of the two
counts must divide the other; the MLP width splits evenly (when known). Between two gangs of
different sizes the KV moves head by head (:func:`plan_kv_pieces`), so any two sizes that split
the model can exchange KV.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


def tp_split_problem(
    size: int, num_heads: int, num_kv_heads: int, intermediate_size: int | None = None
) -> str | None:
    """Why ``size`` ranks cannot split the model, naming the numbers; None when they can."""
    if size < 1:
        return f"tensor_parallel_size must be >= 1, got {size}"
    if size == 1:
        return None
    if num_heads % size:
        return f"tensor_parallel_size={size} does not divide the {num_heads} attention heads"
    if num_kv_heads % size and size % num_kv_heads:
        return (
            f"tensor_parallel_size={size} and the {num_kv_heads} KV heads: one must divide "
            "the other"
        )
    if intermediate_size is not None and intermediate_size % size:
        return f"tensor_parallel_size={size} does not divide the MLP width {intermediate_size}"
    return None


def kv_head_range(rank: int, size: int, num_kv_heads: int) -> tuple[int, int]:
    """(first KV head, number of KV heads) rank ``rank`` of ``size`` holds: an even share, or
    with fewer KV heads than ranks the one head its query heads read (replicated on
    ``size / num_kv_heads`` consecutive ranks)."""
    if num_kv_heads >= size:
        count = num_kv_heads // size
        return rank * count, count
    return rank * num_kv_heads // size, 1


@dataclass(frozen=True)
class KVShardPiece:
    """One stream's worth of a pull between gangs: ``num_heads`` consecutive KV heads that
    source rank ``src_rank`` holds from its local head ``src_head`` and destination rank
    ``dst_rank`` stores from its local head ``dst_head``."""

    src_rank: int
    src_head: int
    dst_rank: int
    dst_head: int
    num_heads: int


def plan_kv_pieces(src_size: int, dst_size: int, num_kv_heads: int) -> tuple[KVShardPiece, ...]:
    """How a gang of ``dst_size`` ranks pulls a model's ``num_kv_heads`` KV heads from a gang of
    ``src_size`` ranks: each destination rank takes exactly the heads it holds, each from a
    source rank holding it (a head a source gang replicates comes from the copy whose index
    matches the destination rank's, spreading the streams), consecutive heads of one source in
    one piece. ``ValueError`` naming the numbers when either size does not split the heads."""
    for what, size in (("source", src_size), ("destination", dst_size)):
        if size < 1 or (num_kv_heads % size and size % num_kv_heads):
            raise ValueError(
                f"a {what} gang of {size} ranks cannot split {num_kv_heads} KV heads (one of "
                "the two must divide the other)"
            )
    holders: list[list[tuple[int, int]]] = [[] for _ in range(num_kv_heads)]
    for rank in range(src_size):
        first, count = kv_head_range(rank, src_size, num_kv_heads)
        for head in range(first, first + count):
            holders[head].append((rank, head - first))
    pieces: list[KVShardPiece] = []
    for dst_rank in range(dst_size):
        first, count = kv_head_range(dst_rank, dst_size, num_kv_heads)
        for head in range(first, first + count):
            copies = holders[head]
            src_rank, src_head = copies[dst_rank % len(copies)]
            last = pieces[-1] if pieces else None
            if (
                last is not None
                and last.dst_rank == dst_rank
                and last.src_rank == src_rank
                and last.src_head + last.num_heads == src_head
            ):
                pieces[-1] = replace(last, num_heads=last.num_heads + 1)
            else:
                pieces.append(KVShardPiece(src_rank, src_head, dst_rank, head - first, 1))
    return tuple(pieces)
