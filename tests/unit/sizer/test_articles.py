"""The sizer reproduces the published numbers of the KV-cache articles in shared/seeds/.

Assumptions, as the articles state or imply them:

- KV per token = 2 x layers x kv_heads x head_dim x dtype bytes; "KB" and "GB" of KV sizes are
  binary (KiB, GiB): 57,344 B = 56 KB; 7 GB at 128K = 7 GiB.
- "2K", "8K", "32K", "128K" contexts are 2,048 ... 131,072 tokens.
- The H100 capacity table (Qwen2.5-7B, FP16): an 80 GB GPU (80e9 bytes), the article's measured
  14.2 GB of weights, and 90% of the memory left after the weights for KV (the rest is headroom
  for activations and fragmentation, the article's reason for stopping at 7 at 128K):
  KV budget = (80 - 14.2) x 0.9 = 59.22 GB.
- "Llama 3.1 70B at FP8" means an FP8 KV cache: 160 KB (KiB) per token. The same article's
  "128,000 tokens take roughly 40 gigabytes" is the BF16 figure; at FP8 it is 20 GiB.
"""

from __future__ import annotations

import pytest

from sizer.kv_capacity import SizingInputs, plan_capacity
from sizer.model_presets import get_preset
from sizer.shape import ModelShape

KIB, MIB, GIB = 1024, 1024**2, 1024**3


def test_qwen25_7b_kv_per_token() -> None:
    shape = get_preset("Qwen2.5-7B")
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (28, 4, 128)
    assert shape.kv_bytes_per_token("fp16") == 2 * 28 * 4 * 128 * 2 == 57_344
    assert shape.kv_bytes_per_token("fp16") / KIB == 56.0


def test_kv_grows_linearly_with_sequence_length() -> None:
    per_token = get_preset("Qwen2.5-7B").kv_bytes_per_token("fp16")
    table = {128: 7, 1024: 56, 4096: 224, 16384: 896}  # MB in the article (MiB)
    assert {n: per_token * n / MIB for n in table} == table


def test_kv_grows_linearly_with_batch_at_2k() -> None:
    per_request = get_preset("Qwen2.5-7B").kv_bytes_per_token("fp16") * 2048
    table = {1: "0.11", 8: "0.88", 32: "3.50", 64: "7.00"}  # GB in the article (GiB)
    assert {users: f"{users * per_request / GIB:.2f}" for users in table} == table


def test_h100_capacity_table_for_qwen25_7b() -> None:
    inputs = SizingInputs(
        gpu_memory_bytes=80 * 10**9,
        kv_dtype="fp16",
        weight_dtype="bf16",
        memory_utilization=0.9,
        weight_bytes=int(14.2e9),
    )
    plan = plan_capacity(get_preset("Qwen2.5-7B"), inputs)
    assert plan.tensor_parallel_size == 1
    assert plan.kv_budget_bytes_per_gpu == pytest.approx(59.22e9, rel=1e-9)
    capacity = {row.context_len_tokens: row.max_concurrent_requests for row in plan.table}
    assert capacity == {2048: 504, 8192: 126, 32768: 31, 131072: 7}
    per_request_128k = next(
        r.kv_bytes_per_request for r in plan.table if r.context_len_tokens == 131072
    )
    assert per_request_128k / GIB == 7.0


@pytest.mark.parametrize(
    ("name", "heads", "kv_heads", "ratio", "kib_per_token", "gib_at_128k", "savings_pct"),
    [
        ("Qwen2.5-7B", 28, 4, 7, 56, 7, 86),
        ("Mistral-7B", 32, 8, 4, 128, 16, 75),
        ("Qwen2.5-72B", 64, 8, 8, 320, 40, 88),
    ],
)
def test_gqa_table(
    name: str,
    heads: int,
    kv_heads: int,
    ratio: int,
    kib_per_token: int,
    gib_at_128k: int,
    savings_pct: int,
) -> None:
    shape = get_preset(name)
    assert (shape.num_attention_heads, shape.num_kv_heads, shape.gqa_ratio) == (
        heads,
        kv_heads,
        ratio,
    )
    per_token = shape.kv_bytes_per_token("fp16")
    assert per_token / KIB == kib_per_token
    assert per_token * 131072 / GIB == gib_at_128k
    savings = 1 - per_token / shape.mha_kv_bytes_per_token("fp16")
    assert round(savings * 100) == savings_pct
    # Without GQA the 72B model's 128K cache would be 320 GB: four H100s for one request.
    if name == "Qwen2.5-72B":
        assert shape.mha_kv_bytes_per_token("fp16") * 131072 / GIB == 320


def test_llama31_70b_at_fp8() -> None:
    shape = get_preset("Llama-3.1-70B")
    per_token = shape.kv_bytes_per_token("fp8")
    # the article's 160 KiB of values, plus pdserve's float16 scale per head row (80 layers x
    # 8 KV heads x K/V x 2 bytes = 2.5 KiB, what the engine really allocates)
    assert per_token == 163_840 + 2_560 and (per_token - 2_560) / KIB == 160
    assert per_token * 1_000 == pytest.approx(160e6, rel=0.05)  # "about 160 megabytes"
    assert per_token * 10_000 == pytest.approx(1.6e9, rel=0.05)  # "1.6 gigabytes"
    assert per_token * 131072 / GIB == pytest.approx(20, rel=0.02)  # the article's "40 GB" is BF16:
    assert shape.kv_bytes_per_token("bf16") * 131072 / GIB == 40


@pytest.mark.parametrize(("context", "total_gb"), [(6000, 64), (3000, 32), (12000, 128)])
def test_enterprise_rag_budget(context: int, total_gb: int) -> None:
    """64 concurrent requests on Llama 3.1 70B, FP8 KV: ~1 GB each at 6,000 tokens."""
    inputs = SizingInputs(
        gpu_memory_bytes=141 * 10**9,
        kv_dtype="fp8",
        weight_dtype="fp8",
        context_len_tokens=context,
        target_concurrency=64,
    )
    plan = plan_capacity(get_preset("Llama-3.1-70B"), inputs)
    assert plan.kv_bytes_for_target == pytest.approx(total_gb * 1e9, rel=0.03)
    if context == 6000:
        assert plan.kv_bytes_per_request == pytest.approx(1e9, rel=0.03)


def test_seventy_b_style_worked_example() -> None:
    """80 layers, 8 KV heads, head_dim 128, BF16, 8,192 tokens: 2,684,354,560 B = 2.5 GiB."""
    shape = get_preset("Llama-3.1-70B")
    per_request = shape.kv_bytes_per_token("bf16") * 8192
    assert per_request == 2_684_354_560
    assert per_request / GIB == 2.5
    assert 8 * per_request / GIB == 20 and 16 * per_request / GIB == 40


def test_exercise_doubling_concurrency_doubles_kv() -> None:
    """32 layers, 8 KV heads, 128 dims, 4,096 tokens, batch 4, 2 bytes: 2 GiB; batch 8: 4 GiB."""
    shape = get_preset("Llama-3.1-8B")
    per_request = shape.kv_bytes_per_token("bf16") * 4096
    assert 4 * per_request == 2 * GIB
    assert 8 * per_request == 4 * GIB


def test_mla_latent_size_for_deepseek_v3() -> None:
    shape = get_preset("deepseek-v3")
    assert shape.is_mla and shape.num_layers == 61
    assert shape.kv_bytes_per_token("bf16") == 61 * (512 + 64) * 2 == 70_272
    assert shape.kv_bytes_per_token("bf16", tensor_parallel_size=8) == 70_272  # replicated
    mha = ModelShape("mha", 61, 128, 128, 128, 1, 1, 1)
    assert mha.kv_bytes_per_token("bf16") / shape.kv_bytes_per_token("bf16") > 50
