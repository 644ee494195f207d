"""Rounding float32 values to a model dtype the way torch does (nearest, ties to even).

NOTE: Triton's CPU interpreter truncates float32 -> bfloat16 casts (its own bit converter drops
the low mantissa bits) where a GPU and torch round to nearest even. Kernels whose results must
match torch bit for bit round through :func:`round_to`, which rounds bfloat16 with integer
arithmetic — exact on every path and a few integer ops on a GPU; other dtypes cast natively.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to(x, DTYPE: tl.constexpr):
    """``x`` (float32) rounded to nearest-even ``DTYPE`` (NaN and infinities stay so)."""
    if tl.bfloat16 == DTYPE:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)  # ties to even: add half an ulp, less at even
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(DTYPE)
