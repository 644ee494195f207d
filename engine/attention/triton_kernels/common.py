"""Constants and launch-time helpers shared by the Triton attention kernels.

Triton decides at *import* time whether ``@triton.jit`` compiles or interprets (``TRITON_INTERPRET``
must be set before triton is first imported); :func:`is_interpreted` reads that decision back from
a kernel object, so launchers and tests never guess from the environment.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

LOG2_E = 1.4426950408889634  # softmax runs in base 2: exp(x) == exp2(x * LOG2_E)
MIN_DOT_SIZE = 16  # tl.dot needs every tile dimension >= 16 on GPUs


def is_interpreted(kernel: Any) -> bool:
    """True when ``kernel`` runs in Triton's CPU interpreter rather than compiled for a GPU."""
    return isinstance(kernel, InterpretedFunction)


@triton.jit
def _mode_probe():
    # An empty kernel decorated with the kernels of this package: it shares their mode.
    pass


def interpreter_active() -> bool:
    """True when this package's kernels were built for the CPU interpreter."""
    return is_interpreted(_mode_probe)


def needs_fp32_dot(kernel: Any, dtype: torch.dtype) -> bool:
    """True when ``tl.dot`` operands must be upcast to fp32 before the dot.

    NOTE: the interpreter keeps bfloat16 tiles as raw int16 bits (numpy has no bfloat16) and its
    ``tl.dot`` multiplies those integers; upcasting first gives the exact products a GPU's fp32
    accumulation gives. Compiled kernels keep native bf16 tensor-core dots.
    """
    return is_interpreted(kernel) and dtype == torch.bfloat16


def check_launchable(kernel: Any, tensor: torch.Tensor) -> None:
    """Refuse CPU tensors for a compiled kernel with a message that says what to do."""
    if tensor.device.type != "cuda" and not is_interpreted(kernel):
        raise ValueError(
            "Triton attention kernels need CUDA tensors, or TRITON_INTERPRET=1 set before "
            f"triton is first imported (got tensors on {tensor.device})"
        )


def check_last_dim_contiguous(**tensors: torch.Tensor) -> None:
    """The kernels address ``head_dim`` with unit stride; refuse tensors that are not."""
    for name, tensor in tensors.items():
        if tensor.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last (head_dim) dimension")


@triton.jit
def load_kv_tile(
    base_ptr,  # this kv head's K (or V) rows
    scale_ptr,  # the cache's bytes as float16
    row_base,  # element offset of ``base_ptr`` in the cache
    token_offsets,  # [N] element offsets of the tile's rows from ``base_ptr``
    dims,  # [D]
    mask,  # [N, D]
    row_mask,  # [N]
    HEAD_DIM: tl.constexpr,
    QUANT: tl.constexpr,
    FP32: tl.constexpr,
):
    """One K or V tile; an 8-bit row is dequantized with the float16 scale after its values."""
    tile = tl.load(base_ptr + token_offsets[:, None] + dims[None, :], mask=mask, other=0.0)
    if QUANT:
        rows = row_base + token_offsets
        scale = tl.load(scale_ptr + (rows + HEAD_DIM) // 2, mask=row_mask, other=0.0)
        tile = tile.to(tl.float32) * scale.to(tl.float32)[:, None]
    elif FP32:
        tile = tile.to(tl.float32)
    return tile


@triton.jit
def online_softmax_step(row_max, row_sum, scores):
    """Fold one tile of ``scores`` ([rows, N], log2 units, -inf where hidden) into the running
    max and sum; ``(probs, rescale, new max, new sum)``. The caller updates its accumulator as
    ``acc * rescale[:, None] + probs @ V``."""
    new_max = tl.maximum(row_max, tl.max(scores, axis=1))
    # a row that has seen no visible key yet (its window starts later) keeps max -inf:
    # shift by 0 then, so exp2 gives 0 instead of exp2(-inf - -inf) = NaN
    shift = tl.where(new_max == float("-inf"), 0.0, new_max)
    rescale = tl.exp2(row_max - shift)
    probs = tl.exp2(scores - shift[:, None])
    return probs, rescale, new_max, row_sum * rescale + tl.sum(probs, axis=1)


@triton.jit
def online_softmax_finish(acc, row_sum):
    """The attention output of the accumulated rows; a row that saw no visible key is 0."""
    return acc / tl.where(row_sum > 0.0, row_sum, 1.0)[:, None]


_QUANTIZED = (torch.int8, torch.float8_e4m3fn)


def is_quantized_cache(kv_cache: torch.Tensor) -> bool:
    """True for an 8-bit cache: each head row is ``head_dim`` values then a float16 scale."""
    return kv_cache.dtype in _QUANTIZED


def scale_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """The cache's bytes as float16 (the kernels read an 8-bit row's scale at float16 index
    ``(row offset + head_dim) // 2``); the cache itself when it is not 8-bit."""
    return kv_cache.view(torch.float16) if is_quantized_cache(kv_cache) else kv_cache
