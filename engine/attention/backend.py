"""The attention backend contract: a Protocol plus a registry of implementations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from engine.attention.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    """Paged attention over the block-major KV cache of one layer."""

    name: str
    #: True when a decode-only forward reads every length and block id from the metadata's
    #: tensors (never its host lists), so a captured CUDA graph replays correctly with new ones.
    supports_cuda_graphs: bool

    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        """Write the new ``k``/``v`` into ``kv_cache`` at ``meta.slot_mapping``, then return
        causal attention of each new query over its sequence's whole context (cached + new), or
        with a sliding ``window`` over its last ``window`` positions (itself included: the query
        at ``p`` sees keys ``k`` with ``p - window < k <= p``, as HF Mistral does).
        GQA/MQA: query head ``h`` reads kv head ``h // (num_heads // num_kv_heads)``."""
        ...


@runtime_checkable
class RopeFusingBackend(AttentionBackend, Protocol):
    """A backend that can also apply RoPE to the new q and k on their way in (one kernel with
    its KV-cache write), so the model need not rotate them first."""

    def forward_rope(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim], not yet rotated
        k: torch.Tensor,  # [T, num_kv_heads, head_dim], not yet rotated
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        cos: torch.Tensor,  # [T, 1, head_dim]
        sin: torch.Tensor,  # [T, 1, head_dim] (signed, as ``RotaryEmbedding`` makes it)
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        """:meth:`forward` of ``apply_rope(q)``, ``apply_rope(k)`` and ``v``, bit for bit:
        rotate q and k as :func:`~engine.models.rope.apply_rope` does, write the rotated k and v
        at ``meta.slot_mapping`` and attend."""
        ...


_REGISTRY: dict[str, Callable[[], AttentionBackend]] = {}


def register_backend(name: str, factory: Callable[[], AttentionBackend]) -> None:
    """Make ``factory`` available as ``get_backend(name)``."""
    _REGISTRY[name] = factory


def get_backend(name: str) -> AttentionBackend:
    """Instantiate a registered backend by name (``torch`` or ``triton``)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown attention backend {name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name]()
