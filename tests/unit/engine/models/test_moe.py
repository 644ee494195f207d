"""The MoE layer's separable steps: routing, per-expert compute on owned experts, combine."""

from __future__ import annotations

import pytest
import torch

from core.errors import ConfigError
from engine.loader import load_model
from engine.models.moe import MoELayer
from tests.unit.engine.models.hf_checkpoints import torch_backend


def moe_layers(path, expert_ids=None) -> list[MoELayer]:
    model = load_model(
        path,
        dtype=torch.float32,
        device="cpu",
        attn_backend=torch_backend(),
        expert_ids=expert_ids,
    )
    return [layer.mlp for layer in model.layers if isinstance(layer.mlp, MoELayer)]


def hidden_states(num_tokens: int, hidden_size: int = 64) -> torch.Tensor:
    return torch.randn(num_tokens, hidden_size, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize(
    ("preset", "renormalized"),
    [("mixtral", True), ("qwen2-moe", False), ("qwen2-moe-sparse", True), ("qwen3-moe", True)],
)
def test_route_is_softmax_topk(hf_checkpoint, preset: str, renormalized: bool) -> None:
    layer = moe_layers(hf_checkpoint(preset).path)[0]
    x = hidden_states(9)
    topk_ids, topk_weights = layer.route(x)
    assert topk_ids.shape == topk_weights.shape == (9, layer.top_k)
    assert topk_weights.dtype == torch.float32
    probs = torch.softmax(x @ layer.gate.weight.T, dim=-1)  # [T, E]
    expected = probs.gather(1, topk_ids)
    if renormalized:
        expected = expected / expected.sum(-1, keepdim=True)
    torch.testing.assert_close(topk_weights, expected)
    assert (probs.gather(1, topk_ids).min(-1).values >= probs.topk(layer.top_k).values[:, -1]).all()


@pytest.mark.parametrize("preset", ["mixtral", "qwen2-moe", "qwen3-moe"])
def test_expert_parallel_split_equals_dense_forward(hf_checkpoint, preset: str) -> None:
    """Two 'ranks' owning disjoint experts, with dispatch and combine done by hand."""
    path = hf_checkpoint(preset).path
    full = moe_layers(path)[0]
    num_experts = full.num_experts
    ranks = [
        moe_layers(path, list(range(0, num_experts, 2)))[0],
        moe_layers(path, list(range(1, num_experts, 2)))[0],
    ]
    x = hidden_states(11)
    topk_ids, topk_weights = ranks[0].route(x)  # any rank routes identically
    flat_ids = topk_ids.reshape(-1)  # [T*k]
    rows = x.repeat_interleave(full.top_k, dim=0)  # [T*k, H], token-major like topk_ids
    expert_out = torch.empty_like(rows)
    for rank, layer in enumerate(ranks):
        mine = (flat_ids % 2 == rank).nonzero().squeeze(1)  # rows dispatched to this rank
        expert_out[mine] = layer.expert_forward(rows[mine], flat_ids[mine])
    out = full.combine(expert_out, topk_weights)
    shared = full.shared_forward(x)
    if shared is not None:
        out = out + shared
    torch.testing.assert_close(out, full(x), atol=1e-6, rtol=1e-5)
    assert (shared is not None) == (preset == "qwen2-moe")


def test_expert_forward_matches_a_plain_gated_mlp(hf_checkpoint) -> None:
    layer = moe_layers(hf_checkpoint("qwen3-moe").path, expert_ids=[6, 2])[0]
    x = hidden_states(5)
    ids = torch.tensor([6, 2, 6, 6, 2])
    out = layer.expert_forward(x, ids)
    for row, expert_id in enumerate(ids.tolist()):
        local = layer.expert_ids.index(expert_id)
        gate, up = (layer.gate_up_proj[local] @ x[row]).chunk(2)
        expected = layer.down_proj[local] @ (torch.nn.functional.silu(gate) * up)
        torch.testing.assert_close(out[row], expected, atol=1e-6, rtol=1e-5)


def test_expert_ids_out_of_range_are_refused(hf_checkpoint) -> None:
    with pytest.raises(ConfigError, match="expert ids"):
        moe_layers(hf_checkpoint("mixtral").path, expert_ids=[0, 4])
