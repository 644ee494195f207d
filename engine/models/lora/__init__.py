"""LoRA adapters inside the model: device slots per linear, the step's row -> slot mapping,
and the delta (torch ops on CPU, Triton shrink/expand kernels on CUDA)."""

from engine.models.lora.batch import BASE_SLOT, LoRABatch, LoRAStepState, build_lora_batch
from engine.models.lora.slots import LoRASlots
from engine.models.lora.targets import (
    SUPPORTED_MODULES,
    LoRATarget,
    attach_lora_slots,
    lora_targets,
)

__all__ = [
    "BASE_SLOT",
    "SUPPORTED_MODULES",
    "LoRABatch",
    "LoRASlots",
    "LoRAStepState",
    "LoRATarget",
    "attach_lora_slots",
    "build_lora_batch",
    "lora_targets",
]
