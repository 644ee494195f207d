"""Weight-only int8: per-channel round trip, int8 linears close to full precision, whole models
(dense and MoE) that agree with full precision wherever the choice is not a near tie, fewer
weight bytes, and pre-quantized checkpoints refused with their quantization_config named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from core.errors import ConfigError
from core.sampling import SamplingParams
from engine.builtin import resolve_model
from engine.llm import LLM
from engine.models.int8_weights import quantize_rows
from engine.models.layers import Linear


def test_rows_round_trip_within_half_a_step() -> None:
    weight = torch.randn(3, 16, 64) * torch.linspace(0.01, 10, 16)[:, None]
    q, scales = quantize_rows(weight)
    assert q.dtype is torch.int8 and scales.shape == (3, 16)
    error = (q.float() * scales[..., None] - weight).abs()
    assert (error <= scales[..., None] / 2 + 1e-6).all()


def test_an_int8_linear_stays_close_to_full_precision() -> None:
    torch.manual_seed(0)
    layer = Linear(128, 96, bias=True, dtype=torch.float32, device="cpu")
    layer.weight.data.normal_(0, 0.05)
    layer.bias.data.normal_()  # type: ignore[union-attr]
    x = torch.randn(2, 5, 128)
    full = layer(x)
    layer.quantize_int8()
    assert layer.weight.dtype is torch.int8 and layer.weight_scale is not None
    quantized = layer(x)
    assert quantized.shape == full.shape
    assert (quantized - full).norm() / full.norm() < 0.01


def _param_bytes(llm: LLM) -> int:
    model = llm.engine.runner.model
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("model", ["builtin:tiny-llama", "builtin:tiny-moe"])
def test_int8_models_agree_with_full_precision_outside_near_ties(model: str) -> None:
    full = LLM(model, max_model_len=256, kv_cache_memory_bytes=4 << 20)
    int8 = LLM(model, max_model_len=256, kv_cache_memory_bytes=4 << 20, quantization="int8")
    assert _param_bytes(int8) < 0.6 * _param_bytes(full)
    prompts = [list(range(5 + i, 60 + i)) for i in range(4)]
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=3)
    clear = 0
    for a, b in zip(
        full.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False),
        int8.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False),
        strict=True,
    ):
        ref, got = a.outputs[0].logprobs[0], b.outputs[0].logprobs[0]  # type: ignore[index]
        ranked = sorted(ref.values(), key=lambda p: -p.logprob)
        top = a.outputs[0].token_ids[0]
        assert top in got and abs(got[top].logprob - ref[top].logprob) < 0.1
        if ranked[0].logprob - ranked[1].logprob > 0.1:  # not a near tie: same choice
            clear += 1
            assert b.outputs[0].token_ids[0] == top
    assert clear >= 2


def test_a_pre_quantized_checkpoint_is_refused(tmp_path: Path) -> None:
    source = Path(resolve_model("builtin:tiny-llama"))
    target = tmp_path / "awq-model"
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="quantization_config: 'awq'") as error:
        LLM(str(target), max_model_len=128, kv_cache_memory_bytes=4 << 20)
    assert error.value.param == "quantization_config"
