"""Which elementwise kernels a model takes: torch on CPU by default, Triton when asked or on CUDA,
and RoPE fused into the KV write only with a backend that can do it."""

from __future__ import annotations

import pytest
import torch

from engine.attention import TorchAttentionBackend
from engine.attention.backend import RopeFusingBackend
from engine.models import CausalLM, ModelArchConfig
from engine.models.kernels import TORCH_KERNELS, TorchKernels, default_fused, model_kernels
from tests.unit.engine.models.hf_checkpoints import MODEL_CLASSES, PRESETS


def tiny_config() -> ModelArchConfig:
    hf_config = PRESETS["llama"]()
    raw = {**hf_config.to_dict(), "architectures": [MODEL_CLASSES[type(hf_config)].__name__]}
    return ModelArchConfig.from_hf_dict(raw)


def test_fused_by_default_only_on_cuda() -> None:
    assert default_fused("cuda") and default_fused(torch.device("cuda", 1))
    assert not default_fused("cpu")


def test_cpu_model_takes_the_torch_kernels() -> None:
    model = CausalLM(tiny_config(), TorchAttentionBackend())
    assert model.kernels is TORCH_KERNELS
    assert model.norm.kernels is TORCH_KERNELS
    assert not model.layers[0].self_attn.fuse_rope


def test_forced_fused_model_keeps_rope_with_a_backend_that_cannot_fuse_it() -> None:
    pytest.importorskip("triton")
    model = CausalLM(tiny_config(), TorchAttentionBackend(), fused_kernels=True)
    assert model.kernels.fused and not isinstance(model.kernels, TorchKernels)
    assert not isinstance(TorchAttentionBackend(), RopeFusingBackend)
    assert not model.layers[0].self_attn.fuse_rope


def test_model_kernels_picks_by_flag() -> None:
    assert model_kernels(False) is TORCH_KERNELS
    pytest.importorskip("triton")
    assert model_kernels(True).fused
