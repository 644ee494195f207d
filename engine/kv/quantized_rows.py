"""8-bit KV cache rows: quantize K/V on write, dequantize on read.

Granularity: one float16 scale per token, layer, K/V and head (``scale = amax(|row|) / qmax``),
stored right after the row's ``head_dim`` 8-bit values (``core.kv_layout``). Why per token and
head rather than per block: a block fills over many steps, and a per-block scale fixed by its
first tokens would clip later, larger ones (or force requantizing the block's earlier tokens);
per-row scales make every write independent, so the stored bytes of a token do not depend on
how its prompt was chunked, which step wrote it or what else shares its block — transfers,
tiers and prefix hits move them as they are. Per head (not per token across heads) keeps a
head with large keys from flattening the others. The cost is 2 bytes per ``head_dim`` values:
1.6% at head_dim 128, 3.1% at 64.

``int8`` rounds ``x / scale`` (half away from zero) to [-127, 127]; ``fp8_e4m3`` rounds
``x / scale`` (|x/s| <= 448) to the nearest e4m3 value (ties away from zero) before the cast:
Triton's CPU interpreter mis-rounds float32 -> float8 casts (124.0 -> 64.0), and rounding first
makes the cast exact on every path. The torch path here and the Triton cache-write
kernel produce the same bytes.
"""

from __future__ import annotations

import torch

from core.kv_layout import QUANTIZED_KV_SCALE_BYTES

KV_CACHE_DTYPES: dict[str, str] = {"int8": "int8", "fp8_e4m3": "float8_e4m3fn"}
"""``engine.kv_cache_dtype`` -> the stored element dtype (``core.kv_layout`` names)."""
SCALE_BYTES = QUANTIZED_KV_SCALE_BYTES
_QMAX: dict[torch.dtype, float] = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
_MIN_SCALE = 2.0**-24  # the smallest positive float16


def is_quantized(cache: torch.Tensor) -> bool:
    """True for an 8-bit cache (rows carry their scales)."""
    return cache.dtype in _QMAX


def pack_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` [..., D] -> [..., D + 2] of ``dtype``: quantized values, then the float16 scale."""
    qmax = _QMAX[dtype]
    scale = (x.float().abs().amax(dim=-1) / qmax).clamp(min=_MIN_SCALE).to(torch.float16)
    scaled = x.float() / scale.float()[..., None]
    if dtype is torch.int8:  # round half away from zero, as the Triton cache-write kernel does
        rounded = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)
        values = rounded.clamp(-qmax, qmax).to(torch.int8)
    else:  # rounded to an e4m3 value first, so the cast itself is exact (as in the kernel)
        values = _round_to_e4m3(scaled.clamp(-qmax, qmax)).to(dtype)
    scale_bytes = scale[..., None].view(torch.uint8).view(dtype)  # [..., 2]
    return torch.cat([values, scale_bytes], dim=-1)


def _round_to_e4m3(y: torch.Tensor) -> torch.Tensor:
    """The nearest float8 e4m3 value (ties away from zero): 3 mantissa bits, so the step is
    ``2**(exponent - 3)``, and ``2**-9`` among the subnormals below ``2**-6``."""
    magnitude = y.abs()
    step = torch.exp2(torch.floor(torch.log2(magnitude.clamp(min=2.0**-6))) - 3)
    return torch.sign(y) * torch.floor(magnitude / step + 0.5) * step


def unpack_rows(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., D + 2] packed rows -> [..., D] of ``dtype`` (values times their scale)."""
    values = rows[..., :-SCALE_BYTES].float()
    scale = rows[..., -SCALE_BYTES:].contiguous().view(torch.float16).float()  # [..., 1]
    return (values * scale).to(dtype)
