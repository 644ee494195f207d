"""The one MoE layer: top-k routing, per-expert compute and combine as separable steps.

Experts are addressed by *global* id ``0..num_experts-1``; a layer is built with the ids it owns
(default: all) and allocates only those. ``forward`` runs the three steps locally; an
expert-parallel layer calls :meth:`MoELayer.route`, moves rows to the ranks owning their
experts, runs :meth:`MoELayer.expert_forward` there, brings results back and calls
:meth:`MoELayer.combine` (plus :meth:`MoELayer.shared_forward`) on the tokens' home rank.

The experts run through the layer's :class:`~engine.models.kernels.ModelKernels`: the torch
reference loops over the experts that received rows (reading their counts on the host), the
fused Triton path runs grouped GEMMs with no host sync, so an MoE model can be captured in a
CUDA graph.

Routing is softmax (float32) -> top-k -> optional renormalisation (always for Mixtral,
``norm_topk_prob`` for Qwen-MoE). Top-k weights stay float32 and the weighted sum of expert
outputs is formed in float32, then cast to the model dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import ConfigError
from engine.models.config import ModelArchConfig
from engine.models.int8_weights import quantize_rows
from engine.models.kernels import TORCH_KERNELS, ModelKernels
from engine.models.layers import GatedMLP, Linear, empty_param
from engine.models.tp_shard import TPShard


class MoELayer(nn.Module):
    """Routed experts (SiLU-gated MLPs) plus an optional sigmoid-gated shared expert."""

    global_to_local: torch.Tensor  # [num_experts] int64, -1 where the expert is not owned
    gate_up_scale: torch.Tensor | None
    down_scale: torch.Tensor | None

    def __init__(
        self,
        config: ModelArchConfig,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        expert_ids: Sequence[int] | None = None,
        kernels: ModelKernels = TORCH_KERNELS,
        tp: TPShard | None = None,
    ) -> None:
        """``tp``: a tensor-parallel rank, which holds its share of every expert's width (and
        of the shared expert's) and sums the ranks' partial outputs with one all-reduce."""
        super().__init__()
        hidden, inter = config.hidden_size, config.moe_intermediate_size
        self.tp = tp
        if tp is not None:
            inter = tp.split(inter)[1]
        self.kernels = kernels
        self.num_experts = config.num_experts
        self.top_k = config.top_k
        self.renormalize = config.norm_topk_prob
        self.expert_ids: tuple[int, ...] = _owned_ids(expert_ids, config.num_experts)
        num_local = len(self.expert_ids)
        self.gate = Linear(hidden, config.num_experts, bias=False, dtype=dtype, device=device)
        self.gate_up_proj = empty_param(num_local, 2 * inter, hidden, dtype=dtype, device=device)
        self.down_proj = empty_param(num_local, hidden, inter, dtype=dtype, device=device)
        self.register_buffer("gate_up_scale", None)  # [num_local, 2I] once int8
        self.register_buffer("down_scale", None)  # [num_local, H] once int8
        to_local = torch.full((config.num_experts,), -1, dtype=torch.int64)
        to_local[list(self.expert_ids)] = torch.arange(num_local)
        self.register_buffer("global_to_local", to_local.to(device), persistent=False)
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: Linear | None = None
        if config.shared_expert_intermediate_size > 0:
            self.shared_expert = GatedMLP(
                hidden,
                config.shared_expert_intermediate_size,
                dtype=dtype,
                device=device,
                kernels=kernels,
                tp=tp,
            )
            self.shared_expert_gate = Linear(hidden, 1, bias=False, dtype=dtype, device=device)

    def route(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, H] -> (topk_ids [T, k] int64 global expert ids, topk_weights [T, k] float32)."""
        probs = F.softmax(self.gate(hidden), dim=-1, dtype=torch.float32)  # [T, E]
        topk_weights, topk_ids = probs.topk(self.top_k, dim=-1)  # [T, k]
        if self.renormalize:
            topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
        return topk_ids, topk_weights

    def expert_forward(
        self, hidden: torch.Tensor, expert_ids: torch.Tensor, rows_per_token: int = 1
    ) -> torch.Tensor:
        """Run row ``i`` (input ``hidden[i // rows_per_token]``) through expert ``expert_ids[i]``.

        ``hidden`` [N / rows_per_token, H], ``expert_ids`` [N] global ids, all owned by this
        layer -> [N, H] unweighted expert outputs in row order.
        """
        return self._experts(hidden, expert_ids, rows_per_token, None)

    def _experts(
        self,
        hidden: torch.Tensor,
        expert_ids: torch.Tensor,
        rows_per_token: int,
        row_weights: torch.Tensor | None,
    ) -> torch.Tensor:
        local_ids = self.global_to_local[expert_ids]  # [N], -1 where not owned
        return self.kernels.moe_experts(
            hidden,
            local_ids,
            rows_per_token,
            self.gate_up_proj,
            self.down_proj,
            self.gate_up_scale,
            self.down_scale,
            row_weights,
        )

    def quantize_int8(self) -> int:
        """Quantize both expert stacks per expert and output channel; returns 2."""
        for name in ("gate_up_proj", "down_proj"):
            q, scales = quantize_rows(getattr(self, name).data)
            setattr(self, name, nn.Parameter(q, requires_grad=False))
            self.register_buffer(name.replace("_proj", "_scale"), scales)
        return 2

    def combine(self, expert_out: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """``expert_out`` [T * k, H] (token-major) weighted by ``topk_weights`` [T, k] -> [T, H]."""
        num_tokens, top_k = topk_weights.shape
        per_slot = expert_out.view(num_tokens, top_k, -1).float()  # [T, k, H]
        return (per_slot * topk_weights[..., None]).sum(dim=1).to(expert_out.dtype)

    def shared_forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """``sigmoid(shared_expert_gate(x)) * shared_expert(x)`` [T, H], or None if absent."""
        if self.shared_expert is None or self.shared_expert_gate is None:
            return None
        return torch.sigmoid(self.shared_expert_gate(hidden)) * self.shared_expert(hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, H]; every expert must be owned (the single-rank case)."""
        num_tokens, hidden_size = hidden.shape
        topk_ids, topk_weights = self.route(hidden)  # [T, k]
        weighted = self._experts(
            hidden, topk_ids.reshape(-1), self.top_k, topk_weights.reshape(-1)
        )  # [T*k, H] float32, as :meth:`combine` weighs them
        out = weighted.view(num_tokens, self.top_k, hidden_size).sum(dim=1).to(hidden.dtype)
        if self.tp is not None:  # each rank computed its share of every expert's width
            out = self.tp.all_reduce(out)
        shared = self.shared_forward(hidden)  # a tensor-parallel shared expert sums itself
        return out if shared is None else out + shared


def _owned_ids(expert_ids: Sequence[int] | None, num_experts: int) -> tuple[int, ...]:
    if expert_ids is None:
        return tuple(range(num_experts))
    owned = tuple(sorted(set(expert_ids)))
    if any(not 0 <= e < num_experts for e in owned):
        raise ConfigError(
            f"expert ids {list(owned)} outside 0..{num_experts - 1}", param="expert_ids"
        )
    return owned
