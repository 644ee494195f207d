"""Expert load statistics of one rank: tokens per expert per step, and cumulative totals.

Two views per expert, both summed over the model's MoE layers (a token counts once per MoE
layer it passes): *computed* — rows this rank's experts processed, whoever sent them, which is
this rank's load — and *routed* — rows this rank's own tokens chose, wherever they went, which
is the demand its requests create. :meth:`ExpertLoadStats.snapshot` returns plain lists and
ints for the metrics exporter; comparing ranks' snapshots shows imbalance across the gang.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.expert_parallel.dispatch import DispatchLayout


class ExpertLoadStats:
    """Counters of one rank over ``num_moe_layers`` MoE layers of ``num_experts`` experts."""

    def __init__(
        self, rank: int, num_moe_layers: int, num_experts: int, held_expert_ids: tuple[int, ...]
    ) -> None:
        self.rank = rank
        self.held_expert_ids = held_expert_ids
        self.num_steps = 0
        shape = (num_moe_layers, num_experts)
        self._step_computed = torch.zeros(shape, dtype=torch.int64)  # [L, E]
        self._step_routed = torch.zeros(shape, dtype=torch.int64)  # [L, E]
        self._step_bytes = 0
        self._last_computed = torch.zeros(shape, dtype=torch.int64)  # [L, E]
        self._last_routed = torch.zeros(shape, dtype=torch.int64)  # [L, E]
        self._last_bytes = 0
        self._total_computed = torch.zeros(shape, dtype=torch.int64)  # [L, E]
        self._total_routed = torch.zeros(shape, dtype=torch.int64)  # [L, E]
        self._total_bytes = 0

    def begin_step(self) -> None:
        """Start counting a new forward step."""
        self._step_computed.zero_()
        self._step_routed.zero_()
        self._step_bytes = 0

    def record(self, moe_layer: int, layout: DispatchLayout, all_to_all_bytes: int) -> None:
        """Count one MoE layer's dispatch on this rank and the bytes it sent to peers."""
        self._step_computed[moe_layer] += layout.recv_counts.sum(dim=0)  # [E]
        self._step_routed[moe_layer] += layout.send_counts.sum(dim=0)  # [E]
        self._step_bytes += all_to_all_bytes

    def end_step(self) -> None:
        """Close the step: it becomes the ``step_*`` view and is added to the totals."""
        self.num_steps += 1
        self._last_computed.copy_(self._step_computed)
        self._last_routed.copy_(self._step_routed)
        self._last_bytes = self._step_bytes
        self._total_computed += self._step_computed
        self._total_routed += self._step_routed
        self._total_bytes += self._step_bytes

    def snapshot(self) -> dict[str, Any]:
        """Plain-data view for metrics: per-expert lists indexed by global expert id."""
        total = self._total_computed.sum(dim=0)  # [E]
        return {
            "rank": self.rank,
            "num_steps": self.num_steps,
            "expert_ids": list(self.held_expert_ids),
            "step_tokens_per_expert": self._last_computed.sum(dim=0).tolist(),
            "total_tokens_per_expert": total.tolist(),
            "total_tokens_per_layer_expert": self._total_computed.tolist(),
            "step_routed_tokens_per_expert": self._last_routed.sum(dim=0).tolist(),
            "total_routed_tokens_per_expert": self._total_routed.sum(dim=0).tolist(),
            "step_all_to_all_bytes": self._last_bytes,
            "total_all_to_all_bytes": self._total_bytes,
            "load_imbalance": self._imbalance(total),
        }

    def _imbalance(self, total: torch.Tensor) -> float:
        """Hottest held expert over the mean held expert (1.0: balanced; 0.0: no load yet)."""
        held = total[list(self.held_expert_ids)].double()  # [E_local]
        mean = float(held.mean()) if held.numel() else 0.0
        return float(held.max()) / mean if mean > 0 else 0.0
