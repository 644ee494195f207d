"""The expert-parallel MoE layer: a rank's :class:`MoELayer` plus dispatch and combine.

Data-parallel attention: each rank runs only its own requests' tokens; inside a MoE layer the
rank routes its tokens locally (router weights are replicated), sends every (token, expert) row
to a rank holding that expert, runs the rows it receives through its own experts, sends the
results back and combines them with the routing weights. The shared expert, if any, runs on the
token's home rank. Per layer and step that is three all-to-alls: the [ranks, experts] row counts,
the rows out, the results back. A rank with no tokens still takes part with zero rows.

NOTE: a token whose k experts live on the same peer is sent k times (once per row); merging
them would save bytes at top-k > 1 but needs a second index map on the receiver.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from engine.expert_parallel.collective import EPCollective
from engine.expert_parallel.dispatch import DispatchLayout, ReplicaRouter, plan_dispatch
from engine.expert_parallel.load_stats import ExpertLoadStats
from engine.expert_parallel.timing import StepTimer
from engine.models.moe import MoELayer


class ExpertParallelMoE(nn.Module):
    """Wraps one rank's :class:`MoELayer` (holding only its experts) for expert parallelism.

    ``moe_layer_index`` numbers the model's MoE layers from 0, for the load statistics.
    """

    def __init__(
        self,
        moe: MoELayer,
        collective: EPCollective,
        router: ReplicaRouter,
        *,
        moe_layer_index: int,
        stats: ExpertLoadStats | None = None,
        timer: StepTimer | None = None,
    ) -> None:
        super().__init__()
        self.moe = moe
        self.collective = collective
        self.router = router
        self.moe_layer_index = moe_layer_index
        self.stats = stats
        self.timer = timer

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, H] this rank's tokens -> [T, H]; T may be 0 (an empty lockstep step)."""
        top_k = self.moe.top_k
        with self._phase("dispatch"):
            topk_ids, topk_weights = self.moe.route(hidden)  # [T, k] each
            layout = plan_dispatch(topk_ids, self.router, self.collective)
            send_rows = hidden[layout.order // top_k]  # [T*k, H] ordered by (rank, expert)
            recv_rows = self.collective.all_to_all(
                send_rows, layout.send_splits, layout.recv_splits
            )  # [M, H] grouped by source rank, then expert
        with self._phase("experts"):
            if layout.num_recv_rows:
                recv_rows = self.moe.expert_forward(recv_rows, layout.recv_expert_ids)  # [M, H]
            shared = self.moe.shared_forward(hidden)  # [T, H] or None
        with self._phase("combine"):
            back = self.collective.all_to_all(
                recv_rows, layout.recv_splits, layout.send_splits
            )  # [T*k, H] in ``order``
            out = self._combine(back, layout, topk_weights)  # [T, H]
        if self.stats is not None:
            self.stats.record(self.moe_layer_index, layout, self._bytes_sent(layout, hidden))
        return out if shared is None else out + shared

    def _combine(
        self, back: torch.Tensor, layout: DispatchLayout, topk_weights: torch.Tensor
    ) -> torch.Tensor:
        """Results in dispatch order [T*k, H] -> slot order -> weighted sum [T, H]."""
        if back.shape[0] == 0:
            return back.new_zeros((topk_weights.shape[0], back.shape[1]))  # [0, H]
        expert_out = torch.empty_like(back).index_copy_(0, layout.order, back)  # [T*k, H]
        return self.moe.combine(expert_out, topk_weights)  # [T, H]

    def _bytes_sent(self, layout: DispatchLayout, hidden: torch.Tensor) -> int:
        """Bytes this rank put on the wire to peers in this layer (rows out, results back,
        counts); rows to itself stay local."""
        rank, world = self.collective.rank, self.collective.world_size
        row_bytes = hidden.shape[1] * hidden.element_size()
        rows_out = layout.num_sent_rows - layout.send_splits[rank]
        rows_back = layout.num_recv_rows - layout.recv_splits[rank]
        counts_bytes = (world - 1) * self.router.num_experts * 8
        return (rows_out + rows_back) * row_bytes + counts_bytes

    def _phase(self, name: str) -> contextlib.AbstractContextManager[None]:
        return self.timer.phase(name) if self.timer is not None else contextlib.nullcontext()
