"""``LoRARequest``: the adapter a request runs under, in vLLM's shape."""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import InvalidRequestError


@dataclass(frozen=True)
class LoRARequest:
    """A PEFT adapter by name: ``lora_name`` is its identity in an engine (and its prefix-cache
    salt), ``lora_int_id`` vLLM's positive integer id, ``lora_path`` the adapter directory
    (``adapter_config.json`` + ``adapter_model.safetensors``)."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not self.lora_name:
            raise InvalidRequestError("lora_name must not be empty", param="lora_request")
        if self.lora_int_id < 1:
            raise InvalidRequestError(
                f"lora_int_id must be >= 1, got {self.lora_int_id}", param="lora_request"
            )
