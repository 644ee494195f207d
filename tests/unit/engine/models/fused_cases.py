"""The fused Triton kernels of the model layers against the torch path they replace.

Not collected directly (no ``test_`` prefix): ``test_fused_interpreter.py`` runs this file in a
fresh process with ``TRITON_INTERPRET=1`` (Triton picks compiled vs interpreted kernels when it is
first imported). By hand on CPU:
``TRITON_INTERPRET=1 .venv/bin/pytest tests/unit/engine/models/fused_cases.py``.

"Bit-exact" is asserted wherever the kernel and torch do the same float operations in the same
order. Two places they cannot: the float32 sum of squares of RMSNorm (a reduction order no two
implementations share) and ``exp`` inside SiLU (numpy's here, torch's own on CPU). There a half
precision result may differ by one ulp where the float32 value sits on a rounding boundary; those
tests check the kernel bit for bit against the same arithmetic with numpy's ``exp`` or on inputs
whose sums are exact, and against torch within one ulp (two after SiLU's product) on a tiny share
of elements.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
import torch

from engine.attention import AttentionMetadata, get_backend
from engine.attention.opaque import OpaqueAttention, attention_step
from engine.attention.torch_backend import write_kv_cache as torch_write_kv_cache
from engine.attention.triton_kernels import interpreter_active, rope_and_write_kv_cache
from engine.kv.quantized_rows import SCALE_BYTES
from engine.models import CausalLM, ModelArchConfig
from engine.models.kernels import TORCH_KERNELS
from engine.models.rope import RotaryEmbedding, apply_rope
from engine.models.triton_kernels import add_rms_norm, rms_norm, silu_and_mul
from engine.triton_launch import INTERPRETER, kernel_target
from engine.triton_launch import target as launch_target
from tests.unit.engine.models.hf_checkpoints import MODEL_CLASSES, PRESETS, randomize_weights

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
HALF = [torch.bfloat16, torch.float16]
FP32_TOLERANCE = {"atol": 1e-6, "rtol": 1e-5}
MAX_OFF_BY_ONE_SHARE = 0.01  # of elements one ulp away from torch (rounding-boundary cases)


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def assert_bits_equal(out: torch.Tensor, expected: torch.Tensor) -> None:
    assert out.dtype == expected.dtype and out.shape == expected.shape
    mismatched = (out.view(torch.uint8) != expected.view(torch.uint8)).sum().item()
    assert mismatched == 0, f"{mismatched} bytes differ"


def assert_within_one_ulp(out: torch.Tensor, expected: torch.Tensor, max_ulps: int = 1) -> None:
    """Equal except on a tiny share of elements, which are ``max_ulps`` apart at most."""
    assert out.dtype == expected.dtype and out.shape == expected.shape
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, expected, **FP32_TOLERANCE)
        return
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16}[out.dtype]
    steps = (out.view(bits).int() - expected.view(bits).int()).abs()  # same sign: ulps apart
    assert steps.max().item() <= max_ulps
    assert (steps > 0).float().mean().item() <= MAX_OFF_BY_ONE_SHARE


def random(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def coarse(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Multiples of 1/8 in [-2, 2]: squares and their sums are exact in float32 in any order."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(-16, 17, shape, generator=gen) / 8).to(dtype)


def test_kernels_run_interpreted() -> None:
    assert interpreter_active(), "set TRITON_INTERPRET=1 before triton is imported"


# --- RMSNorm, with and without the residual add -------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(7, 64), (3, 5, 96)], ids=["2d", "3d-h96"])
def test_rms_norm_matches_torch(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x = random(*shape, dtype=dtype, seed=1, scale=3.0)
    weight = random(shape[-1], dtype=dtype, seed=2, scale=0.5) + 1
    assert_within_one_ulp(rms_norm(x, weight, 1e-6), TORCH_KERNELS.rms_norm(x, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_add_rms_norm_matches_torch(dtype: torch.dtype) -> None:
    x = random(9, 128, dtype=dtype, seed=3)
    residual = random(9, 128, dtype=dtype, seed=4, scale=4.0)
    weight = random(128, dtype=dtype, seed=5, scale=0.5) + 1
    normed, summed = add_rms_norm(x, residual, weight, 1e-5)
    expected_normed, expected_summed = TORCH_KERNELS.add_rms_norm(x, residual, weight, 1e-5)
    assert_bits_equal(summed, expected_summed)
    assert_within_one_ulp(normed, expected_normed)


@pytest.mark.parametrize("dtype", HALF, ids=dtype_id)
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_rms_norm_bit_exact_when_sums_are_exact(dtype: torch.dtype, with_residual: bool) -> None:
    # Exact sums of squares take the reduction order out: what is left are the roundings.
    x = coarse(16, 192, dtype=dtype, seed=6)
    residual = coarse(16, 192, dtype=dtype, seed=7)
    weight = random(192, dtype=dtype, seed=8) + 1
    if with_residual:
        out, summed = add_rms_norm(x, residual, weight, 1e-6)
        expected, expected_summed = TORCH_KERNELS.add_rms_norm(x, residual, weight, 1e-6)
        assert_bits_equal(summed, expected_summed)
    else:
        out, expected = rms_norm(x, weight, 1e-6), TORCH_KERNELS.rms_norm(x, weight, 1e-6)
    assert_bits_equal(out, expected)


def test_rms_norm_of_no_rows() -> None:
    x = torch.empty(0, 64)
    assert rms_norm(x, torch.ones(64), 1e-6).shape == (0, 64)


# --- SiLU * mul ---------------------------------------------------------------------------------


def silu_mul_numpy_exp(gate_up: torch.Tensor) -> torch.Tensor:
    """torch's rounding sequence with numpy's float32 ``exp`` (the interpreter's)."""
    gate, up = gate_up.chunk(2, dim=-1)
    g = gate.float()
    decay = torch.from_numpy(np.exp(-g.numpy()))
    silu = (g / (1 + decay)).to(gate.dtype)
    return silu * up


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(6, 2 * 96), (2, 3, 2 * 256)], ids=["2d-i96", "3d-i256"])
def test_silu_and_mul(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    gate_up = random(*shape, dtype=dtype, seed=9, scale=3.0)
    out = silu_and_mul(gate_up)
    assert_bits_equal(out, silu_mul_numpy_exp(gate_up))
    # a silu one ulp off can move the rounded product by two
    assert_within_one_ulp(out, TORCH_KERNELS.silu_and_mul(gate_up), max_ulps=2)


def test_silu_and_mul_reads_a_strided_view() -> None:
    gate_up = random(4, 3 * 64, dtype=torch.bfloat16, seed=10)[:, 32 : 32 + 128]  # row stride 192
    assert_bits_equal(silu_and_mul(gate_up), silu_mul_numpy_exp(gate_up))


# --- RoPE + KV-cache write ----------------------------------------------------------------------

ROPE_CASES = [
    # (dtype, head_dim, num_heads, num_kv_heads, block_size, cache dtype or None for the model's)
    (torch.float32, 64, 4, 4, 16, None),
    (torch.bfloat16, 128, 8, 2, 32, None),
    (torch.float16, 64, 8, 1, 16, None),
    (torch.bfloat16, 64, 8, 1, 32, torch.int8),
    (torch.float16, 128, 4, 4, 16, torch.float8_e4m3fn),
    (torch.float32, 128, 8, 2, 32, torch.int8),
]


def rope_case_id(case: tuple) -> str:
    dtype, head_dim, heads, kv_heads, block_size, cache_dtype = case
    cache = "model" if cache_dtype is None else dtype_id(cache_dtype)
    return f"{dtype_id(dtype)}-d{head_dim}-{heads}q{kv_heads}kv-bs{block_size}-{cache}"


@pytest.mark.parametrize("case", ROPE_CASES, ids=rope_case_id)
@pytest.mark.parametrize("qk_layout", ["qkv-view", "separate"])
def test_rope_and_cache_write_match_torch(case: tuple, qk_layout: str) -> None:
    dtype, head_dim, num_heads, num_kv_heads, block_size, cache_dtype = case
    num_tokens, num_blocks = 11, 4
    qkv = random(num_tokens, num_heads + 2 * num_kv_heads, head_dim, dtype=dtype, seed=11)
    q, k = qkv[:, :num_heads], qkv[:, num_heads : num_heads + num_kv_heads]
    v = qkv[:, num_heads + num_kv_heads :]
    if qk_layout == "separate":  # as after Qwen3's q/k norm: contiguous tensors of their own
        q, k = q.contiguous(), k.contiguous()
    positions = torch.tensor([0, 1, 2, 3, 4, 40, 41, 1000, 7, 65000, 3])
    cos, sin = RotaryEmbedding(head_dim, 1e6, None, dtype, "cpu")(positions)
    # shuffled slots over the blocks; three padding tokens write nothing
    slots = torch.randperm(num_blocks * block_size, generator=torch.Generator().manual_seed(12))
    slots = slots[:num_tokens].clone()
    slots[[2, 6, 10]] = -1
    row = head_dim + (2 if cache_dtype is not None else 0)
    shape = (num_blocks, 3, 2, block_size, num_kv_heads, row)  # 3 layers: a strided layer view
    garbage = torch.randint(-100, 100, shape, generator=torch.Generator().manual_seed(13))
    cache = garbage.to(cache_dtype or dtype)
    expected_cache = cache.clone()

    q_out = rope_and_write_kv_cache(cache[:, 1], q, k, v, cos, sin, slots)
    expected_q, expected_k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    valid = slots >= 0
    torch_write_kv_cache(
        expected_cache[:, 1], expected_k[valid], v[valid], slots[valid], block_size
    )
    assert_bits_equal(q_out, expected_q)
    assert_bits_equal(cache, expected_cache)


def test_rope_of_no_tokens() -> None:
    cache = torch.zeros(2, 2, 16, 1, 64)
    empty = torch.empty(0, 1, 64)
    q_out = rope_and_write_kv_cache(cache, empty, empty, empty, empty, empty, torch.empty(0).long())
    assert q_out.shape == (0, 1, 64)
    assert not cache.any()


# --- a whole model: fused kernels against the torch path ----------------------------------------

# GQA; a sliding window; q/k norm + MoE; a shared expert
MODEL_PRESETS = ["llama", "mistral-swa", "qwen3-moe", "qwen2-moe"]
PROMPT_LENS = (30, 7)  # the first longer than mistral-swa's window of 24
BLOCK_SIZE = 16


def build_model(preset: str, dtype: torch.dtype, backend_name: str, fused: bool) -> CausalLM:
    hf_config = PRESETS[preset]()
    raw = {**hf_config.to_dict(), "architectures": [MODEL_CLASSES[type(hf_config)].__name__]}
    config = ModelArchConfig.from_hf_dict(raw)
    model = CausalLM(config, get_backend(backend_name), dtype=dtype, fused_kernels=fused)
    randomize_weights(model, seed=0)
    return model.eval()


Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


@torch.inference_mode()
def prefill_then_decode(
    model: CausalLM, forward: Forward | None = None, kv_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Logits ([2 steps, 2 seqs, vocab] float32) of the last prompt token and of one decoded
    token per sequence, with the two sequences' blocks interleaved in the cache; ``forward``
    runs the model (``model`` itself by default); ``kv_dtype`` an 8-bit cache (rows of
    ``head_dim`` values and a float16 scale), else the model dtype's."""
    run = forward or model
    config = model.config
    tables = [[5, 0], [3]]  # 31 and 8 positions at most
    shape = config.kv_cache_shape(6, BLOCK_SIZE)
    if kv_dtype is None:
        kv_cache = torch.zeros(shape, dtype=model.dtype)
    else:
        kv_cache = torch.zeros((*shape[:-1], shape[-1] + SCALE_BYTES), dtype=kv_dtype)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, config.vocab_size, (n,), generator=gen) for n in PROMPT_LENS]
    meta = AttentionMetadata.build(PROMPT_LENS, PROMPT_LENS, tables, BLOCK_SIZE)
    positions = torch.cat([torch.arange(n) for n in PROMPT_LENS])
    hidden = run(torch.cat(prompts), positions, kv_cache, meta)
    last_rows = torch.tensor([PROMPT_LENS[0] - 1, sum(PROMPT_LENS) - 1])
    prefill_logits = model.compute_logits(hidden[last_rows])  # [2, vocab]
    next_ids = prefill_logits.argmax(-1)
    seq_lens = [n + 1 for n in PROMPT_LENS]
    meta = AttentionMetadata.build([1, 1], seq_lens, tables, BLOCK_SIZE)
    hidden = run(next_ids, torch.tensor(PROMPT_LENS), kv_cache, meta)
    return torch.stack([prefill_logits, model.compute_logits(hidden)])


@pytest.mark.parametrize("preset", MODEL_PRESETS)
def test_bf16_model_with_fused_kernels_matches_torch_path(preset: str) -> None:
    dtype = torch.bfloat16
    fused = build_model(preset, dtype, "triton", fused=True)
    assert fused.layers[0].self_attn.fuse_rope
    logits = prefill_then_decode(fused)
    # Same attention kernels, torch norms/activation/RoPE: bit for bit on these seeded inputs (a
    # normalised value or silu on a bf16 rounding boundary could flip one ulp; none does here).
    unfused = prefill_then_decode(build_model(preset, dtype, "triton", fused=False))
    assert_bits_equal(logits, unfused)
    # and the torch attention backend: close (its softmax runs in another order)
    eager = prefill_then_decode(build_model(preset, dtype, "torch", fused=False))
    torch.testing.assert_close(logits, eager, atol=5e-2, rtol=5e-2)


def test_fp8_kv_model_on_a_simulated_sm80_matches_the_torch_backend(monkeypatch) -> None:
    """An fp8_e4m3 KV cache on an A100 (simulated: the interpreter as compute capability 8.0,
    without native e4m3): the fused RoPE write, prefill and decode kernels go through the
    cache's bytes, and the model's logits stay those of the torch backend on the same cache."""
    monkeypatch.setattr(
        launch_target, "INTERPRETER", dataclasses.replace(INTERPRETER, capability=(8, 0))
    )
    assert not kernel_target(torch.device("cpu")).native_fp8_e4m3
    fp8 = torch.float8_e4m3fn
    fused = build_model("llama", torch.bfloat16, "triton", fused=True)
    logits = prefill_then_decode(fused, kv_dtype=fp8)
    eager = prefill_then_decode(build_model("llama", torch.bfloat16, "torch", False), kv_dtype=fp8)
    torch.testing.assert_close(logits, eager, atol=5e-2, rtol=5e-2)


def test_fp32_model_with_fused_kernels_is_close() -> None:
    fused = prefill_then_decode(build_model("llama", torch.float32, "triton", fused=True))
    unfused = prefill_then_decode(build_model("llama", torch.float32, "triton", fused=False))
    torch.testing.assert_close(fused, unfused, atol=1e-5, rtol=1e-5)


def test_fused_model_traces_under_torch_compile() -> None:
    # The kernels are custom ops with fake implementations, so dynamo traces the whole forward
    # in one graph (aot_eager: tracing and functionalisation without inductor's codegen).
    model = build_model("mistral-swa", torch.bfloat16, "triton", fused=True)  # dense: no breaks
    expected = prefill_then_decode(model)
    real_backend = model.layers[0].self_attn.backend
    for layer_idx, layer in enumerate(model.layers):
        layer.self_attn.backend = OpaqueAttention(layer_idx)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=True)

    def forward(
        ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        with attention_step(real_backend, kv_cache, meta):
            return compiled(ids, positions, kv_cache, None)

    assert_bits_equal(prefill_then_decode(model, forward), expected)
