"""Rotary position embeddings (RoPE), including ``linear`` and ``llama3`` frequency scaling.

The inverse frequencies and the cos/sin tables are computed in float32 exactly as HF
transformers does (same ops, same order), then cast to the model dtype, so positions encode
bit-identically. The tables are recomputed per forward for the step's positions (a [T, D/2]
outer product) instead of cached up to ``max_position_embeddings``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from engine.models.config import RopeScaling


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """The [head_dim / 2] float32 inverse frequencies, scaled as ``scaling`` says."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)  # [D/2]
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    return _llama3_inv_freq(inv_freq, scaling)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by ``factor``, blend the band between."""
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq  # [D/2]
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Computes the per-token cos/sin tables that every layer's :func:`apply_rope` uses."""

    inv_freq: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        theta: float,
        scaling: RopeScaling | None,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        self.dtype = dtype
        inv_freq = rope_inv_freq(head_dim, theta, scaling).to(device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions`` [T] long -> (cos, signed sin), each [T, 1, head_dim] in the model dtype.

        ``cos`` is ``cat(c, c)`` and the signed sin is ``cat(-s, s)``, so :func:`apply_rope` is
        four ops per call; computed once per step and shared by every layer.
        """
        freqs = positions[:, None].float() * self.inv_freq.float()  # [T, D/2] float32
        cos, sin = freqs.cos(), freqs.sin()  # [T, D/2]
        cos_full = torch.cat((cos, cos), dim=-1).to(self.dtype)  # [T, D]
        sin_signed = torch.cat((-sin, sin), dim=-1).to(self.dtype)  # [T, D]
        return cos_full[:, None, :], sin_signed[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [T, n, D] by position (HF's half-split convention); returns a new tensor.

    ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``: rolling ``x`` by
    D/2 gives ``cat(x2, x1)`` and the sign lives in the signed sin, so the result is
    bit-identical to HF's sequence (``x2 * -s == -(x2 * s)`` exactly).
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin  # [T, n, D]
