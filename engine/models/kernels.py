"""The model's elementwise kernels, chosen once when a model is built: torch ops or fused Triton.

:class:`TorchKernels` is the reference and the CPU path: HF transformers' op sequences, so a
model matches HF bit for bit. :class:`TritonKernels` fuses each into one kernel (residual add +
RMSNorm, SiLU * mul) with the same roundings; a model on CUDA takes it by default, and a test on
CPU can ask for it when Triton runs in its interpreter. A model built with fused kernels also
fuses RoPE into its attention backend's KV-cache write when the backend can
(:class:`~engine.attention.backend.RopeFusingBackend`).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F


class ModelKernels(Protocol):
    """The elementwise operations a decoder layer runs outside its matmuls and attention."""

    #: True for the fused Triton kernels; attention then also fuses RoPE where it can.
    fused: bool

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``x`` [..., H] -> RMSNorm(x) [..., H] in ``x``'s dtype (HF's roundings)."""
        ...

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rms_norm(x + residual), x + residual)``; the sum is rounded to ``x``'s dtype."""
        ...

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``gate_up`` [..., 2I] (gate first) -> ``silu(gate) * up`` [..., I]."""
        ...


class TorchKernels:
    """HF transformers' op sequences in plain torch."""

    fused = False

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """float32 takes the fused ``F.rms_norm`` (bit-identical to HF's sequence there); half
        precision replays HF's sequence, whose two roundings (normalised value, then times
        weight) ``F.rms_norm`` would not reproduce."""
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), weight, eps)
        h = x.float()
        variance = h.pow(2).mean(-1, keepdim=True)  # [..., 1]
        h = h * torch.rsqrt(variance + eps)
        return weight * h.to(x.dtype)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The sum, then :meth:`rms_norm` of it."""
        summed = x + residual  # [..., H]
        return self.rms_norm(summed, weight, eps), summed

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``F.silu(gate) * up``."""
        gate, up = gate_up.chunk(2, dim=-1)  # [..., I] each
        return F.silu(gate) * up


class TritonKernels:
    """The fused Triton kernels, as torch custom ops (``engine.models.triton_kernels``)."""

    fused = True

    def __init__(self) -> None:
        # NOTE: imported here, not at module level: triton is optional on CPU-only installs.
        from engine.models import triton_kernels

        self._ops = triton_kernels

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """One kernel."""
        return self._ops.rms_norm_op(x, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One kernel for the add and the norm."""
        return self._ops.add_rms_norm_op(x, residual, weight, eps)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """One kernel."""
        return self._ops.silu_and_mul_op(gate_up)


TORCH_KERNELS = TorchKernels()


def model_kernels(fused: bool) -> ModelKernels:
    """The Triton kernels when ``fused``, else the torch reference."""
    return TritonKernels() if fused else TORCH_KERNELS


def default_fused(device: torch.device | str) -> bool:
    """Whether a model on ``device`` takes the fused kernels by default: on CUDA only, where
    Triton compiles them (on CPU they would only run in the slow interpreter)."""
    return torch.device(device).type == "cuda"
