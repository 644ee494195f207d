"""Triton kernels for paged attention: cache write (plain or with RoPE), paged decode, varlen
prefill over a prefix."""

from engine.attention.triton_kernels.cache_write import write_kv_cache
from engine.attention.triton_kernels.decode import paged_decode_attention
from engine.attention.triton_kernels.prefill import paged_prefill_attention
from engine.attention.triton_kernels.rope_cache_write import rope_and_write_kv_cache
from engine.triton_launch import interpreter_active, is_interpreted

__all__ = [
    "interpreter_active",
    "is_interpreted",
    "paged_decode_attention",
    "paged_prefill_attention",
    "rope_and_write_kv_cache",
    "write_kv_cache",
]
