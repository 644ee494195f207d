"""The fused MoE (Triton grouped GEMMs) against the torch loop over experts, interpreted.

Not collected directly (no ``test_`` prefix): ``test_moe_interpreter.py`` runs this file in a
fresh process with ``TRITON_INTERPRET=1``. By hand on CPU:
``TRITON_INTERPRET=1 .venv/bin/pytest tests/unit/engine/models/moe_cases.py``.

Both paths round each expert's output to the model dtype and weigh it in float32, but their
float32 dot products add in different orders (and SiLU's ``exp`` is numpy's here), so half
precision results are compared within a few of their ulps and float32 ones tightly. The torch
path's int8 matmul rounds activations and scales to bfloat16 on CPU, so int8 layers are also
checked against the same layer with its weights dequantized.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.attention import AttentionMetadata, get_backend
from engine.attention.triton_kernels import interpreter_active
from engine.builtin import resolve_model
from engine.loader import load_model
from engine.models import CausalLM, ModelArchConfig
from engine.models.kernels import TritonKernels
from engine.models.moe import MoELayer

BASE = ModelArchConfig(
    architecture="Qwen2MoeForCausalLM",
    hidden_size=64,
    num_layers=1,
    num_heads=4,
    num_kv_heads=4,
    head_dim=16,
    intermediate_size=128,
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
    num_experts=8,
    top_k=2,
    moe_intermediate_size=48,  # not a power of two: the N / K tails are masked
)
TOLERANCE = {
    torch.float32: {"atol": 2e-5, "rtol": 1e-4},
    torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2},
    torch.float16: {"atol": 4e-3, "rtol": 4e-3},
}
INT8_TOLERANCE = {"atol": 5e-2, "rtol": 5e-2}  # the torch path's bf16 activations and scales


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def make_layers(
    config: ModelArchConfig, dtype: torch.dtype, seed: int, expert_ids: list[int] | None = None
) -> tuple[MoELayer, MoELayer]:
    """The same random layer twice: fused kernels, then the torch reference."""
    fused = MoELayer(
        config, dtype=dtype, device="cpu", expert_ids=expert_ids, kernels=TritonKernels()
    )
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in fused.parameters():
            fan_in = param.shape[-1]
            param.copy_(torch.randn(param.shape, generator=gen) / fan_in**0.5)
    reference = MoELayer(config, dtype=dtype, device="cpu", expert_ids=expert_ids)
    reference.load_state_dict(fused.state_dict())
    return fused.eval(), reference.eval()


def hidden_states(num_tokens: int, config: ModelArchConfig, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_tokens, config.hidden_size, generator=gen).to(dtype)


def test_kernels_run_interpreted() -> None:
    assert interpreter_active(), "set TRITON_INTERPRET=1 before triton is imported"


# (tokens, top_k, experts, shared expert size, dtype)
LAYER_CASES = [
    (1, 1, 8, 0, torch.float32),
    (7, 2, 8, 64, torch.float32),
    (64, 2, 8, 0, torch.float32),
    (29, 8, 32, 0, torch.float32),
    (33, 2, 16, 64, torch.bfloat16),
    (64, 8, 32, 0, torch.bfloat16),
    (2, 8, 8, 0, torch.bfloat16),
    (17, 1, 32, 64, torch.float16),
    (48, 8, 16, 0, torch.float16),
]


def layer_case_id(case: tuple) -> str:
    tokens, top_k, experts, shared, dtype = case
    return f"t{tokens}-top{top_k}-e{experts}-shared{shared}-{dtype_id(dtype)}"


@pytest.mark.parametrize("case", LAYER_CASES, ids=layer_case_id)
@torch.inference_mode()
def test_fused_layer_matches_torch_loop(case: tuple) -> None:
    tokens, top_k, experts, shared, dtype = case
    config = dataclasses.replace(
        BASE, num_experts=experts, top_k=top_k, shared_expert_intermediate_size=shared
    )
    fused, reference = make_layers(config, dtype, seed=tokens)
    x = hidden_states(tokens, config, dtype, seed=tokens + 1)
    out = fused(x)
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out, reference(x), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=dtype_id)
@torch.inference_mode()
def test_int8_experts(dtype: torch.dtype) -> None:
    config = dataclasses.replace(BASE, num_experts=16, top_k=2)
    fused, reference = make_layers(config, dtype, seed=5)
    fused.quantize_int8()
    reference.quantize_int8()
    assert fused.gate_up_proj.dtype == torch.int8
    x = hidden_states(21, config, dtype, seed=6)
    out = fused(x)
    torch.testing.assert_close(out, reference(x), **INT8_TOLERANCE)
    # the same layer with dequantized weights, in the model dtype: the kernel's own arithmetic
    dequantized, _ = make_layers(config, dtype, seed=5)
    assert fused.gate_up_scale is not None and fused.down_scale is not None
    with torch.no_grad():
        dequantized.gate_up_proj.copy_(fused.gate_up_proj.float() * fused.gate_up_scale[..., None])
        dequantized.down_proj.copy_(fused.down_proj.float() * fused.down_scale[..., None])
    torch.testing.assert_close(out, dequantized(x), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@torch.inference_mode()
def test_layer_owning_some_experts_skips_the_others(dtype: torch.dtype) -> None:
    config = dataclasses.replace(BASE, num_experts=16, top_k=4)
    owned = [1, 2, 5, 11, 12, 15]
    full, _ = make_layers(config, dtype, seed=7)
    partial, partial_reference = make_layers(config, dtype, seed=7, expert_ids=owned)
    with torch.no_grad():  # the full layer's router and owned experts
        partial.gate.weight.copy_(full.gate.weight)
        partial.gate_up_proj.copy_(full.gate_up_proj[owned])
        partial.down_proj.copy_(full.down_proj[owned])
        partial_reference.load_state_dict(partial.state_dict())
    x = hidden_states(19, config, dtype, seed=8)
    topk_ids, topk_weights = full.route(x)  # [T, k]
    mine = torch.isin(topk_ids, torch.tensor(owned))  # [T, k]
    assert mine.any() and not mine.all()
    # the full layer's output over the owned slots only
    expert_out = full.expert_forward(x, topk_ids.reshape(-1), config.top_k)  # [T*k, H]
    expected = full.combine(expert_out, topk_weights * mine)
    out = partial(x)
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])
    torch.testing.assert_close(out, partial_reference(x), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
@torch.inference_mode()
def test_expert_forward_of_dispatched_rows(dtype: torch.dtype) -> None:
    # The expert-parallel entry: rows already dispatched here, one expert id each, unweighted.
    config = dataclasses.replace(BASE, num_experts=32, top_k=8)
    owned = list(range(3, 32, 3))
    fused, reference = make_layers(config, dtype, seed=9, expert_ids=owned)
    gen = torch.Generator().manual_seed(10)
    ids = torch.tensor(owned)[torch.randint(0, len(owned), (37,), generator=gen)]
    rows = hidden_states(37, config, dtype, seed=11)
    out = fused.expert_forward(rows, ids)
    assert out.dtype == dtype
    torch.testing.assert_close(out, reference.expert_forward(rows, ids), **TOLERANCE[dtype])


@torch.inference_mode()
def test_no_tokens() -> None:
    fused, _ = make_layers(BASE, torch.float32, seed=12)
    assert fused(torch.empty(0, BASE.hidden_size)).shape == (0, BASE.hidden_size)


@torch.inference_mode()
def test_fused_layer_traces_in_one_graph_under_torch_compile() -> None:
    # A custom op with a fake implementation and no host sync: no graph break (the torch loop
    # over experts is excluded from tracing instead).
    config = dataclasses.replace(BASE, shared_expert_intermediate_size=64)
    fused, _ = make_layers(config, torch.bfloat16, seed=13)
    x = hidden_states(11, config, torch.bfloat16, seed=14)
    compiled = torch.compile(fused, backend="aot_eager", fullgraph=True, dynamic=True)
    assert torch.equal(compiled(x), fused(x))


# --- a whole built-in MoE model, fused against the torch path -----------------------------------


@torch.inference_mode()
def test_tiny_moe_model_greedy_tokens_match_torch_path() -> None:
    path = resolve_model("builtin:tiny-moe")
    models = [
        load_model(
            path,
            dtype=torch.float32,
            device="cpu",
            attn_backend=get_backend("torch"),
            fused_kernels=fused,
        )
        for fused in (True, False)
    ]
    assert isinstance(models[0].layers[0].mlp, MoELayer) and models[0].kernels.fused
    logits = [greedy_logits(model) for model in models]
    torch.testing.assert_close(logits[0], logits[1], atol=1e-4, rtol=1e-4)
    assert torch.equal(logits[0].argmax(-1), logits[1].argmax(-1))


BLOCK_SIZE = 16
NEW_TOKENS = 4


def greedy_logits(model: CausalLM) -> torch.Tensor:
    """Logits [NEW_TOKENS, 2 seqs, vocab] float32: two prompts (6 and 3 tokens), then greedy
    decoding, the model choosing its own next tokens."""
    config = model.config
    tables = [[0], [1]]
    kv_cache = torch.zeros(config.kv_cache_shape(2, BLOCK_SIZE), dtype=model.dtype)
    gen = torch.Generator().manual_seed(2)
    prompt_lens = [6, 3]
    prompts = [torch.randint(3, config.vocab_size, (n,), generator=gen) for n in prompt_lens]
    meta = AttentionMetadata.build(prompt_lens, prompt_lens, tables, BLOCK_SIZE)
    positions = torch.cat([torch.arange(n) for n in prompt_lens])
    hidden = model(torch.cat(prompts), positions, kv_cache, meta)
    last_rows = torch.tensor([prompt_lens[0] - 1, sum(prompt_lens) - 1])
    steps = [model.compute_logits(hidden[last_rows])]  # [2, vocab]
    seq_lens = list(prompt_lens)
    for _ in range(NEW_TOKENS - 1):
        next_ids = steps[-1].argmax(-1)
        positions = torch.tensor(seq_lens)
        seq_lens = [n + 1 for n in seq_lens]
        meta = AttentionMetadata.build([1, 1], seq_lens, tables, BLOCK_SIZE)
        steps.append(model.compute_logits(model(next_ids, positions, kv_cache, meta)))
    return torch.stack(steps)
