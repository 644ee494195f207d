"""Small building blocks shared by every family: linear, embedding, RMSNorm, gated MLP.

Parameters are allocated uninitialised (``torch.empty``, no grad): the loader fills every one of
them from the checkpoint and refuses a checkpoint that lacks any, so random init would be waste.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.int8_weights import int8_linear, quantize_rows
from engine.models.kernels import TORCH_KERNELS, ModelKernels
from engine.models.tp_shard import TPShard

if TYPE_CHECKING:  # the slots' package imports the decoder, which imports this module
    from engine.models.lora.slots import LoRASlots


def empty_param(*shape: int, dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    """An uninitialised, frozen parameter of ``shape``."""
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class Linear(nn.Module):
    """``y = x @ W.T (+ b)`` with ``W`` [out, in]; after :meth:`quantize_int8`, ``W`` is int8
    with a scale per output channel (``engine.models.int8_weights``). With ``lora`` slots attached
    (:mod:`engine.models.lora`), each row of the step under an adapter gains its delta."""

    weight_scale: torch.Tensor | None
    lora: LoRASlots | None

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        super().__init__()
        self.weight = empty_param(out_features, in_features, dtype=dtype, device=device)
        self.bias = empty_param(out_features, dtype=dtype, device=device) if bias else None
        self.register_buffer("weight_scale", None)
        self.lora = None

    def quantize_int8(self) -> None:
        """Replace the loaded weight by int8 rows and float32 per-row scales."""
        q, scales = quantize_rows(self.weight.data)
        self.weight = nn.Parameter(q, requires_grad=False)
        self.register_buffer("weight_scale", scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., in] -> [..., out]."""
        if self.weight_scale is not None:
            y = int8_linear(x, self.weight, self.weight_scale, self.bias)
        else:
            y = F.linear(x, self.weight, self.bias)
        if self.lora is not None:
            self.lora.add_delta(x, y)  # x: [T, in], y: [T, out]
        return y


class Embedding(nn.Module):
    """Token id -> row of ``weight`` [vocab, hidden]; under tensor parallelism ``weight`` holds
    this rank's vocabulary slice (padding rows zero) and the rows are summed over the ranks."""

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        tp: TPShard | None = None,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.first_id, self.num_ids, rows = (0, vocab_size, vocab_size)
        if tp is not None:
            self.first_id, self.num_ids, rows = tp.vocab(vocab_size)
        self.weight = empty_param(rows, hidden_size, dtype=dtype, device=device)
        self.weight.data[self.num_ids :].zero_()  # padding rows of the last slice

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] long -> [T, hidden]."""
        if self.tp is None:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.first_id  # [T]
        mine = (local >= 0) & (local < self.num_ids)  # [T]
        rows = F.embedding(torch.where(mine, local, 0), self.weight)  # [T, hidden]
        return self.tp.all_reduce(rows * mine[:, None].to(rows.dtype))


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dim, computed in float32 like HF transformers, through
    the model's :class:`~engine.models.kernels.ModelKernels` (torch ops or one Triton kernel)."""

    def __init__(
        self,
        size: int,
        eps: float,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        kernels: ModelKernels = TORCH_KERNELS,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.kernels = kernels
        self.weight = empty_param(size, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., size] -> [..., size] in ``x``'s dtype."""
        return self.kernels.rms_norm(x, self.weight, self.eps)

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)``, each [..., size]: the pre-norm residual step."""
        return self.kernels.add_rms_norm(x, residual, self.weight, self.eps)


class GatedMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up fused into one [2I, H] projection;
    under tensor parallelism a rank holds ``I / size`` of the width and the down projection's
    partial sums are all-reduced."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        kernels: ModelKernels = TORCH_KERNELS,
        tp: TPShard | None = None,
    ) -> None:
        super().__init__()
        self.tp = tp
        if tp is not None:  # this rank's share of the width: gate/up by column, down by row
            intermediate_size = tp.split(intermediate_size)[1]
        self.intermediate_size = intermediate_size
        self.kernels = kernels
        self.gate_up_proj = Linear(
            hidden_size, 2 * intermediate_size, bias=False, dtype=dtype, device=device
        )
        self.down_proj = Linear(
            intermediate_size, hidden_size, bias=False, dtype=dtype, device=device
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, H]."""
        gate_up = self.gate_up_proj(x)  # [T, 2I]
        out = self.down_proj(self.kernels.silu_and_mul(gate_up))  # silu(gate) * up: [T, I]
        return out if self.tp is None else self.tp.all_reduce(out)
