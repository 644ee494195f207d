"""PEFT adapters made with ``peft`` itself over a transformers model, for the LoRA tests.

``make_adapter`` wraps a deep copy of the HF base in a LoRA ``PeftModel`` with random,
non-zero A and B (``init_lora_weights=False``, then scaled up so the adapter visibly changes
greedy output), saves it in PEFT's format and returns the directory and the ``PeftModel`` (the
reference the engine is compared with).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import PreTrainedModel

ALL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class MadeAdapter:
    """A saved adapter and the PEFT model that holds it."""

    path: Path
    peft_model: PeftModel


def make_adapter(
    base: PreTrainedModel,
    directory: Path,
    *,
    seed: int,
    rank: int = 8,
    alpha: int = 16,
    targets: Sequence[str] = ALL_MODULES,
    use_rslora: bool = False,
    weight_scale: float = 0.2,
) -> MadeAdapter:
    """A LoRA adapter of ``base`` with seeded non-zero weights, saved in ``directory``."""
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(targets),
        lora_dropout=0.0,
        bias="none",
        use_rslora=use_rslora,
        init_lora_weights=False,
    )
    model = get_peft_model(copy.deepcopy(base), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * weight_scale)
    model.eval()
    model.save_pretrained(str(directory))
    return MadeAdapter(directory, model)
