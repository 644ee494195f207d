"""The expert-parallel MoE layer over simulated (thread) ranks equals the dense MoE layer."""

from __future__ import annotations

import pytest
import torch

from core.errors import UnavailableError
from engine.expert_parallel import (
    ExpertLoadStats,
    ExpertParallelMoE,
    ExpertPlacement,
    InProcCollective,
    InProcGroup,
)
from engine.expert_parallel.dispatch import ReplicaRouter
from engine.models.moe import MoELayer
from tests.unit.engine.expert_parallel.ranks import (
    HIDDEN,
    moe_config,
    random_dense_layer,
    rank_layer,
    run_ranks,
)


def ep_forward(
    dense: MoELayer,
    placement: ExpertPlacement,
    tokens_per_rank: list[int],
    seed: int = 7,
) -> tuple[torch.Tensor, torch.Tensor, list[ExpertLoadStats]]:
    """All tokens [T, H]; the EP output [T, H] (rank outputs concatenated); per-rank stats."""
    config = moe_config(dense.num_experts, dense.top_k, renormalize=dense.renormalize)
    if dense.shared_expert is not None:
        config = moe_config(
            dense.num_experts,
            dense.top_k,
            shared=dense.shared_expert.gate_up_proj.weight.shape[0] // 2,
            renormalize=dense.renormalize,
        )
    x = torch.randn(sum(tokens_per_rank), HIDDEN, generator=torch.Generator().manual_seed(seed))
    chunks = x.split(tokens_per_rank)

    def rank_fn(collective: InProcCollective) -> tuple[torch.Tensor, ExpertLoadStats]:
        rank = collective.rank
        held = placement.experts_of(rank)
        stats = ExpertLoadStats(rank, 1, placement.num_experts, held)
        layer = ExpertParallelMoE(
            rank_layer(dense, config, held),
            collective,
            ReplicaRouter(placement, rank, torch.device("cpu")),
            moe_layer_index=0,
            stats=stats,
        )
        stats.begin_step()
        with torch.inference_mode():
            out = layer(chunks[rank])  # [T_r, H]
        stats.end_step()
        return out, stats

    results = run_ranks(placement.num_ranks, rank_fn)
    return x, torch.cat([out for out, _ in results]), [stats for _, stats in results]


CASES = [
    # (num_experts, top_k, shared_size, renormalize, tokens per rank)
    pytest.param(4, 1, 0, False, [5, 3], id="top1-2ranks"),
    pytest.param(8, 2, 0, True, [6, 0, 9, 2], id="top2-4ranks-one-idle"),
    pytest.param(8, 2, 40, False, [7, 4], id="top2-shared-expert"),
    pytest.param(6, 3, 16, True, [0, 11, 1], id="top3-shared-3ranks-uneven-split"),
]


@pytest.mark.parametrize(("num_experts", "top_k", "shared", "renorm", "tokens"), CASES)
def test_ep_layer_equals_dense_layer(
    num_experts: int, top_k: int, shared: int, renorm: bool, tokens: list[int]
) -> None:
    dense = random_dense_layer(moe_config(num_experts, top_k, shared=shared, renormalize=renorm))
    placement = ExpertPlacement.contiguous(num_experts, len(tokens))
    x, out, stats = ep_forward(dense, placement, tokens)
    with torch.inference_mode():
        expected = dense(x)  # [T, H]
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    # Load statistics: every routed row was computed exactly once, by a rank holding it.
    topk_ids, _ = dense.route(x)
    demand = torch.bincount(topk_ids.reshape(-1), minlength=num_experts).tolist()
    computed = torch.tensor([s.snapshot()["step_tokens_per_expert"] for s in stats])  # [R, E]
    routed = torch.tensor([s.snapshot()["step_routed_tokens_per_expert"] for s in stats])
    assert computed.sum(0).tolist() == demand
    assert routed.sum(0).tolist() == demand
    for rank, row in enumerate(computed.tolist()):
        assert {e for e, n in enumerate(row) if n} <= set(placement.experts_of(rank))


def test_redundant_copies_keep_numerics_and_spread_hot_expert_load() -> None:
    dense = random_dense_layer(moe_config(4, 2, shared=16), seed=3)
    # Expert 0 also lives on ranks 1 and 2; expert 3 also on rank 0.
    placement = ExpertPlacement.contiguous(4, 3, {0: [1, 2], 3: [0]})
    assert placement.experts_of(0) == (0, 1, 3)
    x, out, stats = ep_forward(dense, placement, [6, 5, 8], seed=11)
    with torch.inference_mode():
        expected = dense(x)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    snaps = [s.snapshot() for s in stats]
    # Every rank holds expert 0, so each computes exactly its own tokens' expert-0 rows.
    for snap in snaps:
        assert snap["step_tokens_per_expert"][0] == snap["step_routed_tokens_per_expert"][0]
    # Rank 0 holds a copy of expert 3: its own expert-3 rows never leave it.
    topk0, _ = dense.route(x[:6])
    own_rows_3 = int((topk0 == 3).sum())
    assert snaps[0]["step_tokens_per_expert"][3] >= own_rows_3


def test_all_to_all_bytes_count_only_rows_crossing_ranks() -> None:
    num_experts, tokens = 4, [5, 7]
    dense = random_dense_layer(moe_config(num_experts, 2), seed=5)
    placement = ExpertPlacement.contiguous(num_experts, 2)
    x, _, stats = ep_forward(dense, placement, tokens)
    topk_ids, _ = dense.route(x)  # [T, k]
    home = torch.tensor([0] * tokens[0] + [1] * tokens[1])[:, None]  # [T, 1]
    owner = topk_ids // 2  # experts 0-1 on rank 0, 2-3 on rank 1
    crossing_rows = int((owner != home).sum())
    row_bytes = HIDDEN * 4
    counts_bytes = 2 * num_experts * 8  # each rank sends its count row to the other
    total = sum(s.snapshot()["step_all_to_all_bytes"] for s in stats)
    assert crossing_rows > 0
    assert total == 2 * crossing_rows * row_bytes + counts_bytes  # out and back


def test_single_rank_ep_sends_nothing_and_equals_dense() -> None:
    dense = random_dense_layer(moe_config(4, 2, shared=8))
    x, out, stats = ep_forward(dense, ExpertPlacement.contiguous(4, 1), [9])
    with torch.inference_mode():
        torch.testing.assert_close(out, dense(x), atol=1e-6, rtol=1e-5)
    assert stats[0].snapshot()["step_all_to_all_bytes"] == 0


def test_a_rank_that_leaves_makes_its_peer_fail_fast() -> None:
    dense = random_dense_layer(moe_config(4, 2))
    config = moe_config(4, 2)
    placement = ExpertPlacement.contiguous(4, 2)
    group = InProcGroup(2, timeout_s=5.0)
    peer = group.member(1)
    collective = group.member(0)
    layer = ExpertParallelMoE(
        rank_layer(dense, config, placement.experts_of(0)),
        collective,
        ReplicaRouter(placement, 0, torch.device("cpu")),
        moe_layer_index=0,
    )
    peer.close()
    with pytest.raises(UnavailableError, match="peer rank left"), torch.inference_mode():
        layer(torch.randn(3, HIDDEN))
