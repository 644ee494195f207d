"""The model's kernels outside attention, chosen once when a model is built: torch or fused Triton.

:class:`TorchKernels` is the reference and the CPU path: HF transformers' op sequences, so a
model matches HF bit for bit. :class:`TritonKernels` fuses each into one kernel (residual add +
RMSNorm, SiLU * mul) with the same roundings, and runs an MoE layer's experts as grouped GEMMs
without a host sync (:mod:`engine.models.triton_kernels.fused_moe`); a model on CUDA takes it by
default, and a test on CPU can ask for it when Triton runs in its interpreter. A model built
with fused kernels also fuses RoPE into its attention backend's KV-cache write when the backend can
(:class:`~engine.attention.backend.RopeFusingBackend`).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from engine.models.int8_weights import int8_linear
from engine.models.op_shapes import moe_experts_fake


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

    def moe_experts(
        self,
        hidden: torch.Tensor,
        local_ids: torch.Tensor,
        rows_per_token: int,
        gate_up_proj: torch.Tensor,
        down_proj: torch.Tensor,
        gate_up_scale: torch.Tensor | None,
        down_scale: torch.Tensor | None,
        row_weights: torch.Tensor | None,
    ) -> torch.Tensor:
        """Row ``r`` = ``hidden[r // rows_per_token]`` [T, H] through the SiLU-gated expert
        ``local_ids[r]`` ([N] int64 local ids, -1: not owned, a zero row) of ``gate_up_proj``
        [E, 2I, H] and ``down_proj`` [E, H, I] (int8 with float32 per-row ``*_scale`` [E, out],
        or ``hidden``'s dtype) -> [N, H] in ``hidden``'s dtype; with ``row_weights`` [N]
        float32, each output rounded to that dtype times its weight, as float32."""
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

    def moe_experts(
        self,
        hidden: torch.Tensor,
        local_ids: torch.Tensor,
        rows_per_token: int,
        gate_up_proj: torch.Tensor,
        down_proj: torch.Tensor,
        gate_up_scale: torch.Tensor | None,
        down_scale: torch.Tensor | None,
        row_weights: torch.Tensor | None,
    ) -> torch.Tensor:
        """A loop over the experts that received rows, one matmul pair each (an opaque op to
        the compiler: :func:`moe_experts_op`)."""
        return moe_experts_op(
            hidden, local_ids, rows_per_token, gate_up_proj, down_proj,
            gate_up_scale, down_scale, row_weights,
        )  # fmt: skip


# NOTE: the per-expert loop sizes come from the data (``counts``, read on the host): traced,
# every new mix of counts would recompile the graph. As an opaque op the compiler sees one
# call of a known output shape, so a compiled MoE model stays one graph (a disabled function
# here broke it at every layer and recompiled each layer on its own).
@torch.library.custom_op("pdserve::moe_experts", mutates_args=())
def moe_experts_op(
    hidden: torch.Tensor,  # [T, H]
    local_ids: torch.Tensor,  # [N] expert of each (token, slot) row, -1: not here
    rows_per_token: int,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    gate_up_scale: torch.Tensor | None,
    down_scale: torch.Tensor | None,
    row_weights: torch.Tensor | None,
) -> torch.Tensor:  # [N, H]: float32 when weighted, else hidden's dtype
    """The torch reference of the routed experts."""
    num_experts = gate_up_proj.shape[0]
    keys = torch.where(local_ids < 0, num_experts, local_ids)  # [N], skipped rows last
    counts = torch.bincount(keys, minlength=num_experts + 1)[:num_experts].tolist()
    order = keys.argsort(stable=True)  # [N] rows grouped by expert
    sorted_in = hidden[order // rows_per_token]  # [N, H]
    sorted_out = torch.zeros_like(sorted_in)  # [N, H]
    start = 0
    for local_id, num_rows in enumerate(counts):
        if num_rows == 0:
            continue
        end = start + num_rows
        gate_up = _expert_linear(sorted_in[start:end], gate_up_proj, gate_up_scale, local_id)
        gate, up = gate_up.chunk(2, dim=-1)
        sorted_out[start:end] = _expert_linear(F.silu(gate) * up, down_proj, down_scale, local_id)
        start = end
    out = torch.empty_like(sorted_out).index_copy_(0, order, sorted_out)  # [N, H]
    return out if row_weights is None else out.float() * row_weights[:, None]


moe_experts_op.register_fake(moe_experts_fake)


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

    def moe_experts(
        self,
        hidden: torch.Tensor,
        local_ids: torch.Tensor,
        rows_per_token: int,
        gate_up_proj: torch.Tensor,
        down_proj: torch.Tensor,
        gate_up_scale: torch.Tensor | None,
        down_scale: torch.Tensor | None,
        row_weights: torch.Tensor | None,
    ) -> torch.Tensor:
        """Two grouped GEMMs around the SiLU * mul kernel, with no host sync."""
        return self._ops.fused_moe_experts_op(
            hidden,
            local_ids,
            rows_per_token,
            gate_up_proj,
            down_proj,
            gate_up_scale,
            down_scale,
            row_weights,
        )


def _expert_linear(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None, local_id: int
) -> torch.Tensor:
    if scale is None:
        return F.linear(x, weight[local_id])
    return int8_linear(x, weight[local_id], scale[local_id], None)


TORCH_KERNELS = TorchKernels()


def model_kernels(fused: bool) -> ModelKernels:
    """The Triton kernels when ``fused``, else the torch reference."""
    return TritonKernels() if fused else TORCH_KERNELS


def default_fused(device: torch.device | str) -> bool:
    """Whether a model on ``device`` takes the fused kernels by default: on CUDA only, where
    Triton compiles them (on CPU they would only run in the slow interpreter)."""
    return torch.device(device).type == "cuda"
