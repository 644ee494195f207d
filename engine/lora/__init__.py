"""Multi-LoRA in one engine: PEFT adapters loaded and checked (:mod:`engine.lora.adapter`),
held in host and device slots (:mod:`engine.lora.manager`), named by requests
(:class:`LoRARequest`)."""

from engine.lora.adapter import LoRAAdapter, ServedBase, base_model_matches, load_adapter
from engine.lora.manager import LoRAManager, Residency
from engine.lora.request import LoRARequest

__all__ = [
    "LoRAAdapter",
    "LoRAManager",
    "LoRARequest",
    "Residency",
    "ServedBase",
    "base_model_matches",
    "load_adapter",
]
