"""Constants, launch-time helpers and jit functions shared by the Triton attention kernels.

8-bit caches (``engine.kv.quantized_rows``): each head row is ``head_dim`` 8-bit values then a
float16 scale. An int8 or e4m3 value is exact in bfloat16 and float16, so the kernels convert a
K/V tile to the model's dtype as it is (:func:`load_kv_tile`, no multiply, both attention dots stay
tensor-core dots on 16-bit operands) and apply the per-token scales to the much smaller score and
probability tiles instead (:func:`load_row_scales`): ``q . (s_n k_n) = s_n (q . k_n)`` and
``sum_n p_n (s_n v_n) = sum_n (p_n s_n) v_n``. That is one rounding fewer than dequantizing first,
as the torch path does.

float8 e4m3 is a native Triton type from compute capability 8.9 on; before that (an A100) the
kernels take the cache's bytes and convert them with integer arithmetic
(:func:`e4m3_bytes_as_f16`, :func:`float_to_e4m3_bytes`), as vLLM does on Ampere.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.triton_launch.target import KernelTarget, is_interpreted

LOG2_E = 1.4426950408889634  # softmax runs in base 2: exp(x) == exp2(x * LOG2_E)
MIN_DOT_SIZE = 16  # tl.dot needs every tile dimension >= 16 on GPUs


def needs_fp32_dot(target: KernelTarget, dtype: torch.dtype) -> bool:
    """True when ``tl.dot`` operands must be upcast to fp32 before the dot.

    NOTE: the interpreter keeps bfloat16 tiles as raw int16 bits (numpy has no bfloat16) and its
    ``tl.dot`` multiplies those integers; upcasting first gives the exact products a GPU's fp32
    accumulation gives. Compiled kernels keep native bf16 tensor-core dots.
    """
    return target.interpreted and dtype == torch.bfloat16


def check_launchable(kernel: object, tensor: torch.Tensor) -> None:
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


FP8_BYTES_FACTOR = tl.constexpr(256.0)  # e4m3_bytes_as_f16 gives value * 2**-8


@triton.jit
def e4m3_bytes_as_f16(bits):
    """float8 e4m3 bytes (uint8) -> float16 values of exactly ``value * 2**-8``, with integer
    arithmetic only: the byte's sign, exponent and mantissa bits moved into a float16's places
    (its exponent bias is 15, e4m3's 7), subnormals included. (e4m3's NaN, which the quantizer
    never writes, would read as 480.)"""
    bits = bits.to(tl.uint16)
    return (((bits & 0x80) << 8) | ((bits & 0x7F) << 7)).to(tl.float16, bitcast=True)


@triton.jit
def float_to_e4m3_bytes(y):
    """float32 values that are e4m3 values exactly (``|y| <= 448``) -> their e4m3 bytes (uint8),
    the inverse of :func:`e4m3_bytes_as_f16`."""
    half = (y * (1.0 / FP8_BYTES_FACTOR)).to(tl.float16).to(tl.uint16, bitcast=True)  # exact
    return (((half >> 8) & 0x80) | ((half >> 7) & 0x7F)).to(tl.uint8)


@triton.jit
def load_kv_tile(
    base_ptr,  # this kv head's K (or V) rows
    token_offsets,  # [N] element offsets of the tile's rows from ``base_ptr``
    dims,  # [D]
    mask,  # [N, D]
    FP8_BYTES: tl.constexpr,
    DTYPE: tl.constexpr,
):
    """One K or V tile as ``DTYPE`` values; an 8-bit tile's values unscaled (exact in any float
    dtype; :func:`load_row_scales` has the scales), fp8 bytes times ``2**-8``."""
    tile = tl.load(base_ptr + token_offsets[:, None] + dims[None, :], mask=mask, other=0.0)
    if FP8_BYTES:
        tile = e4m3_bytes_as_f16(tile)
    return tile.to(DTYPE)


@triton.jit
def load_row_scales(
    scale_ptr,  # the cache's bytes as float16
    rows,  # [N] element offsets of 8-bit rows in the cache
    row_mask,  # [N]
    HEAD_DIM: tl.constexpr,
    FP8_BYTES: tl.constexpr,
):
    """[N] float32 scales of the rows (0 where masked): the float16 after each row's values,
    times the factor :func:`load_kv_tile` left out of fp8 bytes."""
    scale = tl.load(scale_ptr + (rows + HEAD_DIM) // 2, mask=row_mask, other=0.0).to(tl.float32)
    if FP8_BYTES:
        scale = scale * FP8_BYTES_FACTOR
    return scale


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
    """True for an 8-bit cache: each head row is ``head_dim`` values then a float16 scale.

    NOTE: such a row is ``head_dim + 2`` bytes, so rows are 2-byte aligned at best and the
    compiler loads a tile byte by byte, a register per byte of a thread's share: the attention
    kernels take fewer keys per tile from an 8-bit cache (the compile gate checks they fit).
    """
    return kv_cache.dtype in _QUANTIZED


def converts_fp8_bytes(kv_cache: torch.Tensor, target: KernelTarget) -> bool:
    """True when the kernels must read and write ``kv_cache``'s float8 e4m3 values as bytes:
    an fp8 cache on a GPU without native e4m3 (compute capability below 8.9)."""
    return kv_cache.dtype == torch.float8_e4m3fn and not target.native_fp8_e4m3


def cache_operand(kv_cache: torch.Tensor, target: KernelTarget) -> torch.Tensor:
    """``kv_cache`` as the kernels address it: its bytes where :func:`converts_fp8_bytes`."""
    return kv_cache.view(torch.uint8) if converts_fp8_bytes(kv_cache, target) else kv_cache


def scale_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """The cache's bytes as float16 (the kernels read an 8-bit row's scale at float16 index
    ``(row offset + head_dim) // 2``); the cache itself when it is not 8-bit."""
    return kv_cache.view(torch.float16) if is_quantized_cache(kv_cache) else kv_cache
