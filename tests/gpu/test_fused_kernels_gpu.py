"""The fused model kernels (residual add + RMSNorm, SiLU * mul, RoPE + KV-cache write) compiled on
a GPU, at serving shapes, against the torch path they replace; then a model forward each way.

Bit-exact where both sides do the same float operations: the residual sum, RoPE in bfloat16
and the bytes the cache write stores. RMSNorm's float32 sum of squares runs in another order than
torch's reduction, so the normalised value may land an ulp off before the weight multiplies it,
two after (seen on an H200); SiLU's ``exp`` is libdevice's ``expf`` on both sides, with the same
slack. RoPE in float16 and float32 may keep a product unrounded or contract the multiply-add
(also seen on an H200): it is held to one rounding of each product.
"""

from __future__ import annotations

import pytest
import torch

from engine.attention import AttentionMetadata, get_backend
from engine.attention.triton_kernels import rope_and_write_kv_cache, write_kv_cache
from engine.models import CausalLM, ModelArchConfig
from engine.models.kernels import TORCH_KERNELS
from engine.models.rope import RotaryEmbedding, apply_rope
from engine.models.triton_kernels import add_rms_norm, rms_norm, silu_and_mul
from tests.gpu.helpers import fresh_seed
from tests.unit.engine.models.hf_checkpoints import MODEL_CLASSES, PRESETS, randomize_weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

DEVICE = "cuda"
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
DTYPE_IDS = ["bf16", "fp16", "fp32"]
MAX_OFF_SHARE = 0.01


def randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    return (torch.randn(*shape, generator=gen, device=DEVICE) * scale).to(dtype)


def assert_close_ulps(out: torch.Tensor, expected: torch.Tensor, max_ulps: int, seed: int) -> None:
    assert out.dtype == expected.dtype and out.shape == expected.shape
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5, msg=f"seed {seed}")
        return
    steps = (out.view(torch.int16).int() - expected.view(torch.int16).int()).abs()
    share = (steps > 0).float().mean().item()
    assert steps.max().item() <= max_ulps, f"seed {seed}: {steps.max().item()} ulps"
    assert share <= MAX_OFF_SHARE, f"seed {seed}: {share:.2%} of elements differ"


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("num_tokens", [1, 37, 2048])
@pytest.mark.parametrize("hidden", [2048, 4096, 5120])
def test_add_rms_norm(dtype: torch.dtype, num_tokens: int, hidden: int) -> None:
    seed = fresh_seed()
    x = randn(num_tokens, hidden, dtype=dtype, seed=seed)
    residual = randn(num_tokens, hidden, dtype=dtype, seed=seed + 1, scale=8.0)
    weight = randn(hidden, dtype=dtype, seed=seed + 2, scale=0.2) + 1
    normed, summed = add_rms_norm(x, residual, weight, 1e-5)
    expected_normed, expected_summed = TORCH_KERNELS.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(summed, expected_summed), f"seed {seed}"
    assert_close_ulps(normed, expected_normed, 2, seed)
    assert_close_ulps(rms_norm(x, weight, 1e-5), TORCH_KERNELS.rms_norm(x, weight, 1e-5), 2, seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("num_tokens", [1, 37, 2048])
@pytest.mark.parametrize("intermediate", [8192, 14336])
def test_silu_and_mul(dtype: torch.dtype, num_tokens: int, intermediate: int) -> None:
    seed = fresh_seed()
    gate_up = randn(num_tokens, 2 * intermediate, dtype=dtype, seed=seed, scale=3.0)
    out = silu_and_mul(gate_up)
    assert_close_ulps(out, TORCH_KERNELS.silu_and_mul(gate_up), 2, seed)


ROPE_SHAPES = [(32, 8, 64), (32, 8, 128), (16, 1, 128), (28, 4, 128)]  # (heads, kv heads, D)


@pytest.mark.parametrize("cache_dtype", [None, torch.int8, torch.float8_e4m3fn])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    "shape", ROPE_SHAPES, ids=[f"{h}q-{kv}kv-d{d}" for h, kv, d in ROPE_SHAPES]
)
def test_rope_and_cache_write(shape, dtype, block_size, cache_dtype) -> None:
    seed = fresh_seed()
    num_heads, num_kv_heads, head_dim = shape
    num_tokens, num_blocks = 777, 64
    qkv = randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, dtype=dtype, seed=seed)
    q, k = qkv[:, :num_heads], qkv[:, num_heads : num_heads + num_kv_heads]
    v = qkv[:, num_heads + num_kv_heads :]
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    positions = torch.randint(0, 131072, (num_tokens,), generator=gen, device=DEVICE)
    cos, sin = RotaryEmbedding(head_dim, 5e5, None, dtype, DEVICE)(positions)
    slots = torch.randperm(num_blocks * block_size, generator=gen, device=DEVICE)[:num_tokens]
    slots[::17] = -1  # padding tokens write nothing
    row = head_dim + (2 if cache_dtype is not None else 0)
    shape_cache = (num_blocks, 2, 2, block_size, num_kv_heads, row)
    garbage = torch.randint(-100, 100, shape_cache, generator=gen, device=DEVICE)
    cache = garbage.to(cache_dtype or dtype)
    expected_cache = cache.clone()

    q_out = rope_and_write_kv_cache(cache[:, 1], q, k, v, cos, sin, slots)
    if dtype == torch.bfloat16:  # rounded by bit arithmetic: apply_rope's bits exactly
        assert torch.equal(q_out, apply_rope(q, cos, sin)), f"seed {seed}"
        write_kv_cache(expected_cache[:, 1], apply_rope(k, cos, sin), v, slots)
    else:
        # float16 and float32: the compiler may keep a product in float32 or contract the
        # multiply-add, so the rotation is checked against apply_rope within one rounding of
        # each product, and the bytes against a write of the kernel's own rotated k.
        assert_rotation_close(q_out, q, cos, sin, seed)
        k_out = rope_and_write_kv_cache(torch.zeros_like(cache[:, 1]), k, k, v, cos, sin, slots)
        assert_rotation_close(k_out, k, cos, sin, seed)
        write_kv_cache(expected_cache[:, 1], k_out, v, slots)
    assert torch.equal(cache.view(torch.uint8), expected_cache.view(torch.uint8)), f"seed {seed}"


def assert_rotation_close(
    out: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seed: int
) -> None:
    """``out`` is ``apply_rope(x)`` up to one rounding of each product and of their sum."""
    rolled = x.roll(x.shape[-1] // 2, dims=-1).float()
    terms = (x.float() * cos.float()).abs() + (rolled * sin.float()).abs()
    bound = 2 * torch.finfo(x.dtype).eps * terms + torch.finfo(x.dtype).tiny
    error = (out.float() - apply_rope(x, cos, sin).float()).abs()
    assert bool((error <= bound).all()), f"seed {seed}: worst {(error / bound).max().item():.2f}"


@pytest.mark.parametrize("preset", ["llama", "mistral-swa", "qwen3-moe", "qwen2-moe"])
def test_model_forward_fused_vs_torch_path(preset: str) -> None:
    hf_config = PRESETS[preset]()
    raw = {**hf_config.to_dict(), "architectures": [MODEL_CLASSES[type(hf_config)].__name__]}
    config = ModelArchConfig.from_hf_dict(raw)
    logits = []
    for fused in (True, False):
        model = CausalLM(
            config, get_backend("triton"), dtype=torch.bfloat16, device=DEVICE, fused_kernels=fused
        )
        randomize_weights(model, seed=0)
        assert model.layers[0].self_attn.fuse_rope == fused
        logits.append(_prefill_logits(model.eval()))
    torch.testing.assert_close(logits[0], logits[1], atol=3e-2, rtol=3e-2)


@torch.inference_mode()
def _prefill_logits(model: CausalLM) -> torch.Tensor:  # [T, vocab] float32
    lens, block_size = [300, 45, 1], 16
    tables = [list(range(0, 19)), list(range(19, 22)), [22]]
    kv_cache = torch.zeros(model.config.kv_cache_shape(23, block_size), dtype=model.dtype)
    kv_cache = kv_cache.to(DEVICE)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, model.config.vocab_size, (sum(lens),), generator=gen).to(DEVICE)
    positions = torch.cat([torch.arange(n) for n in lens]).to(DEVICE)
    meta = AttentionMetadata.build(lens, lens, tables, block_size, DEVICE)
    return model.compute_logits(model(ids, positions, kv_cache, meta))
