"""The fused MoE compiled on a GPU: against the torch loop over experts at serving shapes, free
of host syncs (so captured in a CUDA graph), and through a whole MoE model and engine."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import SamplingParams
from engine.attention import AttentionMetadata, get_backend
from engine.builtin import resolve_model
from engine.loader import load_model
from engine.models import CausalLM, ModelArchConfig
from engine.models.kernels import TritonKernels
from engine.models.moe import MoELayer
from tests.gpu.helpers import fresh_seed, gpu_llm, random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

DEVICE = "cuda"
MOE = "builtin:tiny-moe"
BASE = ModelArchConfig(
    architecture="Qwen2MoeForCausalLM",
    hidden_size=1024,
    num_layers=1,
    num_heads=8,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=2048,
    vocab_size=32,
    rope_theta=10000.0,
    rope_scaling=None,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    qkv_bias=False,
    o_bias=False,
    qk_norm=False,
    max_position_embeddings=128,
    bos_token_id=None,
    eos_token_ids=(),
    num_experts=64,
    top_k=8,
    moe_intermediate_size=704,  # not a multiple of the wider tiles: masked tails
)
TOLERANCE = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-4},
    torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2},
    torch.float16: {"atol": 5e-3, "rtol": 5e-3},
}


def make_layers(
    config: ModelArchConfig, dtype: torch.dtype, seed: int, expert_ids: list[int] | None = None
) -> tuple[MoELayer, MoELayer]:
    """The same random layer on CUDA twice: fused kernels, then the torch loop."""
    fused = MoELayer(
        config, dtype=dtype, device=DEVICE, expert_ids=expert_ids, kernels=TritonKernels()
    )
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    with torch.no_grad():
        for param in fused.parameters():
            noise = torch.randn(param.shape, generator=gen, device=DEVICE)
            param.copy_(noise / param.shape[-1] ** 0.5)
    reference = MoELayer(config, dtype=dtype, device=DEVICE, expert_ids=expert_ids)
    reference.load_state_dict(fused.state_dict())
    return fused.eval(), reference.eval()


def hidden_states(num_tokens: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randn(num_tokens, BASE.hidden_size, generator=gen, device=DEVICE).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("num_tokens", [1, 7, 64, 512])
@pytest.mark.parametrize(("num_experts", "top_k"), [(64, 8), (128, 8), (128, 2)])
@torch.inference_mode()
def test_fused_layer_matches_torch_loop(
    dtype: torch.dtype, num_tokens: int, num_experts: int, top_k: int
) -> None:
    seed = fresh_seed()
    config = dataclasses.replace(BASE, num_experts=num_experts, top_k=top_k)
    fused, reference = make_layers(config, dtype, seed)
    x = hidden_states(num_tokens, dtype, seed + 1)
    torch.testing.assert_close(fused(x), reference(x), **TOLERANCE[dtype], msg=f"seed {seed}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("num_tokens", [3, 256])
@torch.inference_mode()
def test_int8_experts_match_dequantized_weights(dtype: torch.dtype, num_tokens: int) -> None:
    seed = fresh_seed()
    fused, dequantized = make_layers(BASE, dtype, seed)
    fused.quantize_int8()
    assert fused.gate_up_scale is not None and fused.down_scale is not None
    with torch.no_grad():
        dequantized.gate_up_proj.copy_(fused.gate_up_proj.float() * fused.gate_up_scale[..., None])
        dequantized.down_proj.copy_(fused.down_proj.float() * fused.down_scale[..., None])
    x = hidden_states(num_tokens, dtype, seed + 1)
    torch.testing.assert_close(fused(x), dequantized(x), **TOLERANCE[dtype], msg=f"seed {seed}")


@torch.inference_mode()
def test_partly_owned_layer_syncs_nothing_and_replays_in_a_graph() -> None:
    seed = fresh_seed()
    owned = list(range(0, 64, 3))
    fused, reference = make_layers(BASE, torch.bfloat16, seed, expert_ids=owned)
    static_x = hidden_states(32, torch.bfloat16, seed + 1)
    torch.cuda.set_sync_debug_mode("error")  # any device -> host copy raises
    try:
        fused(static_x)  # compiles the kernels outside the capture
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fused(static_x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fused(static_x)
    for step in range(3):  # new tokens, new routing: same graph
        static_x.copy_(hidden_states(32, torch.bfloat16, seed + 2 + step))
        graph.replay()
        expected = reference(static_x)  # the torch loop skips the unowned experts too
        torch.testing.assert_close(static_out, expected, **TOLERANCE[torch.bfloat16])


@torch.inference_mode()
def test_tiny_moe_fused_vs_torch_path_token_identical_in_fp32() -> None:
    seed = fresh_seed()
    path = resolve_model(MOE)
    tokens = []
    for fused in (True, False):
        model = load_model(
            path,
            dtype=torch.float32,
            device=DEVICE,
            attn_backend=get_backend("triton"),
            fused_kernels=fused,
        )
        tokens.append(_greedy(model, seed, steps=24))
    assert tokens[0] == tokens[1], f"seed {seed}"


def _greedy(model: CausalLM, seed: int, steps: int) -> list[list[int]]:
    """Greedy tokens [3 seqs][steps] after prompts of 40, 7 and 300 random tokens."""
    lens, block_size = [40, 7, 300], 16
    tables = [list(range(0, 5)), list(range(5, 7)), list(range(7, 28))]
    kv_cache = torch.zeros(model.config.kv_cache_shape(28, block_size), device=DEVICE)
    prompts = random_prompts(lens, model.config.vocab_size, seed)
    ids = torch.tensor([t for p in prompts for t in p], device=DEVICE)
    positions = torch.cat([torch.arange(n) for n in lens]).to(DEVICE)
    meta = AttentionMetadata.build(lens, lens, tables, block_size, DEVICE)
    hidden = model(ids, positions, kv_cache, meta)
    last = torch.tensor(lens).cumsum(0) - 1
    out = [model.compute_logits(hidden[last.to(DEVICE)]).argmax(-1)]
    seq_lens = list(lens)
    for _ in range(steps - 1):
        positions = torch.tensor(seq_lens, device=DEVICE)
        seq_lens = [n + 1 for n in seq_lens]
        meta = AttentionMetadata.build([1] * len(lens), seq_lens, tables, block_size, DEVICE)
        out.append(model.compute_logits(model(out[-1], positions, kv_cache, meta)).argmax(-1))
    return torch.stack(out, dim=1).tolist()


def test_moe_engine_decodes_through_graphs_as_eagerly() -> None:
    seed = fresh_seed()
    prompts = random_prompts([5, 12, 30, 2, 64], 320, seed)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    eager = gpu_llm(MOE, dtype="float32", max_num_seqs=8, enforce_eager=True)
    expected = eager.generate(prompt_token_ids=prompts, sampling_params=params)
    graphed = gpu_llm(MOE, dtype="float32", max_num_seqs=8)
    graphs = graphed.engine.runner.graphs
    assert graphs is not None and graphs.batch_sizes == (1, 2, 4, 8)
    outs = graphed.generate(prompt_token_ids=prompts, sampling_params=params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected], f"seed={seed}"
    graphed.engine.scheduler.check_integrity()
