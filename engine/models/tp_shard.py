"""Tensor parallelism inside one model: the slice of every sharded layer a rank holds.

Megatron's layout, as vLLM and SGLang use it: attention splits its heads over the ranks (the
QKV projection column-parallel, each rank computing its query heads and their KV heads, the
output projection row-parallel); the gated MLP splits its intermediate width (gate/up
column-parallel, down row-parallel); the embedding and the LM head split the vocabulary. A
row-parallel layer ends in one all-reduce; the LM head gathers the vocabulary slices back. KV
heads are split too while there are at least as many as ranks; with fewer, each is replicated on
``size / num_kv_heads`` consecutive ranks (every rank still holds one). Norms, RoPE and the
router of an MoE layer are replicated.

:class:`TPShard` is the rank's view: its rank, the gang size and the collective; the layers ask
it for their slice (``heads``, ``kv_heads``, ``split``, ``vocab``) and for the reductions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from core.errors import ConfigError
from core.tensor_parallel import kv_head_range


class TPCollective(Protocol):
    """The collectives a tensor-parallel rank runs (every rank, same calls, same order)."""

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the ranks, in place."""
        ...

    def all_gather_last(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` [..., n] concatenated in rank order: [..., size * n]."""
        ...


@dataclass(frozen=True)
class TPShard:
    """Rank ``rank`` of a tensor-parallel gang of ``size`` ranks talking over ``collective``."""

    rank: int
    size: int
    collective: TPCollective

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ConfigError(
                f"tensor-parallel rank {self.rank} outside 0..{self.size - 1}",
                param="tensor_parallel_size",
            )

    def split(self, total: int) -> tuple[int, int]:
        """(first index, count) of this rank's even share of ``total`` (a multiple of size)."""
        count = total // self.size
        return self.rank * count, count

    def heads(self, num_heads: int) -> tuple[int, int]:
        """(first query head, number of query heads) of this rank."""
        return self.split(num_heads)

    def kv_heads(self, num_kv_heads: int) -> tuple[int, int]:
        """(first KV head, number of KV heads) of this rank: a share of them, or the one KV
        head this rank's query heads read when there are fewer KV heads than ranks."""
        return kv_head_range(self.rank, self.size, num_kv_heads)

    def vocab(self, vocab_size: int) -> tuple[int, int, int]:
        """(first token id, real rows, rows allocated) of this rank's vocabulary slice; every
        rank allocates ``ceil(vocab / size)`` rows so the gathered logits line up."""
        per_rank = -(-vocab_size // self.size)
        start = self.rank * per_rank
        return start, max(min(per_rank, vocab_size - start), 0), per_rank

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the ranks (in place; returned for chaining)."""
        self.collective.all_reduce_sum(tensor)
        return tensor

    def gather_vocab(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """[N, rows allocated] vocabulary-slice logits of every rank -> [N, vocab_size]."""
        return self.collective.all_gather_last(logits.contiguous())[:, :vocab_size]
