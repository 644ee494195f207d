"""Capacity planning (TP choice, GPUs needed), the P/D split heuristic and ``pdserve size``."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cluster.ops.cli import app
from core.errors import ConfigError, KVCacheError
from sizer.kv_capacity import SizingInputs, plan_capacity
from sizer.model_presets import get_preset
from sizer.sizing import SizingRequest, size_model

H100 = 80 * 10**9
runner = CliRunner()


def _inputs(**kw: object) -> SizingInputs:
    base: dict[str, object] = {"gpu_memory_bytes": H100, "kv_dtype": "bf16", "weight_dtype": "bf16"}
    return SizingInputs(**(base | kw))  # type: ignore[arg-type]


def test_tensor_parallel_is_the_smallest_that_fits() -> None:
    llama70 = get_preset("Llama-3.1-70B")  # 141 GB of bf16 weights
    plan = plan_capacity(llama70, _inputs())
    assert plan.tensor_parallel_size == 2
    assert plan.weight_bytes_per_gpu == pytest.approx(70.55e9, rel=1e-6)
    # Each GPU holds 4 of the 8 KV heads: half the per-token bytes.
    assert plan.kv_bytes_per_token_per_gpu * 2 == plan.kv_bytes_per_token
    assert plan.max_concurrent_requests_per_gpu == plan.max_concurrent_requests / 2
    with pytest.raises(KVCacheError, match="raise --tp"):
        plan_capacity(llama70, _inputs(tensor_parallel_size=1))


def test_tensor_parallel_sizes_the_engine_refuses_are_refused_here_too() -> None:
    """The sizer and the engine share one rule (``core.tensor_parallel``): heads split evenly,
    KV heads and ranks divide one another."""
    qwen = get_preset("Qwen2.5-7B")  # 28 attention heads, 4 KV heads
    with pytest.raises(KVCacheError, match="tensor_parallel_size=8 does not divide the 28"):
        plan_capacity(qwen, _inputs(tensor_parallel_size=8))
    assert plan_capacity(qwen, _inputs(tensor_parallel_size=4)).tensor_parallel_size == 4
    small_gpu = _inputs(gpu_memory_bytes=6 * 10**9, context_len_tokens=1024)
    assert plan_capacity(qwen, small_gpu).tensor_parallel_size == 4
    # auto never picks a size that does not split: too small for TP=4, and 8+ do not split
    with pytest.raises(KVCacheError, match="split over 1, 2, 4 GPUs"):
        plan_capacity(qwen, _inputs(gpu_memory_bytes=3 * 10**9, context_len_tokens=1024))


def test_kv_heads_are_replicated_beyond_their_count() -> None:
    qwen = get_preset("Qwen2.5-7B")  # 4 KV heads
    assert qwen.kv_bytes_per_token("bf16", tensor_parallel_size=8) == 2 * 28 * 1 * 128 * 2


def test_gpus_needed_for_a_target_concurrency() -> None:
    plan = plan_capacity(
        get_preset("Qwen2.5-7B"), _inputs(weight_bytes=int(14.2e9), target_concurrency=1000)
    )
    assert plan.max_concurrent_requests == 126  # 8K context
    assert (plan.replicas_needed, plan.gpus_needed) == (8, 8)


def test_block_rounding_and_model_limit() -> None:
    plan = plan_capacity(get_preset("Mistral-7B"), _inputs(context_len_tokens=1000))
    row = next(r for r in plan.table if r.context_len_tokens == 1000)
    assert row.kv_bytes_per_request == 1008 * 131072  # 63 blocks of 16
    beyond = next(r for r in plan.table if r.context_len_tokens == 131072)
    assert not beyond.within_model_limit  # Mistral-7B stops at 32K


def test_split_gives_long_prompts_more_prefill() -> None:
    def split(context: int, output: int) -> tuple[int, int]:
        result = size_model(
            SizingRequest(
                model="Llama-3.1-8B",
                context_len_tokens=context,
                output_len_tokens=output,
                target_concurrency=256,
            )
        )
        assert result.split.decode_gpus == result.plan.gpus_needed
        return result.split.prefill_gpus, result.split.decode_gpus

    long_prefill, long_decode = split(32768, 256)
    chat_prefill, chat_decode = split(2048, 1024)
    assert long_prefill / long_decode > chat_prefill / chat_decode
    assert chat_prefill >= 1 and long_decode >= 1


def test_sizing_request_validation() -> None:
    with pytest.raises(ConfigError, match="kv_dtype"):
        size_model(SizingRequest(model="Qwen2.5-7B", kv_dtype="fp4"))
    with pytest.raises(ConfigError, match="memory-utilization"):
        size_model(SizingRequest(model="Qwen2.5-7B", memory_utilization=1.5))
    with pytest.raises(ConfigError, match="unknown GPU"):
        size_model(SizingRequest(model="Qwen2.5-7B", gpu="tpu"))
    int4 = size_model(SizingRequest(model="Qwen2.5-7B", weight_dtype="int4"))
    assert (int4.inputs.weight_dtype, int4.inputs.kv_dtype) == ("int4", "bf16")


def test_size_cli_json() -> None:
    args = [
        "size",
        "--model",
        "Qwen2.5-7B",
        "--gpu-memory-gb",
        "80",
        "--weights-gb",
        "14.2",
        "--kv-dtype",
        "fp16",
        "--concurrency",
        "64",
        "--json",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["kv_bytes_per_token"] == 57_344
    assert [row["max_concurrent_requests"] for row in report["capacity_table"]] == [504, 126, 31, 7]
    assert report["gpus_needed"] == 1
    assert report["model"]["num_kv_heads"] == 4
    assert set(report["prefill_decode_split"]) >= {"prefill_gpus", "decode_gpus"}


def test_size_cli_table_and_errors() -> None:
    result = runner.invoke(
        app, ["size", "--model", "DeepSeek-V3", "--gpu", "h200"], env={"COLUMNS": "160"}
    )
    assert result.exit_code == 0, result.output
    assert "MLA, latent 576" in result.output and "Suggested split" in result.output
    bad = runner.invoke(app, ["size", "--model", "gpt-5"], env={"COLUMNS": "300"})
    assert bad.exit_code == 2
    assert "Llama-3.1-70B" in bad.output and "Traceback" not in bad.output
    assert runner.invoke(app, ["size", "--model", "./nowhere"]).exit_code == 2
    assert runner.invoke(app, ["size", "--help"]).exit_code == 0
    assert runner.invoke(app, ["size"]).exit_code == 2  # --model is required


def test_sessions_per_tier_follow_the_tier_bytes() -> None:
    result = size_model(
        SizingRequest(model="Qwen2.5-7B", context_len_tokens=8192, host_gb=256, disk_gb=2000)
    )
    device, host, disk = result.tiers
    assert [t.medium for t in result.tiers] == ["device", "host", "disk"]
    assert device.sessions == result.plan.max_concurrent_requests
    per_session = result.plan.kv_bytes_per_request  # 8192 x 56 KiB = 448 MiB
    assert per_session == 8192 * 57344
    assert host.sessions == 256_000_000_000 // per_session == 544
    assert disk.sessions == 2_000_000_000_000 // per_session
    assert dict(host.sessions_by_context)[2048] == 256_000_000_000 // (2048 * 57344)
    assert size_model(SizingRequest(model="Qwen2.5-7B")).tiers[1:] == ()
    with pytest.raises(ConfigError, match="--host-gb must be > 0"):
        size_model(SizingRequest(model="Qwen2.5-7B", host_gb=0))


def test_size_cli_prints_sessions_per_tier() -> None:
    result = runner.invoke(app, ["size", "--model", "Qwen2.5-7B", "--host-gb", "256"])
    assert result.exit_code == 0, result.output
    assert "host sessions" in result.output
    assert "host 256.00 GB: 544" in result.output
    as_json = runner.invoke(app, ["size", "--model", "Qwen2.5-7B", "--host-gb", "256", "--json"])
    tiers = json.loads(as_json.output)["kv_tiers"]
    assert [(t["medium"], t["sessions"]) for t in tiers][1] == ("host", 544)
